"""A 4-rank MPI-IO program for the transparent-path tests.

Each rank sets a strided file view over a shared file (block i of 4 KiB
belongs to rank i mod size: the seed's decomposition as an MPI datatype),
writes its blocks collectively (Write_at_all), reads them back collectively
(Read_at_all) and checks every byte. Rank 0 then re-reads the whole file
independently and checks the interleaving. Prints "OK <bytes>" on rank 0.
Usage: mpirun -np 4 python3 collective.py PATH [BLOCKS_PER_RANK]
"""
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
path = sys.argv[1]
blocks = int(sys.argv[2]) if len(sys.argv) > 2 else 64
block = 4096

mine = bytearray(blocks * block)
for k in range(blocks):
    mine[k * block:(k + 1) * block] = bytes([(k * size + rank) % 251]) * block

filetype = MPI.BYTE.Create_vector(blocks, block, block * size).Commit()
fh = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_RDWR)
fh.Set_view(rank * block, MPI.BYTE, filetype)
fh.Write_at_all(0, mine)
fh.Sync()
comm.Barrier()
back = bytearray(len(mine))
fh.Read_at_all(0, back)
fh.Close()
assert mine == back, f"rank {rank}: collective read differs"
comm.Barrier()
if rank == 0:
    whole = bytearray(blocks * block * size)
    fh = MPI.File.Open(MPI.COMM_SELF, path, MPI.MODE_RDONLY)
    fh.Read_at(0, whole)
    fh.Close()
    expect = b"".join(bytes([i % 251]) * block for i in range(blocks * size))
    assert whole == expect, "the file does not hold the interleaved blocks"
    print("OK", len(whole))
