"""sluice from Python.

``sluice.Client`` talks to a sluice server (``sluice serve``): open files,
read into and write from numpy arrays (any buffer) without copies through
Python objects, list I/O. ``sluice.mpi`` gives mpi4py programs MPI-IO
semantics over it, with collective aggregation; ``sluice.array`` writes and
reads distributed arrays as Zarr v3, server-directed (Panda).

>>> import numpy as np, os, sluice
>>> c = sluice.Client("unix:/tmp/sluice.sock", app="analysis")   # doctest: +SKIP
>>> fd = c.open("data.bin", os.O_CREAT | os.O_RDWR)              # doctest: +SKIP
>>> c.pwrite(fd, np.arange(1024, dtype=np.float64), 0)           # doctest: +SKIP
8192
"""

from ._sluice import Client

__all__ = ["Client"]
