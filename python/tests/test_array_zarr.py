"""Arrays that sluice writes as Zarr v3 (`sluice array write`)
are read by zarr-python 3 and xarray without sluice, and arrays that
zarr-python writes (compressed) are read by sluice through zarrs."""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")
xr = pytest.importorskip("xarray")

REPO = Path(__file__).resolve().parents[2]
BIN = os.environ.get("SLUICE_BIN", str(REPO / "target" / "release" / "sluice"))


def sluice(addr, *args):
    r = subprocess.run([BIN, *args], env={**os.environ, "SLUICE_SERVER": addr}, capture_output=True, text=True)
    assert r.returncode == 0, f"sluice {' '.join(args)}: {r.stderr}"
    return r.stdout


def expected(shape, dtype):
    return np.arange(int(np.prod(shape)), dtype=np.float64).astype(dtype).reshape(shape)


@pytest.mark.parametrize(
    "name,args",
    [
        ("blocks", ["--chunks", "8,10,12", "--grid", "2,2,1", "--dims", "z,y,x"]),
        (
            "sharded",
            ["--chunks", "4,5,6", "--shards", "8,10,12", "--grid", "2,1,2", "--dist", "cyclic(3),*,block",
             "--strategy", "two-phase", "--dims", "z,y,x"],
        ),
        ("edges", ["--chunks", "5,7,5", "--shards", "10,7,10", "--ranks", "4", "--dtype", "float32", "--dims", "z,y,x"]),
    ],
)
def test_zarr_python_and_xarray_read_what_sluice_wrote(server, name, args, on_rank0):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    addr, root = server
    shape = (16, 20, 24)
    on_rank0(lambda: sluice(addr, "array", "write", f":ts/t0040/{name}", "--shape", "16,20,24", *args))
    comm.Barrier()
    a = zarr.open_array(f"{root}/ts/t0040/{name}", mode="r")
    want = expected(shape, a.dtype)
    assert a.shape == shape
    # Every rank reads its own BLOCK slab of the first dimension.
    n, r = comm.Get_size(), comm.Get_rank()
    lo, hi = r * shape[0] // n, (r + 1) * shape[0] // n
    np.testing.assert_array_equal(a[lo:hi], want[lo:hi])

    def whole():
        ds = xr.open_zarr(f"{root}/ts/t0040", consolidated=False)
        assert ds[name].dims == ("z", "y", "x")
        np.testing.assert_array_equal(ds[name].values, want)
        assert ds[name].attrs["sluice_pattern"] == "linear-index"

    on_rank0(whole)


def test_sluice_reads_what_zarr_python_wrote(server, comm, on_rank0):
    addr, root = server

    def go():
        data = np.arange(30 * 40, dtype=np.int32).reshape(30, 40)
        # zarr-python's defaults: zstd-compressed chunks, which sluice reads through zarrs.
        z = zarr.create_array(f"{root}/foreign", shape=data.shape, chunks=(7, 9), dtype=np.int32)
        z[...] = data
        out = sluice(addr, "array", "cat", ":foreign", "--region", "29,37:")
        assert out.split() == ["1197", "1198", "1199"], out
        info = sluice(addr, "array", "info", ":foreign")
        assert "zstd" in info and "not a fixed-offset array" in info, info
        v = sluice(addr, "array", "verify", ":foreign")
        assert "1200 elements" in v, v

    on_rank0(go)


def test_sluice_refuses_uncompressed_shards_zarr_python_laid_out_otherwise(server, comm, on_rank0):
    """zarr-python writes uncompressed shards with the metadata sluice
    writes, but puts a shard's chunks in another order and leaves out
    chunks that are all fill value: sluice read other bytes there without
    an error (1, 2, 5, 6, 7, 8, 0, 8e-323 for 1..8 with a gap). It now
    checks each shard's index and refuses, on every rank."""
    from mpi4py import MPI

    sa = pytest.importorskip("sluice.array")
    import sluice

    addr, root = server
    rank = comm.Get_rank() if comm else 0

    def make():
        from zarr.codecs import BytesCodec

        a = zarr.create_array(f"{root}/zp/sh1d", shape=(8,), chunks=(2,), shards=(8,), dtype="f8",
                              compressors=None, serializer=BytesCodec(), fill_value=0.0)
        a[:] = np.array([1, 2, 0, 0, 5, 6, 7, 8], dtype="f8")
        b = zarr.create_array(f"{root}/zp/sh2d", shape=(8, 8), chunks=(2, 2), shards=(8, 8), dtype="f8",
                              compressors=None, serializer=BytesCodec(), fill_value=0.0)
        b[:] = np.arange(64, dtype="f8").reshape(8, 8) + 1

    on_rank0(make)
    c = sluice.Client(addr, app="zarr-shards", client_id=rank)
    for name, grid, dist in [("zp/sh1d", (1,), ["*"]), ("zp/sh2d", (1, 1), ["*", "*"])]:
        with pytest.raises(ValueError, match="another Zarr writer"):
            sa.read(comm or MPI.COMM_SELF, c, name, grid=grid, dist=dist)

    # The CLI's collective read checks the same (it read other chunks'
    # bytes and said nothing).
    def cli():
        for name in ["zp/sh1d", "zp/sh2d"]:
            r = subprocess.run([BIN, "array", "read", f":{name}", "--ranks", "1"], env={**os.environ, "SLUICE_SERVER": addr}, capture_output=True, text=True)
            assert r.returncode != 0 and "another Zarr writer" in r.stderr, (name, r.returncode, r.stdout, r.stderr)

    on_rank0(cli)


def test_chunks_zarr_python_left_out_read_as_the_fill_value(server, comm, on_rank0):
    """zarr-python does not write a chunk that is all fill value; sluice
    raised FileNotFoundError on it, under every strategy. It reads zeros
    (the fill value sluice's layout requires), as zarr-python does."""
    from mpi4py import MPI

    sa = pytest.importorskip("sluice.array")
    import sluice

    addr, root = server
    rank = comm.Get_rank() if comm else 0
    data = np.zeros((8, 8), dtype="f8")
    data[:4, :4] = np.arange(16).reshape(4, 4) + 1
    data[4:, 4:] = 7

    def make():
        from zarr.codecs import BytesCodec

        a = zarr.create_array(f"{root}/zp/gaps", shape=(8, 8), chunks=(4, 4), dtype="f8",
                              compressors=None, serializer=BytesCodec(), fill_value=0.0)
        a[:] = data
        assert not os.path.exists(f"{root}/zp/gaps/c/0/1"), "zarr-python left the empty chunk out"

    on_rank0(make)
    c = sluice.Client(addr, app="zarr-gaps", client_id=rank)
    world = comm or MPI.COMM_SELF
    n, rows = world.Get_size(), -(-8 // world.Get_size())
    for strategy in ["server-directed", "independent", "two-phase"]:
        back = sa.read(world, c, "zp/gaps", grid=(n, 1), dist=["block", "*"], strategy=strategy)
        np.testing.assert_array_equal(back, data[rank * rows:(rank + 1) * rows])
