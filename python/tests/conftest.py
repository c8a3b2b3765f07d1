"""A real `sluice serve` for the tests, started by rank 0 of
MPI.COMM_WORLD (one per pytest run, or per rank without MPI), on a
temporary root and socket, stopped and removed at the end even on
failure. The `sluice` binary: $SLUICE_BIN, else the repository's
target/release/sluice (`make test` builds it first)."""

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _accepts(sock: Path) -> bool:
    """Whether the server accepts a connection yet (its socket file appears
    at bind, before listen)."""
    import socket

    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(sock))
            return True
        except OSError:
            return False


def _comm():
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI.COMM_WORLD


@pytest.fixture(scope="session")
def comm():
    c = _comm()
    if c is None:
        pytest.skip("mpi4py is not installed")
    return c


@pytest.fixture(scope="session")
def server():
    """(address, root directory) of a running server."""
    c = _comm()
    rank = c.Get_rank() if c else 0
    proc, tmp, info = None, None, None
    if rank == 0:
        tmp = tempfile.mkdtemp(prefix="sluice-py-")
        root = Path(tmp) / "root"
        root.mkdir()
        sock = Path(tmp) / "s.sock"
        binary = os.environ.get("SLUICE_BIN", str(REPO / "target" / "release" / "sluice"))
        proc = subprocess.Popen([binary, "serve", "--root", str(root), "--listen", f"unix:{sock}"], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not _accepts(sock):
            assert proc.poll() is None, "sluice serve exited"
            assert time.monotonic() < deadline, "sluice serve did not come up"
            time.sleep(0.01)
        info = (f"unix:{sock}", str(root))
    if c is not None:
        info = c.bcast(info, root=0)
    try:
        yield info
    finally:
        if c is not None:
            c.Barrier()
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
            shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster():
    """(metadata address, root directory) of a running `sluice cluster` of
    4 data servers, started by rank 0; a failure to start fails every
    rank."""
    c = _comm()
    rank = c.Get_rank() if c else 0
    proc, tmp, info = None, None, None
    if rank == 0:
        try:
            tmp = tempfile.mkdtemp(prefix="sluice-py-cluster-")
            binary = os.environ.get("SLUICE_BIN", str(REPO / "target" / "release" / "sluice"))
            proc = subprocess.Popen([binary, "cluster", "--servers", "4", "--root", tmp], stdout=subprocess.DEVNULL)
            meta = Path(tmp) / "meta.sock"
            deadline = time.monotonic() + 20
            while not _accepts(meta):
                assert proc.poll() is None, "sluice cluster exited"
                assert time.monotonic() < deadline, "sluice cluster did not come up"
                time.sleep(0.02)
            info = (f"unix:{meta}", tmp)
        except AssertionError as e:
            info = ("error", str(e))
    if c is not None:
        info = c.bcast(info, root=0)
    try:
        assert info[0] != "error", info[1]
        yield info
    finally:
        if c is not None:
            c.Barrier()
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
            shutil.rmtree(tmp, ignore_errors=True)
