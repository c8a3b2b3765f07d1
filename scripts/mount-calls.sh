#!/usr/bin/env bash
# What a metadata call costs through a real `sluice mount` of a started
# server: N `open`+`close` pairs of one file, then N lookups of names that
# do not exist (each a round trip to the server). Prints microseconds a
# call for both. Compare two builds by alternating runs:
#   for i in 1 2 3; do SLUICE=old scripts/mount-calls.sh; SLUICE=new scripts/mount-calls.sh; done
#   scripts/mount-calls.sh [N]      (default 3000)
set -euo pipefail
n=${1:-3000}
sluice=${SLUICE:-$(dirname "$0")/../target/release/sluice}
dir=$(mktemp -d /var/tmp/sluice-calls-XXXXXX)
server=; mount=
cleanup() {
  mountpoint -q "$dir/mnt" && fusermount3 -u -z "$dir/mnt" || true
  [ -n "$mount" ] && kill "$mount" 2>/dev/null && wait "$mount" 2>/dev/null || true
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
mkdir -p "$dir/root" "$dir/mnt"
"$sluice" serve --root "$dir/root" --listen "unix:$dir/s.sock" >/dev/null 2>&1 & server=$!
for _ in $(seq 100); do [ -S "$dir/s.sock" ] && break; sleep 0.05; done
sleep 0.2
"$sluice" mount --server "unix:$dir/s.sock" "$dir/mnt" >/dev/null 2>&1 & mount=$!
for _ in $(seq 100); do mountpoint -q "$dir/mnt" && break; sleep 0.05; done
mountpoint -q "$dir/mnt" || { echo "mount-calls: the mount did not come up" >&2; exit 1; }
echo hi > "$dir/mnt/f"
python3 - "$dir/mnt" "$n" <<'PY'
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
f = os.path.join(d, "f")
t = time.perf_counter()
for _ in range(n):
    os.close(os.open(f, os.O_RDONLY))
opened = (time.perf_counter() - t) / n * 1e6
t = time.perf_counter()
for i in range(n):
    try:
        os.stat(os.path.join(d, "absent-%d" % i))
    except FileNotFoundError:
        pass
looked = (time.perf_counter() - t) / n * 1e6
print("open+close %.1f us, lookup of an absent name %.1f us" % (opened, looked))
PY
