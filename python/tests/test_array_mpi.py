"""sluice.array: MPI ranks write a distributed array as Zarr v3
through sluice, server-directed, independent or two-phase; zarr-python reads it
without sluice; the ranks read it back under another distribution; and a
rank that never comes leaves its group's file untouched while the others
get ETIMEDOUT."""

import errno
import os

import numpy as np
import pytest
from mpi4py import MPI

zarr = pytest.importorskip("zarr")
sa = pytest.importorskip("sluice.array")

import sluice  # noqa: E402

SHAPE = (40, 36, 12)


def owned(n, p, c, dist):
    """The indices coordinate c of p owns in a dimension of n (HPF)."""
    if dist == "*":
        return np.arange(n)
    if dist == "block":
        b = -(-n // p)
        return np.arange(c * b, min((c + 1) * b, n))
    k = int(dist[len("cyclic("):-1]) if dist.startswith("cyclic(") else 1
    g = np.arange(n)
    return g[(g // k) % p == c]


def block_of(a, grid, dist, rank):
    coords = np.unravel_index(rank, grid)
    return a[np.ix_(*[owned(n, p, c, d) for n, p, c, d in zip(a.shape, grid, coords, dist)])]


@pytest.fixture
def client(server, comm):
    return sluice.Client(server[0], app="array-test", client_id=comm.Get_rank())


@pytest.mark.parametrize("strategy", ["server-directed", "independent", "two-phase"])
def test_ranks_write_zarr_read_by_zarr_python_and_back_under_another_distribution(server, comm, client, strategy):
    if comm.Get_size() != 4:
        pytest.skip("written for 4 ranks")
    addr, root = server
    rank = comm.Get_rank()
    whole = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE) * 0.5
    grid, dist = (2, 2, 1), ["block", "block", "*"]
    local = block_of(whole, grid, dist, rank)
    assert local.shape == sa.local_shape(SHAPE, grid, dist, rank)
    path = f"mpi/{strategy}/temp"
    moved = sa.write(comm, client, path, local, shape=SHAPE, chunks=(10, 12, 12), shards=(20, 36, 12),
                     grid=grid, dist=dist, dims=["z", "y", "x"], attrs={"units": "K"}, strategy=strategy)
    assert moved == local.nbytes
    comm.Barrier()
    z = zarr.open_array(f"{root}/{path}", mode="r")
    assert z.attrs["units"] == "K" and z.shards == (20, 36, 12)
    np.testing.assert_array_equal(z[...], whole)
    grid2, dist2 = (4, 1, 1), ["cyclic(3)", "*", "*"]
    back = sa.read(comm, client, path, grid=grid2, dist=dist2, strategy=strategy)
    np.testing.assert_array_equal(back, block_of(whole, grid2, dist2, rank))


def test_a_big_endian_block_is_stored_little_endian_as_the_metadata_says(server, comm, client):
    # Before: the bytes were stored as they were, under "endian": "little",
    # and sluice and zarr-python read 3e-319 and the like.
    n = comm.Get_size()
    rank = comm.Get_rank()
    addr, root = server
    whole = np.arange(4 * n, dtype=">f8")
    local = whole[rank * 4:(rank + 1) * 4]
    sa.write(comm, client, "mpi/big-endian", local, shape=(4 * n,), chunks=(4,), grid=(n,), dist=["block"])
    comm.Barrier()
    np.testing.assert_array_equal(zarr.open_array(f"{root}/mpi/big-endian", mode="r")[...], np.arange(4 * n, dtype="<f8"))
    back = sa.read(comm, client, "mpi/big-endian", grid=(n,), dist=["block"])
    np.testing.assert_array_equal(back, np.arange(rank * 4, rank * 4 + 4, dtype=np.float64))
    group = sa.ArrayGroup("mpi/be-group", [sa.Array("x", (4 * n,), dtype=">i4")], comm, client)
    group.timestep(0, {"x": np.arange(rank * 4, rank * 4 + 4, dtype=">i4")})
    comm.Barrier()
    np.testing.assert_array_equal(zarr.open_array(f"{root}/mpi/be-group/x", mode="r")[0], np.arange(4 * n, dtype="<i4"))


def test_a_block_of_the_wrong_shape_on_one_rank_fails_every_rank(server, comm, client):
    # Before: that rank raised alone and the others waited for ever.
    n = comm.Get_size()
    rank = comm.Get_rank()
    local = np.zeros(3 if rank == n - 1 else 4)
    with pytest.raises(ValueError, match="block has shape"):
        sa.write(comm, client, "mpi/bad-shape", local, shape=(4 * n,), chunks=(4,), grid=(n,), dist=["block"])


def test_two_phase_exchange_bound_at_n_and_n_plus_one(server, comm, client, monkeypatch):
    """A rank's two-phase exchange may move EXCHANGE_BYTES_MAX bytes each
    way (MPI counts are C ints); one more fails on every rank, before any
    exchange, and nothing is left half written."""
    if comm.Get_size() != 4:
        pytest.skip("written for 4 ranks")
    addr, root = server
    rank = comm.Get_rank()
    grid, dist = (2, 2, 1), ["block", "block", "*"]
    plan = sa.ArrayPlan(list(SHAPE), "float64", [20, 12, 12], list(grid), dist)
    to, frm = plan.two_phase_counts(rank)
    n = comm.allreduce(max(sum(to), sum(frm)), op=MPI.MAX)
    assert n > 0
    local = np.full(sa.local_shape(SHAPE, grid, dist, rank), float(rank))
    monkeypatch.setattr(sa, "EXCHANGE_BYTES_MAX", n)
    sa.write(comm, client, "mpi/bound-n", local, shape=SHAPE, chunks=(20, 12, 12), grid=grid, dist=dist, strategy="two-phase")
    back = sa.read(comm, client, "mpi/bound-n", grid=grid, dist=dist, strategy="two-phase")
    np.testing.assert_array_equal(back, local)
    monkeypatch.setattr(sa, "EXCHANGE_BYTES_MAX", n - 1)
    with pytest.raises(Exception, match="exchange"):
        sa.write(comm, client, "mpi/bound-n1", local, shape=SHAPE, chunks=(20, 12, 12), grid=grid, dist=dist, strategy="two-phase")
    comm.Barrier()
    if rank == 0:
        assert [f for f in os.listdir(f"{root}/mpi/bound-n1") if f != "zarr.json"] in ([], ["c"])
        assert not any(files for _, _, files in os.walk(f"{root}/mpi/bound-n1/c")), "no chunk file written"


def test_a_rank_that_never_comes_leaves_its_groups_file_untouched(server, comm, client):
    if comm.Get_size() != 4:
        pytest.skip("written for 4 ranks")
    addr, root = server
    rank = comm.Get_rank()
    grid, dist = (2, 2, 1), ["block", "block", "*"]
    zeros = np.zeros(sa.local_shape(SHAPE, grid, dist, rank), dtype=np.float64)
    sa.write(comm, client, "mpi/dead", zeros, shape=SHAPE, chunks=(20, 36, 12), grid=grid, dist=dist)
    # Ranks 0 and 1 share file c/0 (rows 0-19), ranks 2 and 3 file c/1.
    # Rank 3 dies: rank 2's group times out, ranks 0 and 1 complete theirs.
    plan = sa.ArrayPlan(list(SHAPE), "float64", [20, 36, 12], list(grid), dist)
    base = comm.bcast(12345 if rank == 0 else None, root=0)
    outcome = "skipped"
    if rank != 3:
        try:
            plan.transfer(client, "mpi/dead", rank, np.ones_like(zeros), True, base, 500)
            outcome = "ok"
        except OSError as e:
            outcome = errno.errorcode.get(e.errno, str(e.errno))
    outcomes = comm.allgather(outcome)
    assert outcomes == ["ok", "ok", "ETIMEDOUT", "skipped"], outcomes
    z = zarr.open_array(f"{root}/mpi/dead", mode="r")[...]
    assert (z[:20] == 1).all(), "the complete group was written"
    assert (z[20:] == 0).all(), "nothing of the incomplete group was written"
    comm.Barrier()


def test_a_migrated_timestep_is_read_through_its_old_path_and_opens_in_zarr_python(server, comm, client):
    """`sluice array migrate` moves a finished timestep to a slower tier in
    the background class; ``sluice.array.read`` of the old path follows the
    mark, and zarr-python and xarray open the new tier without sluice."""
    import os
    import subprocess
    from pathlib import Path

    xr = pytest.importorskip("xarray")
    addr, root = server
    rank = comm.Get_rank()
    n = comm.Get_size()
    whole = np.arange(np.prod(SHAPE), dtype=np.float64).reshape(SHAPE)
    grid, dist = (n, 1, 1), ["block", "*", "*"]
    sa.write(comm, client, "mig/t0007/temp", block_of(whole, grid, dist, rank), shape=SHAPE, chunks=(10, 36, 12),
             grid=grid, dist=dist, dims=["z", "y", "x"])
    comm.Barrier()
    err = None
    if rank == 0:
        binary = os.environ.get("SLUICE_BIN", str(Path(__file__).resolve().parents[2] / "target" / "release" / "sluice"))
        r = subprocess.run([binary, "array", "migrate", ":mig/t0007", "--to", ":tape/t0007"],
                           env={**os.environ, "SLUICE_SERVER": addr}, capture_output=True, text=True)
        err = None if r.returncode == 0 and "weight 0" in r.stdout else f"{r.stdout} {r.stderr}"
    err = comm.bcast(err, root=0)
    assert err is None, err
    assert sorted(os.listdir(f"{root}/mig/t0007")) == ["zarr.json"]
    back = sa.read(comm, client, "mig/t0007/temp", grid=(1, n, 1), dist=["*", "block", "*"])
    np.testing.assert_array_equal(back, block_of(whole, (1, n, 1), ["*", "block", "*"], rank))
    if rank == 0:
        np.testing.assert_array_equal(zarr.open_array(f"{root}/tape/t0007/temp", mode="r")[...], whole)
        ds = xr.open_zarr(f"{root}/tape/t0007", consolidated=False)
        assert ds["temp"].dims == ("z", "y", "x")
    # A timestep that was never written is still a clear error.
    with pytest.raises(FileNotFoundError):
        sa.read(comm, client, "mig/t9999/temp", grid=(n, 1, 1), dist=["block", "*", "*"])
