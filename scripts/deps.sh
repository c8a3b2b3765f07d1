#!/usr/bin/env bash
# Install the system packages the test suite needs, when they are missing.
# Run as root it uses apt-get; otherwise it prints what to install.
set -euo pipefail
need=()
# Each entry: "command-that-must-exist:debian-package".
deps="fusermount3:fuse3 tmux:tmux curl:curl man:man-db chromium:chromium /usr/lib/python3.11/ensurepip/__init__.py:python3-venv fio:fio mpirun:openmpi-bin etcd:etcd-server etcdctl:etcd-client /usr/lib/python3/dist-packages/mpi4py/__init__.py:python3-mpi4py"
for pair in $deps; do
  cmd=${pair%%:*}; pkg=${pair##*:}
  # A dependency is a command on PATH, or (starting with /) a file.
  case "$cmd" in
    /*) [ -e "$cmd" ] || need+=("$pkg") ;;
    *) command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg") ;;
  esac
done
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "deps: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
else
  echo "deps: please install: ${need[*]}" >&2
  exit 1
fi
