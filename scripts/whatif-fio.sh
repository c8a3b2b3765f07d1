#!/usr/bin/env bash
# How well `sluice what-if` predicts: 32 fio processes read one 8 MiB file
# in 4 KiB strided pieces through `sluice run`, on `sluice serve --device
# hdd7200 --direct --trace`, RUNS times per policy (alternating). Then every
# trace is replayed under every policy with what-if's default options (plus
# any WHATIF_ARGS), and each prediction is compared with the median of the
# real runs of the policy it predicts. The figure is the readers' time: the
# longest span of a reader (first request to last answer), since fio's own
# start-up (laying out the file, forking) is not the scheduler's.
#   scripts/whatif-fio.sh [POLICIES] [RUNS]      (defaults: fifo,aioli 3)
# Run `sluice calibrate --host` once first for the host's queueing. With
# KEEP=DIR the traces and what-if reports are copied there.
set -euo pipefail
policies=${1:-fifo,aioli}; runs=${2:-3}
sluice=${SLUICE:-$(cd "$(dirname "$0")/.." && pwd)/target/release/sluice}
dir=$(mktemp -d /var/tmp/sluice-whatif-XXXXXX)
server=
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
record() { # POLICY TRACE
  rm -rf "$dir/root" "$dir/s.sock"; mkdir -p "$dir/root"
  dd if=/dev/urandom of="$dir/root/f.dat" bs=1M count=8 status=none
  "$sluice" serve --root "$dir/root" --listen "unix:$dir/s.sock" --policy "$1" --direct --device hdd7200 --trace "$2" >"$dir/serve.out" 2>&1 & server=$!
  for _ in $(seq 100); do [ -S "$dir/s.sock" ] && break; sleep 0.05; done
  "$sluice" run --server "unix:$dir/s.sock" --prefix /sluice -- fio --name=s --filename=/sluice/f.dat --rw=read --bs=4k \
    --numjobs=32 --offset_increment=4k --zonemode=strided --zonesize=4k --zoneskip=124k --size=8m --io_size=256k \
    --ioengine=psync --group_reporting --output-format=terse --terse-version=3 >"$dir/fio.out"
  kill -INT "$server"; wait "$server" 2>/dev/null || true; server=
  echo "recorded $1 run: fio $(awk -F';' '{print $9}' "$dir/fio.out") ms"
}
for i in $(seq "$runs"); do for p in ${policies//,/ }; do record "$p" "$dir/t-$p-$i.json"; done; done
for t in "$dir"/t-*.json; do
  # shellcheck disable=SC2086
  "$sluice" what-if "$t" $(printf -- '--policy %s ' ${policies//,/ }) --json "${t%.json}.w" ${WHATIF_ARGS:-} >/dev/null
done
[ -n "${KEEP:-}" ] && mkdir -p "$KEEP" && cp "$dir"/t-*.json "$dir"/t-*.w "$KEEP"/
python3 - "$dir" "$policies" "$(dirname "$0")" <<'EOF'
import glob, json, os, sys
d, policies = sys.argv[1], sys.argv[2].split(',')
def readers(rows, policy):
    rs = [r for r in rows if r['policy'] == policy and r['requests'] == 64]
    return max(r['span_s'] for r in rs)
real, pred, device = {}, {}, ''
for w in sorted(glob.glob(os.path.join(d, 't-*.w'))):
    src = os.path.basename(w)[len('t-'):-len('.w')].rsplit('-', 1)[0]
    doc = json.load(open(w)); device = doc['device']
    real.setdefault(src, []).append(readers(doc['rows'], 'recorded'))
    for q in policies:
        pred.setdefault((src, q), []).append(readers(doc['rows'], q))
sys.path.insert(0, sys.argv[3])
from whatif_summary import report  # noqa: E402
report(device, policies, real, pred, 'readers ')
EOF
