"""sluice.Client against a real server: numpy buffers in and out without
copies, list I/O, errors as OSError with the server's errno."""

import errno
import os

import numpy as np
import pytest

import sluice


def test_numpy_round_trip_and_list_io(server, comm):
    addr, root = server
    rank = comm.Get_rank()
    c = sluice.Client(addr, app="pytest", client_id=rank)
    name = f"client-{rank}.bin"
    fd = c.open(name, os.O_CREAT | os.O_RDWR)
    a = np.arange(100_000, dtype=np.float64) * (rank + 1)
    assert c.pwrite(fd, a, 0) == a.nbytes
    b = np.empty_like(a)
    assert c.pread(fd, b, 0) == a.nbytes
    assert np.array_equal(a, b)
    assert c.size(fd) == a.nbytes
    # The bytes on the server's disk are the array's.
    assert np.array_equal(np.fromfile(os.path.join(root, name), dtype=np.float64), a)
    # List I/O: three pieces, back to back in the buffer.
    pieces = [(0, 8), (800, 16), (8000, 8)]
    out = np.empty(32, np.uint8)
    assert c.read_list(fd, pieces, out) == 32
    raw = a.view(np.uint8)
    assert np.array_equal(out, np.concatenate([raw[o : o + n] for o, n in pieces]))
    assert c.write_list(fd, [(0, 4), (16, 4)], np.frombuffer(b"abcdefgh", np.uint8)) == 8
    with open(os.path.join(root, name), "rb") as f:
        assert f.read(4) == b"abcd"
    c.close(fd)
    c.unlink(name)


def test_errors_are_oserror_with_errno(server):
    c = sluice.Client(server[0])
    with pytest.raises(OSError) as e:
        c.open("does/not/exist")
    assert e.value.errno == errno.ENOENT
    with pytest.raises(OSError) as e:
        c.open("../escape")
    assert e.value.errno in (errno.EACCES, errno.EPERM, errno.EXDEV, errno.ENOENT, errno.EINVAL)
    fd = c.open("ro.bin", os.O_CREAT | os.O_RDWR)
    with pytest.raises(BufferError):
        c.pread(fd, b"read-only bytes", 0)
    # A list write's data is exactly its pieces' bytes (the extra were
    # dropped unsaid before); a write past the largest offset is EFBIG, and
    # the connection stays (it was closed: "connection lost").
    with pytest.raises(ValueError, match="the pieces 4"):
        c.write_list(fd, [(0, 4)], b"ABCDEFGH")
    with pytest.raises(OSError) as e:
        c.pwrite(fd, b"xy", 2**64 - 2)
    assert e.value.errno == errno.EFBIG
    assert c.pwrite(fd, b"ok", 0) == 2
    c.close(fd)


def test_a_missing_server_is_a_clear_error(tmp_path):
    with pytest.raises(OSError):
        sluice.Client(f"unix:{tmp_path}/nobody.sock")


def test_the_ranks_of_one_mpirun_are_one_application(server, comm):
    """The client's identity rule: an MPI job is one application, the same
    id on every rank (from PMIx's namespace under OpenMPI)."""
    if "SLUICE_APP" in os.environ or "SLURM_JOB_ID" in os.environ:
        pytest.skip("an explicit application id is set")
    app = sluice.Client(server[0]).app
    everyone = comm.allgather(app)
    assert len(set(everyone)) == 1 and app.startswith("mpi-"), everyone
