#!/usr/bin/env bash
# A multi-application experiment through the FUSE mount: a 32-job
# strided 4 KiB reader (application "strided") and a sequential 32 KiB
# reader (application "cat") started together, once per policy, on a server
# with the emulated 7200 rpm disk. Prints each application's runtime.
# Usage: scripts/fio-two-apps.sh [POLICY…]   (default: fifo aioli)
set -euo pipefail
sluice=$(cd "$(dirname "$0")/.." && pwd)/target/release/sluice
dir=$(mktemp -d /var/tmp/sluice-fio2-XXXX)
cleanup() { fusermount3 -u "$dir/mnt" 2>/dev/null || true; kill "${srv:-}" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
mkdir -p "$dir/root" "$dir/mnt"
head -c $((32 << 20)) /dev/urandom > "$dir/root/shared.dat"   # strided: 32 jobs x 256 x 4 KiB, stride 128 KiB
head -c $((16 << 20)) /dev/urandom > "$dir/root/seq.dat"      # cat: 16 MiB in 32 KiB reads (seed Case 1)
job() { sed -n 's/.*"job_runtime" : \([0-9]*\).*/\1/p' "$1" | sort -n | tail -1; }
for policy in "${@:-fifo aioli}"; do
  for p in $policy; do
    "$sluice" serve --root "$dir/root" --listen "unix:$dir/s.sock" --policy "$p" --device hdd7200 --queue-depth 1 > "$dir/serve.log" 2>&1 &
    srv=$!
    while [ ! -S "$dir/s.sock" ]; do sleep 0.05; done
    "$sluice" mount --server "unix:$dir/s.sock" "$dir/mnt" &
    while ! grep -q " $dir/mnt " /proc/mounts; do sleep 0.05; done
    SLUICE_APP=strided fio --name=strided --filename="$dir/mnt/shared.dat" --rw=read:124k --bs=4k --numjobs=32 \
      --offset_increment=4k --io_size=1m --ioengine=psync --output-format=json --output="$dir/strided.json" &
    a=$!
    SLUICE_APP=cat fio --name=cat --filename="$dir/mnt/seq.dat" --rw=read --bs=32k --ioengine=psync --startdelay=1 \
      --output-format=json --output="$dir/cat.json" &
    b=$!
    wait $a $b
    printf '%-6s strided (32 x 1 MiB, 4 KiB) %6.2f s   cat (16 MiB, 32 KiB, starts 1 s later) %6.2f s\n' "$p" \
      "$(echo "$(job "$dir/strided.json") / 1000" | bc -l)" "$(echo "$(job "$dir/cat.json") / 1000" | bc -l)"
    fusermount3 -u "$dir/mnt"
    kill "$srv"; wait "$srv" 2>/dev/null || true
    rm -f "$dir/s.sock"
  done
done
