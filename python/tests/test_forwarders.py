"""The Python client on a forwarder set: two `sluice serve` over one root,
reached through one address list. Run by rank 0 only (the servers are its
own); the other ranks skip."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

import sluice

from conftest import _binary, _comm, _start


def test_a_python_client_uses_a_forwarder_set_and_survives_a_members_death():
    c = _comm()
    if c is not None and c.Get_rank() != 0:
        pytest.skip("rank 0 runs the forwarders")
    tmp = tempfile.mkdtemp(prefix="sluice-py-fwd-")
    procs = []
    try:
        root = Path(tmp) / "root"
        root.mkdir()
        addrs = []
        for k in range(2):
            sock = Path(tmp) / f"f{k}.sock"
            proc, err = _start([_binary(), "serve", "--root", str(root), "--listen", f"unix:{sock}"], sock, f"forwarder {k}", 10)
            procs.append(proc)
            assert err is None, err
            addrs.append(f"unix:{sock}")
        client = sluice.Client(",".join(addrs))
        assert client.servers == 1, "a set serves one namespace"
        fd = client.open("py.dat", os.O_RDWR | os.O_CREAT)
        block = bytes(range(256)) * 256
        for i in range(8):
            client.pwrite(fd, block, i * len(block))
        assert (root / "py.dat").read_bytes() == block * 8, "the set writes into the shared root"
        # Either member dies (the file's home or the other): reads go on.
        procs[0].kill()
        procs[0].wait()
        buf = bytearray(len(block))
        for i in range(8):
            assert client.pread(fd, buf, i * len(block)) == len(block)
            assert bytes(buf) == block
        client.close(fd)
        # A new open goes to the file's home among the members left.
        fd = client.open("py.dat", os.O_RDONLY)
        assert client.pread(fd, buf, 3 * len(block)) == len(block) and bytes(buf) == block
        client.close(fd)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
