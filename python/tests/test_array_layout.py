"""sluice.array.local_shape on large layouts that write takes, and against
the plan write makes on small ones. Before, it planned the whole array as
one chunk and failed past 4 Mi pieces or 1 TiB; now it asks the
distribution alone (ArrayPlan.local_shape_of). (No server; any number of
ranks.)"""

import itertools
import math

import pytest

sa = pytest.importorskip("sluice.array")
from sluice._sluice import ArrayPlan  # noqa: E402


@pytest.mark.parametrize("shape, grid, dist, chunks, rank, want", [
    # 64 Mi float64 (512 MiB), BLOCK x BLOCK: 16 Mi rows of the one-chunk plan.
    ((1 << 23, 8), (2, 2), ["block", "block"], (4096, 4), 3, (1 << 22, 4)),
    # 2 Ti elements: one chunk of them is over 1 TiB.
    ((1 << 21, 1 << 20), (4, 1), ["block", "*"], (1024, 1 << 20), 3, (1 << 19, 1 << 20)),
])
def test_local_shape_of_a_large_layout_that_write_takes(shape, grid, dist, chunks, rank, want):
    plan = ArrayPlan(list(shape), "float64", list(chunks), list(grid), dist)  # what write plans
    assert tuple(plan.local_shape(rank)) == want
    assert sa.local_shape(shape, grid, dist, rank) == want


def test_local_shape_agrees_with_the_distribution():
    dims = {
        "block": lambda n, p: "block",
        "cyclic": lambda n, p: "cyclic",
        "cyclic(3)": lambda n, p: "cyclic(3)",
        "gen_block": lambda n, p: "gen_block(" + ":".join(str(n // p + (c == 0) * (n % p)) for c in range(p)) + ")",
    }
    for (n0, p0, d0), (n1, p1, d1) in itertools.product(itertools.product((1, 7, 13), (1, 2, 5), dims), repeat=2):
        shape, grid = (n0, n1), (p0, p1)
        dist = [dims[d0](n0, p0), dims[d1](n1, p1)]
        plan = ArrayPlan(list(shape), "uint8", list(shape), list(grid), dist)
        for r in range(math.prod(grid)):
            assert sa.local_shape(shape, grid, dist, r) == tuple(plan.local_shape(r)), (shape, grid, dist, r)
    assert sa.local_shape((9, 4), (1, 1), ["block", "*"], 0) == (9, 4)


@pytest.mark.parametrize("grid, dist, match", [
    ((2,), ["*"], r"\* \(not distributed\)"),
    ((2,), ["gen_block(3:4)"], "GEN_BLOCK"),
    ((2,), ["cyclic(0)"], "not a distribution"),
    ((2, 1), ["block"], "shape has 2 dimensions but the grid has 2 and the distribution 1"),
])
def test_local_shape_refuses_what_the_distribution_refuses(grid, dist, match):
    with pytest.raises(ValueError, match=match):
        sa.local_shape((8,) * len(grid), grid, dist, 0)
