"""A 3-D heat equation on a periodic box, BLOCK-distributed over MPI ranks
(slabs of the first dimension, halos exchanged with the neighbours), with
periodic output and checkpoint/restart through sluice (one server, or a
cluster's metadata address: the output is then spread over its data
servers).

    mpirun -np 4 python examples/heat.py --server unix:/tmp/s.sock --out run/heat \\
        --n 32 --steps 40 --output-every 10 --checkpoint-every 20 [--restart]

Every ``--output-every`` steps the temperature goes to ``OUT/temp`` as one
step of a Zarr v3 array with a time dimension (``xarray.open_zarr(OUT)``);
every ``--checkpoint-every`` steps the state goes to ``OUT/checkpoint``.
``--restart`` continues from the latest checkpoint, and gives the same
numbers as a run that never stopped: the update is deterministic. The
total heat is printed at the end (it is conserved). ``--kill-at STEP``
ends every rank abruptly (``os._exit``) at that step, to try restarting.
"""

import argparse
import os

import numpy as np
from mpi4py import MPI

import sluice
from sluice.array import Array, ArrayGroup

ALPHA = 0.1  # diffusion number, below 1/6 for stability


def initial(n: int, lo: int, hi: int) -> np.ndarray:
    """The initial temperature of rows lo..hi: a hot cube in a cold box."""
    z, y, x = np.meshgrid(np.arange(lo, hi), np.arange(n), np.arange(n), indexing="ij")
    hot = (abs(z - n // 2) < n // 4) & (abs(y - n // 2) < n // 4) & (abs(x - n // 3) < n // 4)
    return np.where(hot, 100.0, 0.0)


def step(comm: MPI.Comm, t: np.ndarray) -> np.ndarray:
    """One explicit step; the first dimension's halos come from the
    neighbouring ranks (periodic)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    up, down = (rank - 1) % size, (rank + 1) % size
    below = np.empty_like(t[0])
    above = np.empty_like(t[-1])
    comm.Sendrecv(np.ascontiguousarray(t[-1]), dest=down, recvbuf=below, source=up)
    comm.Sendrecv(np.ascontiguousarray(t[0]), dest=up, recvbuf=above, source=down)
    padded = np.concatenate([below[None], t, above[None]])
    lap = (padded[:-2] + padded[2:] - 2 * t
           + np.roll(t, 1, 1) + np.roll(t, -1, 1) - 2 * t
           + np.roll(t, 1, 2) + np.roll(t, -1, 2) - 2 * t)
    return t + ALPHA * lap


def main(argv=None) -> np.ndarray:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default=os.environ.get("SLUICE_SERVER"))
    p.add_argument("--out", default="run/heat")
    p.add_argument("--n", type=int, default=32)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--output-every", type=int, default=10)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--restart", action="store_true")
    p.add_argument("--kill-at", type=int, default=None)
    a = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if a.n % size:
        raise SystemExit(f"--n {a.n} must be a multiple of the {size} ranks")
    client = sluice.Client(a.server, client_id=rank)
    temp = Array("temp", (a.n, a.n, a.n), "float64", memory=["block", "*", "*"], disk=(a.n // 2, a.n, a.n), dims=["z", "y", "x"])
    group = ArrayGroup(a.out, [temp], comm, client)
    rows = a.n // size
    if a.restart:
        first, blocks = group.restart()
        t = blocks["temp"]
        if rank == 0:
            print(f"restarted from the checkpoint of step {first}", flush=True)
    else:
        first, t = 0, initial(a.n, rank * rows, (rank + 1) * rows)
        group.timestep(0, {"temp": t})
    for s in range(first + 1, a.steps + 1):
        t = step(comm, t)
        if a.kill_at is not None and s == a.kill_at:
            os._exit(9)
        if s % a.output_every == 0:
            group.timestep(s // a.output_every, {"temp": t})
        if s % a.checkpoint_every == 0:
            group.checkpoint(s, {"temp": t})
    heat = comm.allreduce(float(t.sum()), op=MPI.SUM)
    if rank == 0:
        print(f"step {a.steps}: total heat {heat:.6f}", flush=True)
    return t


if __name__ == "__main__":
    main()
