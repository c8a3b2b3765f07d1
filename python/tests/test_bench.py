"""`python -m sluice.bench collective` end to end at a small size: every
mode (MPI-IO, each sluice.mpi scheme, sluice.array's strategies, plain
pwrite of the same blocks and of contiguous shares) runs,
reads back what it wrote (the benchmark exits otherwise), and reports."""

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = os.environ.get("SLUICE_BIN", str(REPO / "target" / "release" / "sluice"))


def test_collective_benchmark_runs_every_mode(comm):
    from sluice.bench import collective

    out = comm.bcast(tempfile.mkdtemp(prefix="sluice-bench-test-") if comm.Get_rank() == 0 else None, root=0)
    path = f"{out}/coll.json"
    # With the server's write leases (its default): the schemes' writes
    # then go through the lent descriptors, and the read-back check still
    # holds.
    collective(
        argparse.Namespace(
            n=16, rounds=1, k_bytes=1 << 20, dir=out, sluice=BIN, mount=False, no_write_leases=False, policy=None, direct=False, device=None, cluster=0, stripe="1M", modes="mpi-io,sluice,array,posix", json=path
        )
    )
    if comm.Get_rank() == 0:
        rows = json.loads(Path(path).read_text())["rows"]
        labels = [(r["mode"], r["scheme"]) for r in rows]
        assert ("mpi-io", "local fs") in labels
        assert ("array", "zarr server-directed") in labels and ("array", "zarr independent") in labels
        assert ("posix", "pwrite, same blocks") in labels and ("posix", "pwrite, contiguous") in labels
        assert all(r["write_mib_s"] > 0 and r["read_mib_s"] > 0 for r in rows), rows
        # The scratch root is removed; only the JSON is left.
        assert sorted(os.listdir(out)) == ["coll.json"], os.listdir(out)
        shutil.rmtree(out)
    comm.Barrier()


def test_collective_benchmark_runs_only_the_rows_asked_for(comm):
    from sluice.bench import collective

    out = comm.bcast(tempfile.mkdtemp(prefix="sluice-bench-test-") if comm.Get_rank() == 0 else None, root=0)
    path = f"{out}/coll.json"
    # The server the bench starts takes a policy and O_DIRECT; only the
    # sluice.mpi rows run beside MPI-IO's reference row.
    collective(argparse.Namespace(n=16, rounds=1, k_bytes=1 << 20, dir=out, sluice=BIN, mount=False, no_write_leases=False, policy="fifo", direct=True, device=None, cluster=0, stripe="1M", modes="sluice", json=path))
    if comm.Get_rank() == 0:
        modes = {r["mode"] for r in json.loads(Path(path).read_text())["rows"]}
        assert modes == {"mpi-io", "sluice"}, modes
        shutil.rmtree(out)
    comm.Barrier()


def test_collective_benchmark_runs_on_a_cluster_through_its_mount(comm):
    from sluice.bench import collective
    from sluice.mpi import SCHEMES

    out = comm.bcast(tempfile.mkdtemp(prefix="sluice-bench-test-") if comm.Get_rank() == 0 else None, root=0)
    path = f"{out}/coll.json"
    # A cluster of 4 data servers in 8 KiB stripes (so that the 32 KiB
    # array's file spans them), MPI-IO through a mount of it; every row
    # reads back what it wrote.
    collective(argparse.Namespace(n=16, rounds=1, k_bytes=1 << 20, dir=out, sluice=BIN, mount=True, no_write_leases=False, policy=None, direct=True, device=None, cluster=4, stripe="8K", modes="mpi-io,sluice,array", json=path))
    if comm.Get_rank() == 0:
        doc = json.loads(Path(path).read_text())
        labels = {(r["mode"], r["scheme"]) for r in doc["rows"]}
        assert (doc["cluster"], doc["stripe"]) == (4, "8K")
        assert ("mpi-io", "sluice mount") in labels
        assert {s for m, s in labels if m == "sluice"} == set(SCHEMES), labels
        assert ("array", "zarr server-directed") in labels
        assert sorted(os.listdir(out)) == ["coll.json"], os.listdir(out)
        shutil.rmtree(out)
    comm.Barrier()
