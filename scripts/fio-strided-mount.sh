#!/usr/bin/env bash
# The shared-file strided pattern with fio, through a real `sluice mount`
# of a started server, once per policy: N jobs, one file, 4 KiB pieces,
# job k takes every Nth piece (fio's strided zones).
#   scripts/fio-strided-mount.sh [POLICIES] [read|write] [DEVICE] [JOBS] [MIB]
# Defaults: fifo,aioli read hdd7200 32 16. The server runs --direct; the
# page cache is dropped before each policy. Prints MiB/s per policy.
set -euo pipefail
policies=${1:-fifo,aioli}; rw=${2:-read}; device=${3:-hdd7200}; jobs=${4:-32}; mib=${5:-16}
sluice=${SLUICE:-$(dirname "$0")/../target/release/sluice}
dir=$(mktemp -d /var/tmp/sluice-fio-XXXXXX)
server=; mount=
cleanup() {
  [ -n "$mount" ] && kill "$mount" 2>/dev/null && wait "$mount" 2>/dev/null || true
  mountpoint -q "$dir/mnt" && fusermount3 -u -z "$dir/mnt" || true
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
mkdir -p "$dir/root" "$dir/mnt"
dd if=/dev/urandom of="$dir/root/f.dat" bs=1M count="$mib" status=none
per_job=$((mib * 1024 / jobs))k
skip=$(((jobs - 1) * 4))k
for p in ${policies//,/ }; do
  "$sluice" serve --root "$dir/root" --listen "unix:$dir/s.sock" --policy "$p" --direct --device "$device" --metrics 127.0.0.1:0 >"$dir/serve.out" 2>&1 & server=$!
  for _ in $(seq 100); do [ -S "$dir/s.sock" ] && break; sleep 0.05; done
  "$sluice" mount --server "unix:$dir/s.sock" "$dir/mnt" 2>/dev/null & mount=$!
  for _ in $(seq 200); do mountpoint -q "$dir/mnt" && break; sleep 0.05; done
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  bw=$(fio --name=s --filename="$dir/mnt/f.dat" --rw="$rw" --bs=4k --numjobs="$jobs" --offset_increment=4k \
        --zonemode=strided --zonesize=4k --zoneskip="$skip" --size="${mib}m" --io_size="$per_job" \
        --ioengine=psync ${FIO_EXTRA:-} --group_reporting --output-format=terse --terse-version=3 | awk -F';' -v rw="$rw" '{print (rw=="read") ? $7 : $48}')
  printf '%-8s %-5s %s jobs: %.2f MiB/s\n' "$p" "$rw" "$jobs" "$(echo "$bw / 1024" | bc -l)"
  url=$(grep -o 'http://[^ ]*/metrics' "$dir/serve.out" | head -1)
  if [ -n "$url" ]; then
    curl -s "$url" | awk '/^sluice_app_requests_total/ {r+=$2} /^sluice_app_dispatches_total/ {d+=$2} END {if (d) printf "  %d requests in %d dispatches: %.1f a dispatch\n", r, d, r/d}'
  fi
  kill "$mount"; wait "$mount" 2>/dev/null || true; mount=
  kill "$server"; wait "$server" 2>/dev/null || true; server=
  rm -f "$dir/s.sock"
done
