"""The Rust and the Python collectives send the same list messages for the
same plan. Both send ``sluice_array::rank_messages`` of their plan; this
checks that the two build the same plan from the same description and
get the same messages from it: ``sluice array write --messages`` (the
messages of the plan the Rust collective then writes with) against
``ArrayPlan.messages`` (what ``sluice.array`` sends), rank by rank, in
order, groups included, for several shapes, distributions, shards and
strategies."""

import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from sluice._sluice import ArrayPlan, group_base

REPO = Path(__file__).resolve().parents[2]
BIN = os.environ.get("SLUICE_BIN", str(REPO / "target" / "release" / "sluice"))

CASES = [
    # shape, dtype, chunks, shards, grid, dist, strategy
    ((12, 10), "float32", (4, 5), None, (3, 1), ("cyclic(2)", "*"), "server-directed"),
    ((16, 8, 6), "float64", (4, 8, 3), (8, 8, 6), (2, 2, 1), ("block", "cyclic", "*"), "server-directed"),
    ((9, 7), "int16", (3, 7), None, (4, 1), ("cyclic", "*"), "independent"),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_rust_and_python_send_the_same_messages_for_the_same_plan(server, comm, case):
    shape, dtype, chunks, shards, grid, dist, strategy = CASES[case]
    addr, _ = server
    if comm.Get_rank() != 0:
        return
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "m.json"
        cmd = [BIN, "array", "write", f":msg/case{case}", "--server", addr, "--shape", ",".join(map(str, shape)), "--dtype", dtype,
               "--chunks", ",".join(map(str, chunks)), "--grid", ",".join(map(str, grid)), "--dist", ",".join(dist),
               "--strategy", strategy, "--messages", str(out)]
        if shards:
            cmd += ["--shards", ",".join(map(str, shards))]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        rust = json.loads(out.read_text())["ranks"]
    plan = ArrayPlan(list(shape), dtype, list(chunks), list(grid), list(dist), list(shards) if shards else None)
    assert len(rust) == plan.ranks
    base = 0 if strategy == "server-directed" else None
    for rank, theirs in enumerate(rust):
        ours = plan.messages(rank, base)
        assert ours, f"rank {rank} sends something"
        theirs = [(m["file"], m["j"], [tuple(x) for x in m["ranges"]], tuple(m["group"]) if m["group"] else None) for m in theirs]
        assert ours == theirs, f"rank {rank}"
    if strategy == "server-directed":
        assert all(m[3] is not None for r in range(plan.ranks) for m in plan.messages(r, base)), "every message has its group"


def test_group_bases_are_fresh_and_fit_63_bits():
    a, b = group_base(), group_base()
    assert a != b and a < (1 << 63) and b < (1 << 63)


def test_a_plan_refuses_a_rank_outside_it():
    plan = ArrayPlan([4, 4], "float64", [2, 2], [2, 1], ["block", "*"], None)
    assert len(plan.messages(1)) > 0
    with pytest.raises(ValueError):
        plan.messages(2)
