#!/usr/bin/env bash
# A migration at background priority: a foreground reader's time
# with a `sluice array migrate` running beside it, in the background class
# (weight 0) and at the default weight (1), against the reader alone, on a
# server with the emulated 7200 rpm disk (one dispatch at a time, where
# the two compete for the arm). Prints seconds per run.
# Usage: scripts/migrate-background.sh [ROUNDS]   (default: 3)
set -euo pipefail
rounds=${1:-3}
sluice=$(cd "$(dirname "$0")/.." && pwd)/target/release/sluice
dir=$(mktemp -d /var/tmp/sluice-migrate-XXXX)
cleanup() { kill "${srv:-}" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
mkdir -p "$dir/root"
head -c $((32 << 20)) /dev/urandom > "$dir/root/fg.dat"
"$sluice" serve --root "$dir/root" --listen "unix:$dir/s.sock" --device hdd7200 --queue-depth 1 > "$dir/serve.log" 2>&1 &
srv=$!
while [ ! -S "$dir/s.sock" ]; do sleep 0.05; done
export SLUICE_SERVER="unix:$dir/s.sock" SLUICE_LEASES=0
secs() { local t0; t0=$(date +%s.%N); "$@" > /dev/null; echo "$(date +%s.%N) - $t0" | bc; }
step=0
for r in $(seq "$rounds"); do
  for weight in none 0 1; do
    step=$((step + 1))
    ts=":run/t$step"
    "$sluice" array write "$ts/temp" --shape 512,1024,8 --chunks 64,1024,8 --ranks 4 > /dev/null
    if [ "$weight" = none ]; then
      fg=$(SLUICE_APP=reader secs "$sluice" cp :fg.dat /dev/null)
      echo "round $r: reader alone                 ${fg} s"
      continue
    fi
    t0=$(date +%s.%N)
    "$sluice" array migrate "$ts" --to ":slow/t$step" --weight "$weight" > "$dir/mig.out" &
    mig=$!
    sleep 0.2
    fg=$(SLUICE_APP=reader secs "$sluice" cp :fg.dat /dev/null)
    wait "$mig"
    echo "round $r: reader beside migrate --weight $weight ${fg} s (migration $(echo "$(date +%s.%N) - $t0" | bc) s)"
  done
done
