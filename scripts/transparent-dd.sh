#!/usr/bin/env bash
# The transparent paths' figures: `dd bs=1M` over a file in the page
# cache, on the backing file, through `sluice run` (LD_PRELOAD) and through
# `sluice mount` (FUSE), in turn, ROUNDS times; with and without cache
# leases (SLUICE_LEASES=0 turns them off in the client), the mounts with
# `--no-passthrough`; then the default mount (passthrough). Prints GB/s as
# dd reports it, one line per pass.
# Usage: scripts/transparent-dd.sh [ROUNDS] [SIZE_MIB]   (default: 3 256)
set -euo pipefail
rounds=${1:-3}
size=${2:-256}
sluice=$(cd "$(dirname "$0")/.." && pwd)/target/release/sluice
dir=$(mktemp -d /var/tmp/sluice-dd-XXXX)
cleanup() { fusermount3 -u "$dir/mnt" 2>/dev/null || umount "$dir/mnt" 2>/dev/null || true; kill "${srv:-}" "${mnt:-}" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
mkdir -p "$dir/root" "$dir/mnt"
head -c $((size << 20)) /dev/urandom > "$dir/root/big.dat"
"$sluice" serve --root "$dir/root" --listen "unix:$dir/s.sock" > "$dir/serve.log" 2>&1 &
srv=$!
while [ ! -S "$dir/s.sock" ]; do sleep 0.05; done
rate() { LC_ALL=C dd "$@" of=/dev/null bs=1M 2>&1 | sed -n 's/.*, \([0-9.]* [GMk]B\/s\)$/\1/p'; }
mountit() {
  SLUICE_LEASES=$1 "$sluice" mount --server "unix:$dir/s.sock" ${2:-} "$dir/mnt" > "$dir/mount.log" 2>&1 &
  mnt=$!
  while ! grep -q " $dir/mnt " /proc/mounts; do sleep 0.05; done
}
unmount() { fusermount3 -u "$dir/mnt" 2>/dev/null || umount "$dir/mnt"; wait "$mnt" 2>/dev/null || true; mnt=; }
cat "$dir/root/big.dat" > /dev/null
for r in $(seq "$rounds"); do
  echo "round $r: direct           $(rate if="$dir/root/big.dat")"
  for leases in 1 0; do
    echo "round $r: run   leases=$leases $(SLUICE_LEASES=$leases "$sluice" run --server "unix:$dir/s.sock" --prefix /sl -- \
      dd if=/sl/big.dat of=/dev/null bs=1M 2>&1 | sed -n 's/.*, \([0-9.]* [GMk]B\/s\)$/\1/p')"
    mountit $leases --no-passthrough
    echo "round $r: mount leases=$leases --no-passthrough $(rate if="$dir/mnt/big.dat")"
    unmount
  done
  mountit 1
  echo "round $r: mount (default)  $(rate if="$dir/mnt/big.dat")"
  unmount
done
