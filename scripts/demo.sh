#!/usr/bin/env bash
# `make demo`: the main job on an embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out
echo "== sluice demo: scheduling-core cost (the multi-application bench lands with issue 4)"
./target/release/sluice bench scheduler --json out/bench-scheduler.json
