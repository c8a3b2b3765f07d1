"""sluice.array.write with blocks of different element types on the ranks
(mpirun -np 4): a ValueError on every rank naming them, nothing written.
Before, each rank planned with its own dtype: a float32 block among float64
ones was stored as garbage (its 3.0s read back as 32.00000048), and under
two-phase its rank failed alone in Alltoallv, the others waiting for ever
(so two-phase is not parametrized here: before the fix it hangs)."""

import os

import numpy as np
import pytest

sa = pytest.importorskip("sluice.array")

import sluice  # noqa: E402


@pytest.fixture
def client(server, comm):
    return sluice.Client(server[0], app="array-test", client_id=comm.Get_rank())


@pytest.mark.parametrize("strategy", ["server-directed", "independent"])
def test_blocks_of_different_dtypes_fail_every_rank_before_writing(server, comm, client, strategy):
    n, rank = comm.Get_size(), comm.Get_rank()
    if n < 2:
        pytest.skip("needs two ranks or more")
    addr, root = server
    local = np.full((4, 8), rank + 1.0)
    if rank == n // 2:
        local = local.astype(np.float32)
    path = f"mpi/dtype-mismatch-{strategy}"
    with pytest.raises(ValueError, match=r"differ in element type \(float64 on ranks .*; float32 on ranks \[%d\]\)" % (n // 2)):
        sa.write(comm, client, path, local, shape=(4 * n, 8), chunks=(4, 8), grid=(n, 1), dist=["block", "*"],
                 strategy=strategy, wait_ms=5000)
    comm.Barrier()
    assert not os.path.exists(os.path.join(root, path, "zarr.json")), "nothing written"


def test_byte_order_alone_is_no_mismatch(server, comm, client):
    # '>f8' on one rank, '<f8' on the others: one element type (write
    # stores both little-endian).
    n, rank = comm.Get_size(), comm.Get_rank()
    local = np.full((4, 8), rank + 1.0, dtype=">f8" if rank == 0 else "<f8")
    sa.write(comm, client, "mpi/dtype-byteorder", local, shape=(4 * n, 8), chunks=(4, 8), grid=(n, 1), dist=["block", "*"])
    back = sa.read(comm, client, "mpi/dtype-byteorder", grid=(n, 1), dist=["block", "*"])
    assert np.array_equal(back, np.full((4, 8), rank + 1.0))
