"""sluice.mpi against OpenMPI's own MPI-IO, on 4 ranks (mpirun -np 4):
views with subarray and vector filetypes write the same bytes as
`MPI.File.Write_all` and read them back, with every scheme; the
aggregator groups follow the split/join rule."""

import os

import numpy as np
import pytest
from mpi4py import MPI

from sluice.mpi import File, choose_groups

SCHEMES = ["two-phase", "dynamic", "static", "server", "independent"]
GX, GY = 64, 48  # global 2-D array of float64, BLOCK x BLOCK over 2 x 2 ranks


def block(comm):
    rank = comm.Get_rank()
    px, py = rank // 2, rank % 2
    lx, ly = GX // 2, GY // 2
    local = (np.arange(lx * ly, dtype=np.float64).reshape(lx, ly) + 1000 * rank)
    sub = MPI.DOUBLE.Create_subarray([GX, GY], [lx, ly], [px * lx, py * ly]).Commit()
    return local, sub


def reference(comm, root, name, disp, filetype, data):
    """Write `data` with OpenMPI's MPI-IO (Write_all through the view)."""
    fh = MPI.File.Open(comm, os.path.join(root, name), MPI.MODE_CREATE | MPI.MODE_WRONLY)
    fh.Set_view(disp, MPI.DOUBLE, filetype)
    fh.Write_all(data)
    fh.Close()


def same_file(comm, root, a, b):
    ok = None
    if comm.Get_rank() == 0:
        with open(os.path.join(root, a), "rb") as x, open(os.path.join(root, b), "rb") as y:
            ok = x.read() == y.read()
    return comm.bcast(ok, root=0)


@pytest.fixture(autouse=True)
def four_ranks(comm):
    if comm.Get_size() != 4:
        pytest.skip("run with mpirun -np 4")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_subarray_view_matches_openmpi_and_reads_back(server, comm, scheme):
    addr, root = server
    local, sub = block(comm)
    reference(comm, root, f"ref-sub-{scheme}.bin", 0, sub, local)
    with File.open(comm, f"sl-sub-{scheme}.bin", MPI.MODE_CREATE | MPI.MODE_RDWR, server=addr, scheme=scheme) as f:
        f.set_view(0, MPI.DOUBLE, sub)
        assert f.write_all(local) == local.nbytes
    assert same_file(comm, root, f"ref-sub-{scheme}.bin", f"sl-sub-{scheme}.bin"), "the same bytes as OpenMPI's Write_all"
    for name in (f"sl-sub-{scheme}.bin", f"ref-sub-{scheme}.bin"):
        back = np.zeros_like(local)
        with File.open(comm, name, MPI.MODE_RDONLY, server=addr, scheme=scheme) as f:
            f.set_view(0, MPI.DOUBLE, sub)
            f.read_all(back)
        assert everywhere(comm, np.array_equal(back, local)), name


@pytest.mark.parametrize("scheme", SCHEMES)
def test_vector_view_with_displacement_matches_openmpi(server, comm, scheme):
    addr, root = server
    rank, blk = comm.Get_rank(), 16
    data = np.arange(8 * blk, dtype=np.float64) + 10_000 * rank
    vec = MPI.DOUBLE.Create_vector(8, blk, 4 * blk).Commit()
    disp = rank * blk * 8
    reference(comm, root, f"ref-vec-{scheme}.bin", disp, vec, data)
    with File.open(comm, f"sl-vec-{scheme}.bin", MPI.MODE_CREATE | MPI.MODE_RDWR, server=addr, scheme=scheme) as f:
        f.set_view(disp, MPI.DOUBLE, vec)
        f.write_at_all(0, data)
        back = np.zeros_like(data)
        f.read_at_all(0, back)
        assert everywhere(comm, np.array_equal(back, data))
        # Independent access at an offset inside the view.
        half = np.zeros(4 * blk)
        f.read_at(4 * blk, half)
        assert everywhere(comm, np.array_equal(half, data[4 * blk :]))
    assert same_file(comm, root, f"ref-vec-{scheme}.bin", f"sl-vec-{scheme}.bin")


def test_aggregator_groups_follow_k(server, comm):
    addr, root = server
    local, sub = block(comm)  # 6 KiB per rank, 24 KiB in all
    with File.open(comm, "groups.bin", MPI.MODE_CREATE | MPI.MODE_RDWR, server=addr, k_bytes=8 << 10) as f:
        f.set_view(0, MPI.DOUBLE, sub)
        f.write_all(local)
        assert f.groups == [[0], [1], [2], [3]], "6 KiB shares with k = 8 KiB: no two fit one aggregator"
    for scheme in ("dynamic", "static"):
        with File.open(comm, f"groups-{scheme}.bin", MPI.MODE_CREATE | MPI.MODE_RDWR, server=addr, k_bytes=12 << 10, scheme=scheme) as f:
            f.set_view(0, MPI.DOUBLE, sub)
            f.write_all(local)
            assert f.position == local.size, "write_all moves the file pointer past the data"
            back = np.zeros_like(local)
            f.read_at_all(0, back)
            assert f.groups == [[0, 1], [2, 3]] and everywhere(comm, np.array_equal(back, local)), scheme
    with File.open(comm, "groups.bin", MPI.MODE_RDWR, server=addr, k_bytes=12 << 10) as f:
        f.set_view(0, MPI.DOUBLE, sub)
        back = np.zeros_like(local)
        f.read_all(back)
        assert f.groups == [[0, 1], [2, 3]] and everywhere(comm, np.array_equal(back, local))


def test_split_and_join_on_synthetic_k():
    assert choose_groups([10] * 8, 35) == [[0, 1, 2], [3, 4], [5, 6, 7]]
    assert choose_groups([100] * 4, 50) == [[0], [1], [2], [3]], "a share above k stays alone"
    assert choose_groups([1] * 6, 100) == [[0, 1, 2, 3, 4, 5]], "all below k: one aggregator"
    assert choose_groups([40, 1, 1, 40], 45) == [[0, 1], [2, 3]], "two groups of 41 bytes: neither splits nor joins"
    assert choose_groups([1, 1, 1, 1, 80], 50) == [[0, 1, 2, 3], [4]], "the heavy group splits down to its heavy rank, the light ones join"
    assert choose_groups([], 10) == []


def test_list_requests_are_bounded_at_n_and_n_plus_1():
    from sluice.mpi import LIST_BYTES_MAX, LIST_PIECES_MAX, _chunks

    ones = lambda n: (np.arange(n, dtype=np.int64) * 2, np.ones(n, dtype=np.int64))  # noqa: E731
    assert list(_chunks(*ones(LIST_PIECES_MAX))) == [(0, LIST_PIECES_MAX)], "N pieces: one request"
    assert list(_chunks(*ones(LIST_PIECES_MAX + 1))) == [(0, LIST_PIECES_MAX), (LIST_PIECES_MAX, LIST_PIECES_MAX + 1)], "N+1: two"
    half = LIST_BYTES_MAX // 2
    offs = np.array([0, half, 2 * half], dtype=np.int64)
    assert list(_chunks(offs[:2], np.array([half, half]))) == [(0, 2)], "N bytes: one request"
    assert list(_chunks(offs, np.array([half, half, 1]))) == [(0, 2), (2, 3)], "N+1 bytes: two"


def everywhere(comm, ok: bool) -> bool:
    """True on every rank when true on all (an assertion that fails on one
    rank only would leave the others waiting in the next collective)."""
    return comm.allreduce(bool(ok), op=MPI.LAND)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_overlapping_reads_zero_byte_ranks_and_reads_past_the_end(server, comm, scheme):
    addr, root = server
    rank = comm.Get_rank()
    header = np.arange(64, dtype=np.uint8)
    if rank == 0:
        with open(os.path.join(root, f"hdr-{scheme}.bin"), "wb") as f:
            f.write(header.tobytes())
    comm.Barrier()
    with File.open(comm, f"hdr-{scheme}.bin", MPI.MODE_RDONLY, server=addr, scheme=scheme) as f:
        # Every rank but the last reads the same 16-byte header (overlap),
        # rank 1 also reads 32 bytes from offset 48 (16 past the end), the
        # last rank reads nothing.
        want = [16, 32, 16, 0][rank] if comm.Get_size() == 4 else 16
        at = 48 if rank == 1 else 0
        back = np.full(want, 0xEE, dtype=np.uint8)
        f.read_at_all(at, back)
        expect = np.zeros(want, np.uint8)
        have = header[at : at + want]
        expect[: len(have)] = have
        assert everywhere(comm, np.array_equal(back, expect)), "overlapping pieces, past-the-end zeros, empty ranks"


def test_append_excl_and_delete_on_close_modes(server, comm):
    # Before: all three were ignored, and MODE_APPEND wrote over the start.
    addr, root = server
    rank = comm.Get_rank()
    path = os.path.join(root, "modes.bin")
    if rank == 0:
        with open(path, "wb") as f:
            f.write(b"first-record|")
    comm.Barrier()
    with File.open(comm, "modes.bin", MPI.MODE_WRONLY | MPI.MODE_APPEND, server=addr) as f:
        assert f.position == 13
        f.write_all(np.frombuffer(b"S" if rank == 0 else b"", dtype=np.uint8))
    comm.Barrier()
    with open(path, "rb") as f:
        assert everywhere(comm, f.read() == b"first-record|S")
    with pytest.raises(FileExistsError):
        File.open(comm, "modes.bin", MPI.MODE_CREATE | MPI.MODE_EXCL | MPI.MODE_WRONLY, server=addr)
    File.open(comm, "fresh.bin", MPI.MODE_CREATE | MPI.MODE_EXCL | MPI.MODE_WRONLY, server=addr).close()
    with File.open(comm, "scratch.bin", MPI.MODE_CREATE | MPI.MODE_RDWR | MPI.MODE_DELETE_ON_CLOSE, server=addr) as f:
        f.write_at_all(rank * 4, np.full(4, rank, dtype=np.uint8))
    comm.Barrier()
    assert everywhere(comm, not os.path.exists(os.path.join(root, "scratch.bin")))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_reads_report_the_end_of_the_file_and_a_bad_buffer_fails_every_rank(server, comm, scheme):
    # Before: every read counted its bytes past the end (zeros), so a
    # `while f.read(b)` loop never ended; and a strided buffer on one rank
    # left the others waiting in the collective.
    addr, root = server
    rank = comm.Get_rank()
    if rank == 0:
        with open(os.path.join(root, f"ten-{scheme}.bin"), "wb") as f:
            f.write(bytes(range(10)))
    comm.Barrier()
    with File.open(comm, f"ten-{scheme}.bin", MPI.MODE_RDONLY, server=addr, scheme=scheme) as f:
        counts = []
        b = np.zeros(4, np.uint8)
        while True:
            n = f.read(b)
            counts.append(n)
            if n == 0 or len(counts) > 5:
                break
        assert everywhere(comm, counts == [4, 4, 2, 0])
        back = np.zeros(8, np.uint8)
        assert everywhere(comm, f.read_at_all(8, back) == 2)
        bad = np.zeros(16, np.uint8)[::2] if rank == 1 else np.zeros(8, np.uint8)
        with pytest.raises(ValueError, match="contiguous"):
            f.read_at_all(0, bad)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_struct_view_and_fortran_buffers(server, comm, scheme):
    addr, root = server
    rank = comm.Get_rank()
    # A struct (flattened by MPI's Pack): two doubles with a hole, tiled
    # every 32 bytes.
    st = MPI.Datatype.Create_struct([1, 1], [0, 16], [MPI.DOUBLE, MPI.DOUBLE]).Commit()
    tile = st.Create_resized(0, 32).Commit()
    disp = rank * 32 * 4
    data = np.asfortranarray((np.arange(8, dtype=np.float64) + 100 * rank).reshape(2, 4))
    reference(comm, root, f"ref-st-{scheme}.bin", disp, tile, data)
    with File.open(comm, f"sl-st-{scheme}.bin", MPI.MODE_CREATE | MPI.MODE_RDWR, server=addr, scheme=scheme) as f:
        f.set_view(disp, MPI.DOUBLE, tile)
        f.write_at_all(0, data)
        back = np.asfortranarray(np.zeros((2, 4)))
        f.read_at_all(0, back)
        assert everywhere(comm, np.array_equal(back, data))
    assert same_file(comm, root, f"ref-st-{scheme}.bin", f"sl-st-{scheme}.bin"), "a struct view, a Fortran-order buffer: the same bytes as OpenMPI"
    with pytest.raises(ValueError):
        File.open(comm, f"sl-st-{scheme}.bin", MPI.MODE_RDONLY, server=addr, scheme=scheme).read_at(0, np.zeros((4, 4))[:, ::2])


def test_pack_flattening_handles_negative_and_large_lower_bounds():
    from sluice.mpi import _pack_offsets

    neg = MPI.Datatype.Create_struct([1, 1], [-16, 8], [MPI.INT, MPI.DOUBLE]).Commit()
    assert _pack_offsets(neg).tolist() == [-16, -15, -14, -13] + list(range(8, 16))
    far = MPI.Datatype.Create_struct([1], [800], [MPI.BYTE]).Commit()
    assert _pack_offsets(far).tolist() == [800], "a lower bound past the extent packs one instance"


def test_constructor_flattening_agrees_with_mpi_pack():
    from sluice.mpi import _coalesce, _pack_offsets, _runs_of_type, runs_of

    types = [
        MPI.DOUBLE.Create_subarray([4, 6, 5], [2, 3, 5], [1, 2, 0]).Commit(),
        MPI.DOUBLE.Create_subarray([4, 6, 5], [2, 3, 2], [1, 2, 3], order=MPI.ORDER_FORTRAN).Commit(),
        MPI.INT.Create_vector(3, 2, 5).Commit(),
        MPI.INT.Create_indexed([2, 1], [0, 5]).Commit(),
        MPI.INT.Create_hvector(2, 1, 12).Commit(),
        MPI.INT.Create_resized(0, 16).Commit(),
        MPI.INT.Create_indexed_block(2, [0, 4]).Commit(),
        MPI.INT.Create_vector(2, 1, 3).Create_vector(2, 1, 2).Commit(),
        MPI.DOUBLE.Create_vector(2, 2, 3).Create_subarray([3, 2], [2, 1], [1, 1]).Commit(),
        # Subarrays of a contiguous base go row by row; of a base with
        # holes (resized), element by element.
        MPI.DOUBLE.Create_subarray([10], [3], [4]).Commit(),
        MPI.BYTE.Create_subarray([3, 4, 5, 6], [2, 2, 3, 4], [1, 0, 2, 1]).Commit(),
        MPI.BYTE.Create_subarray([3, 4, 5, 6], [2, 4, 5, 6], [1, 0, 0, 0], order=MPI.ORDER_FORTRAN).Commit(),
        MPI.DOUBLE.Create_contiguous(2).Create_subarray([4, 3], [2, 2], [2, 1]).Commit(),
        MPI.INT.Create_resized(0, 8).Create_subarray([4, 3], [2, 2], [1, 1]).Commit(),
    ]
    for t in types:
        got, want = _coalesce(*_runs_of_type(t)), runs_of(_pack_offsets(t))
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), t.decode()[1]
