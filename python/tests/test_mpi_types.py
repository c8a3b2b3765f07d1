"""sluice.mpi with MPI.SHORT_INT (a short, 2 bytes of padding, an int: 6
bytes over an extent of 8) as etype and filetype, on 4 ranks (mpirun -np 4):
the same file as OpenMPI's MPI-IO. Before, a predefined type was taken as
one run of its size, and the int went 2 bytes early."""

import os

import numpy as np
import pytest
from mpi4py import MPI

from sluice.mpi import File, _pack_offsets, _runs_of_type, runs_of

SCHEMES = ["two-phase", "dynamic", "static", "server", "independent"]
PAIRS = [MPI.SHORT_INT, MPI.FLOAT_INT, MPI.DOUBLE_INT, MPI.LONG_INT, MPI.TWOINT, MPI.LONG_DOUBLE_INT]


def everywhere(comm, ok: bool) -> bool:
    return comm.allreduce(bool(ok), op=MPI.LAND)


@pytest.mark.parametrize("t", PAIRS, ids=lambda t: t.Get_name())
def test_predefined_pair_types_flatten_as_mpi_packs_them(t):
    want = runs_of(_pack_offsets(t))
    got = _runs_of_type(t)
    assert got is None or all(np.array_equal(g, w) for g, w in zip(got, want)), (t.Get_name(), [x.tolist() for x in got], [x.tolist() for x in want])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_short_int_view_matches_openmpi(server, comm, scheme):
    if comm.Get_size() != 4:
        pytest.skip("run with mpirun -np 4")
    addr, root = server
    rank = comm.Get_rank()
    # Three (short, int) pairs per rank, as MPI packs them (6 bytes each).
    pairs = [(rank * 10 + k, -(rank * 1000 + k)) for k in range(3)]
    data = np.frombuffer(b"".join(np.int16(s).tobytes() + np.int32(i).tobytes() for s, i in pairs), np.uint8).copy()
    disp = rank * 3 * 8
    ref, mine = f"ref-shortint-{scheme}.bin", f"sl-shortint-{scheme}.bin"
    if rank == 0:
        for name in (ref, mine):  # the padding keeps what was there
            with open(os.path.join(root, name), "wb") as f:
                f.write(b"\xee" * 4 * 3 * 8)
    comm.Barrier()
    fh = MPI.File.Open(comm, os.path.join(root, ref), MPI.MODE_WRONLY)
    fh.Set_view(disp, MPI.SHORT_INT, MPI.SHORT_INT)
    fh.Write_all([data, MPI.BYTE])
    fh.Close()
    with File.open(comm, mine, MPI.MODE_RDWR, server=addr, scheme=scheme) as f:
        f.set_view(disp, MPI.SHORT_INT, MPI.SHORT_INT)
        assert f.write_all(data) == data.nbytes
    same, records = None, None
    if rank == 0:
        with open(os.path.join(root, ref), "rb") as x, open(os.path.join(root, mine), "rb") as y:
            a, b = x.read(), y.read()
        same = a == b
        rec = np.dtype({"names": ["s", "i"], "formats": ["<i2", "<i4"], "offsets": [0, 4], "itemsize": 8})
        records = [(int(s), int(i)) for s, i in np.frombuffer(b, rec)]
    same, records = comm.bcast((same, records), root=0)
    assert records[rank * 3 : rank * 3 + 3] == pairs, "each pair at its place: the short at 0, the int at 4"
    assert same, "the same bytes as OpenMPI's Write_all"
    # And OpenMPI's file reads back through the view.
    back = np.zeros_like(data)
    with File.open(comm, ref, MPI.MODE_RDONLY, server=addr, scheme=scheme) as f:
        f.set_view(disp, MPI.SHORT_INT, MPI.SHORT_INT)
        f.read_all(back)
    assert everywhere(comm, np.array_equal(back, data))
