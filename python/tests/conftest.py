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


def _binary() -> str:
    return os.environ.get("SLUICE_BIN", str(REPO / "target" / "release" / "sluice"))


def _start(cmd, sock: Path, what: str, seconds: float):
    """Start `cmd` and wait until `sock` accepts; the process, or an error
    message."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + seconds
    while not _accepts(sock):
        if proc.poll() is not None:
            return proc, f"{what} exited"
        if time.monotonic() > deadline:
            return proc, f"{what} did not come up"
        time.sleep(0.01)
    return proc, None


def _serving(c, start):
    """Run `start()` on rank 0 (it returns (process, scratch dir, info,
    error)), share its info with every rank, fail every rank if it
    failed, and stop it and remove its scratch directory at the end."""
    rank = c.Get_rank() if c else 0
    proc, tmp, info = None, None, None
    if rank == 0:
        proc, tmp, info, err = start()
        if err is not None:
            info = ("error", err)
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
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def server():
    """(address, root directory) of a running server."""

    def start():
        tmp = tempfile.mkdtemp(prefix="sluice-py-")
        root = Path(tmp) / "root"
        root.mkdir()
        sock = Path(tmp) / "s.sock"
        proc, err = _start([_binary(), "serve", "--root", str(root), "--listen", f"unix:{sock}"], sock, "sluice serve", 10)
        return proc, tmp, (f"unix:{sock}", str(root)), err

    yield from _serving(_comm(), start)


@pytest.fixture(scope="session")
def cluster():
    """(metadata address, root directory) of a running `sluice cluster` of
    4 data servers, started by rank 0; a failure to start fails every
    rank."""

    def start():
        tmp = tempfile.mkdtemp(prefix="sluice-py-cluster-")
        meta = Path(tmp) / "meta.sock"
        proc, err = _start([_binary(), "cluster", "--servers", "4", "--root", tmp], meta, "sluice cluster", 20)
        return proc, tmp, (f"unix:{meta}", tmp), err

    yield from _serving(_comm(), start)


@pytest.fixture(scope="session")
def on_rank0(comm):
    """Run f on rank 0 and raise on every rank if it failed there."""

    def run(f):
        err = None
        if comm.Get_rank() == 0:
            try:
                f()
            except BaseException as e:  # noqa: BLE001 - re-raised on every rank
                err = repr(e)
        err = comm.bcast(err, root=0)
        assert err is None, err

    return run
