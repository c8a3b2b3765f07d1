#!/usr/bin/env bash
# How well `sluice what-if` predicts the seed's workloads: runs `sluice bench
# WORKLOAD ARGS... --policies fifo,aioli --runs 1` RUNS times with the
# server's live trace kept (SLUICE_BENCH_TRACE), then replays every trace
# under both policies with what-if's default options and compares each
# prediction's makespan with the median of the real runs of the policy it
# predicts. Run `sluice calibrate --host` once first.
#   scripts/whatif-bench.sh RUNS WORKLOAD [BENCH ARGS...]
# e.g. scripts/whatif-bench.sh 3 mix10 --device hdd7200 --scale 0.015625
#      scripts/whatif-bench.sh 3 decomposition --device hdd7200 --procs 32 --granularity 4K --scale 0.00390625
# With KEEP=DIR the traces are copied there.
set -euo pipefail
runs=$1; shift
sluice=${SLUICE:-$(cd "$(dirname "$0")/.." && pwd)/target/release/sluice}
dir=$(mktemp -d /var/tmp/sluice-whatif-bench-XXXXXX)
trap 'rm -rf "$dir"' EXIT
for i in $(seq "$runs"); do
  mkdir -p "$dir/r$i"
  SLUICE_BENCH_TRACE="$dir/r$i" "$sluice" bench "$@" --policies fifo,aioli --runs 1 >"$dir/r$i/bench.out" 2>&1
  grep -E '^makespan' "$dir/r$i/bench.out" | sed "s/^/run $i: /"
  for p in fifo aioli; do
    "$sluice" what-if "$dir/r$i/$p.json" --policy fifo --policy aioli --json "$dir/r$i/$p.w" >/dev/null
  done
done
[ -n "${KEEP:-}" ] && mkdir -p "$KEEP" && cp -r "$dir"/r* "$KEEP"/
python3 - "$dir" "$runs" "$(dirname "$0")" <<'EOF'
import json, os, sys
d, runs = sys.argv[1], int(sys.argv[2])
real, pred, device = {}, {}, ''
for i in range(1, runs + 1):
    for src in ('fifo', 'aioli'):
        doc = json.load(open(os.path.join(d, f'r{i}', f'{src}.w')))
        device = doc['device']
        spans = dict(doc['makespan_s'])
        real.setdefault(src, []).append(spans['recorded'])
        for q in ('fifo', 'aioli'):
            pred.setdefault((src, q), []).append(spans[q])
sys.path.insert(0, sys.argv[3])
from whatif_summary import report  # noqa: E402
report(device, ('fifo', 'aioli'), real, pred)
EOF
