# A small checkpoint-and-restart job: 4 ranks write their strided 64 KiB
# blocks of a shared file with MPI-IO collective writes, compute a little,
# then each rank reads its neighbour's blocks back with POSIX reads.
import os, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
block, segments = 64 << 10, 8
path = "/tmp/dgen/ckpt.dat"
buf = bytearray((rank + 1) % 256 for _ in range(block))
fh = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_WRONLY)
for s in range(segments):
    fh.Write_at_all((s * size + rank) * block, buf)
fh.Close()
comm.Barrier()
time.sleep(0.05 * (rank + 1))  # "compute"
peer = (rank + 1) % size
with open(path, "rb", buffering=0) as f:
    for s in range(segments):
        f.seek((s * size + peer) * block)
        assert len(f.read(block)) == block
comm.Barrier()
