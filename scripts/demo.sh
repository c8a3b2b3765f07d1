#!/usr/bin/env bash
# `make demo`: the main job on an embedded default. A scratch directory on
# the ext4 root (O_DIRECT works there), servers started in-process by the
# bench, the seed's experiments, and tables of direct POSIX vs fifo vs aioli.
set -euo pipefail
cd "$(dirname "$0")/.."
out=out/demo
mkdir -p "$out"
sluice=./target/release/sluice

echo "== 1/2  decomposition: 32 processes read a 128 MiB file in 4 KiB pieces, O_DIRECT, real disk"
"$sluice" bench decomposition --procs 32 --granularity 4K --direct --scale 0.03125 \
  --policies direct,fifo,aioli --json "$out/decomposition.json"
echo
echo "== 2/2  mix10: the seed's ten applications at 1/64 size, on the emulated 7200 rpm disk"
"$sluice" bench mix10 --device hdd7200 --scale 0.015625 --policies fifo,aioli --json "$out/mix10.json"
echo
echo "JSON reports: $out/decomposition.json $out/mix10.json (shape: docs/bench.md)"
