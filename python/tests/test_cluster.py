"""Python on a cluster: ``sluice.Client`` given a cluster's metadata
address (a real ``sluice cluster`` of 4 data servers) reads and writes
striped files, ``sluice.array`` writes and reads timesteps with every
strategy (each array file one object on a data server, the files spread
over all four), and the heat example runs there under a real ``mpirun``
and xarray reads its output through a real ``sluice mount`` of the
cluster, equal to the same run on one server."""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

xr = pytest.importorskip("xarray")
sa = pytest.importorskip("sluice.array")

import sluice  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BIN = os.environ.get("SLUICE_BIN", str(REPO / "target" / "release" / "sluice"))


def objects_per_server(root):
    """How many objects each data server of the cluster under root holds."""
    return [len(list((Path(root) / f"data-{i}" / "objects").glob("*"))) for i in range(4)]


def test_a_striped_file_is_read_and_written_through_the_cluster(cluster, comm):
    addr, root = cluster
    c = sluice.Client(addr, app="cluster-test", client_id=comm.Get_rank())
    assert c.servers == 4
    rank = comm.Get_rank()
    path = f"plain/r{rank}.bin"
    if rank == 0:
        c.mkdir("plain", 0o755)
    comm.Barrier()
    data = np.arange(3 << 18, dtype=np.uint32) * (rank + 1)
    fd = c.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    assert c.pwrite(fd, data, 0) == data.nbytes
    back = np.zeros_like(data)
    assert c.pread(fd, back, 0) == data.nbytes and c.size(fd) == data.nbytes
    np.testing.assert_array_equal(back, data)
    # List I/O across the file's objects.
    pieces = [(0, 4096), (data.nbytes - 8192, 8192)]
    got = bytearray(12288)
    assert c.read_list(fd, pieces, got) == 12288
    assert bytes(got[:4096]) == data.tobytes()[:4096] and bytes(got[4096:]) == data.tobytes()[-8192:]
    c.close(fd)


@pytest.mark.parametrize("strategy", ["server-directed", "independent", "two-phase"])
def test_every_strategy_writes_and_reads_timesteps_on_a_cluster(cluster, comm, strategy, on_rank0):
    addr, root = cluster
    rank, n = comm.Get_rank(), comm.Get_size()
    c = sluice.Client(addr, app=f"cluster-{strategy}", client_id=rank)
    temp = sa.Array("temp", (8 * n, 6, 5), "float64", memory=["block", "*", "*"], disk=(2, 6, 5), dims=["z", "y", "x"])
    g = sa.ArrayGroup(f"sim/{strategy}", [temp], comm, c, strategy=strategy)
    rows = range(rank * 8, rank * 8 + 8)

    def field(step):
        z = np.arange(rows.start, rows.stop).reshape(-1, 1, 1)
        return (z * 1000 + np.arange(30).reshape(6, 5) + step * 0.5).astype(np.float64)

    before = objects_per_server(root) if rank == 0 else None
    for step in range(2):
        g.timestep(step, {"temp": field(step)})
    np.testing.assert_array_equal(g.read(1)["temp"], field(1))
    comm.Barrier()

    def spread():
        after = objects_per_server(root)
        grew = [a - b for a, b in zip(after, before)]
        # 4n files a step, one object each, file u on server u mod 4.
        assert all(g >= 2 for g in grew), f"every data server holds some of the array's files: {grew}"

    on_rank0(spread)


def test_the_heat_example_runs_on_a_cluster_and_xarray_reads_it_through_the_mount(cluster, server, comm, on_rank0):
    addr, croot = cluster
    saddr, sroot = server

    def run():
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "OPAL_"))}

        def heat(at, out):
            cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", sys.executable, str(REPO / "examples" / "heat.py"),
                   "--server", at, "--out", out, "--n", "16", "--steps", "20", "--output-every", "5", "--checkpoint-every", "10"]
            return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)

        on_cluster = heat(addr, "heat/cluster")
        assert on_cluster.returncode == 0, on_cluster.stderr[-2000:]
        alone = heat(saddr, "heat/alone")
        assert alone.returncode == 0, alone.stderr[-2000:]
        assert on_cluster.stdout.strip().splitlines()[-1] == alone.stdout.strip().splitlines()[-1], "the same total heat"
        mnt = tempfile.mkdtemp(prefix="sluice-py-mnt-")
        mount = subprocess.Popen([BIN, "mount", "--server", addr, mnt], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 20
            while not os.path.ismount(mnt):
                assert mount.poll() is None, f"sluice mount exited: {mount.stderr.read().decode()[-2000:]}"
                assert time.monotonic() < deadline, "the mount did not come up"
                time.sleep(0.05)
            a = xr.open_zarr(f"{mnt}/heat/cluster", consolidated=False)["temp"].values
            b = xr.open_zarr(f"{sroot}/heat/alone", consolidated=False)["temp"].values
            assert a.shape == (5, 16, 16, 16)
            np.testing.assert_array_equal(a, b)
        finally:
            subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)
            mount.terminate()
            mount.wait(timeout=30)
            os.rmdir(mnt)

    on_rank0(run)


@pytest.mark.parametrize("scheme", ["server", "two-phase", "independent"])
def test_sluice_mpi_collectives_on_a_file_striped_over_the_cluster(cluster, comm, scheme):
    from mpi4py import MPI

    from sluice.mpi import File

    addr, root = cluster
    rank, n = comm.Get_rank(), comm.Get_size()
    c = sluice.Client(addr, app="stripe-test", client_id=rank)
    name = f"striped-{scheme}.bin"
    if rank == 0:
        # 16 KiB stripes over all four data servers.
        r = subprocess.run([BIN, "setstripe", "--server", addr, "-S", "16K", "-c", "-1", name], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    comm.Barrier()
    # Rows of 1 KiB cyclic over the ranks: every rank's pieces span every
    # data server, and each server's group gathers all ranks' shares.
    rows, row = 64, 128
    local = (np.arange(rows * row, dtype=np.float64).reshape(rows, row) + 1e6 * rank)
    ftype = MPI.DOUBLE.Create_vector(rows, row, row * n).Create_resized(0, row * n * 8).Commit()
    with File.open(comm, name, MPI.MODE_RDWR, server=addr, scheme=scheme) as f:
        f.set_view(rank * row * 8, MPI.DOUBLE, ftype)
        assert f.write_all(local) == local.nbytes
        if scheme == "two-phase":
            assert len(f.groups) == min(4, n), f"one aggregator per data server: {f.groups}"
    back = np.zeros_like(local)
    with File.open(comm, name, MPI.MODE_RDONLY, server=addr, scheme=scheme) as f:
        f.set_view(rank * row * 8, MPI.DOUBLE, ftype)
        f.read_all(back)
    ftype.Free()
    np.testing.assert_array_equal(back, local)
    fd = c.open(name, os.O_RDONLY)
    assert c.objects_touched(fd, [(0, 64 << 10)]) == [0, 1, 2, 3], "64 KiB of 16 KiB stripes span the four objects"
    assert c.size(fd) == rows * row * 8 * n
    # A participant count missing for an object it touches is refused.
    with pytest.raises(OSError):
        c.read_list_group(fd, [(0, 64 << 10)], bytearray(64 << 10), 7, [1, 1], 1000)
    c.close(fd)


def test_a_group_message_on_a_cluster_file_of_one_object_is_not_cut(cluster, comm, on_rank0):
    addr, root = cluster

    def run():
        c = sluice.Client(addr, app="one-object-test")
        name = "one-object.bin"
        r = subprocess.run([BIN, "setstripe", "--server", addr, "-c", "1", name], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        fd = c.open(name, os.O_RDWR)
        # 9 MiB in one group message of one participant: a file of one
        # object takes it whole (a striped file's share is at most 8 MiB).
        data = np.arange(9 << 17, dtype=np.uint64)
        assert c.objects_touched(fd, [(0, data.nbytes)]) == [0]
        assert c.write_list_group(fd, [(0, data.nbytes)], data, 11, 1, 5000) == data.nbytes
        back = np.zeros_like(data)
        assert c.read_list_group(fd, [(0, data.nbytes)], back, 12, [1], 5000) == data.nbytes
        np.testing.assert_array_equal(back, data)
        c.close(fd)

    on_rank0(run)


def test_two_phase_domains_on_a_striped_file_follow_the_stripes():
    from sluice.mpi import _cut_stripes

    # 4 KiB stripes over 3 objects, 2 aggregators: object k's stripes go
    # to aggregator k % 2.
    offs = np.array([1000, 9000], dtype=np.int64)
    lens = np.array([8000, 4096], dtype=np.int64)
    pos = np.array([0, 8000], dtype=np.int64)
    o, n, p, d = _cut_stripes(offs, lens, pos, 4096, 3, 2)
    assert o.tolist() == [1000, 4096, 8192, 9000, 12288]
    assert n.tolist() == [3096, 4096, 808, 3288, 808]
    assert p.tolist() == [0, 3096, 7192, 8000, 11288]
    # Stripes 0, 1, 2, 2, 3 -> objects 0, 1, 2, 2, 0 -> aggregators 0, 1, 0, 0, 0.
    assert d.tolist() == [0, 1, 0, 0, 0]
