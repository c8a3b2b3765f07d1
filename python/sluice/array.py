"""Distributed arrays as Zarr v3, written and read collectively by MPI ranks
(Panda on sluice; docs/arrays.md).

Every rank holds its block of the array as a C-ordered numpy array, as an
HPF distribution over a process grid says (``block``, ``cyclic``,
``cyclic(K)`` or ``*`` per dimension). ``write`` stores the whole array on
a sluice server as a Zarr v3 array (chunks, optionally shards) that
zarr-python and xarray open without sluice; ``read`` gives every rank its
block back, under any distribution.

With ``strategy="server-directed"`` (the default) each rank sends its
pieces of each file as list I/O tagged with a group, and the server holds
the group until every rank's pieces have come, then writes (or reads) the
file in disk order as one application's work. If a rank never comes, the
others get ``OSError(ETIMEDOUT)`` after ``wait_ms`` and nothing of that
group is written. ``strategy="independent"`` sends the same list I/O
without groups.

>>> from mpi4py import MPI                                             # doctest: +SKIP
>>> import numpy as np, sluice, sluice.array                          # doctest: +SKIP
>>> c = sluice.Client("unix:/tmp/s.sock", client_id=MPI.COMM_WORLD.rank)  # doctest: +SKIP
>>> local = np.full(sluice.array.local_shape((64, 64), (2, 2), ["block", "block"],
...                  MPI.COMM_WORLD.rank), 1.0)                          # doctest: +SKIP
>>> sluice.array.write(MPI.COMM_WORLD, c, "run/t0/temp", local, shape=(64, 64),
...                    chunks=(32, 32), grid=(2, 2), dist=["block", "block"])  # doctest: +SKIP
"""

from __future__ import annotations

import errno
import json
import os
import secrets

import numpy as np
from mpi4py import MPI

from ._sluice import ArrayPlan, Client
from .mpi import _raise_any

__all__ = ["write", "read", "local_shape", "ArrayPlan"]

STRATEGIES = ("server-directed", "independent")


def local_shape(shape, grid, dist, rank: int) -> tuple:
    """The shape of ``rank``'s block under the distribution."""
    plan = ArrayPlan(list(shape), "uint8", list(shape), list(grid), list(dist))
    return tuple(plan.local_shape(rank))


def _mkdir_p(client: Client, path: str) -> None:
    parts = [p for p in path.split("/") if p]
    for i in range(1, len(parts) + 1):
        try:
            client.mkdir("/".join(parts[:i]))
        except OSError as e:
            if e.errno != errno.EEXIST:
                raise


def _put(client: Client, path: str, text: str) -> None:
    fd = client.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        client.pwrite(fd, text.encode(), 0)
    finally:
        client.close(fd)


def _get(client: Client, path: str) -> str:
    fd = client.open(path, os.O_RDONLY)
    try:
        buf = bytearray(client.size(fd))
        client.pread(fd, buf, 0)
    finally:
        client.close(fd)
    return buf.decode()


def _exists(client: Client, path: str) -> bool:
    try:
        client.close(client.open(path, os.O_RDONLY))
        return True
    except OSError as e:
        if e.errno == errno.ENOENT:
            return False
        raise


MIGRATED_ATTRIBUTE = "sluice_migrated"
RESOLVE_HOPS_MAX = 8


def _resolve(client: Client, path: str) -> tuple:
    """(path, zarr.json text) of the array at ``path``, following the marks
    `sluice array migrate` leaves (docs/arrays.md): the nearest zarr.json
    at or above ``path`` that says where its data went. A mark to another
    server is an error naming it (this client is connected to one)."""
    for _ in range(RESOLVE_HOPS_MAX):
        parts = [p for p in path.split("/") if p]
        for n in range(len(parts), -1, -1):
            node = "/".join(parts[:n])
            meta = f"{node}/zarr.json" if node else "zarr.json"
            if not _exists(client, meta):
                continue
            text = _get(client, meta)
            mark = json.loads(text).get("attributes", {}).get(MIGRATED_ATTRIBUTE)
            if mark is None:
                if n != len(parts):
                    raise FileNotFoundError(errno.ENOENT, f"{path}: no zarr.json", path)
                return path, text
            rest = "/".join(parts[n:])
            target = "/".join(p for p in (mark["path"].strip("/"), rest) if p)
            if mark.get("server"):
                raise OSError(errno.EXDEV, f"{path} was migrated to another server: {mark['server']}:{target}; read it through a client connected there")
            path = target
            break
        else:
            raise FileNotFoundError(errno.ENOENT, f"{path}: no zarr.json", path)
    raise OSError(errno.ELOOP, f"{path}: more than {RESOLVE_HOPS_MAX} migration marks")


def _create(client: Client, path: str, plan: ArrayPlan, dims, attrs) -> None:
    """Group metadata above the array where missing, the array's
    zarr.json, and the directories of its files (rank 0)."""
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts)):
        group = "/".join(parts[:depth])
        key = f"{group}/zarr.json" if group else "zarr.json"
        if not _exists(client, key):
            if group:
                _mkdir_p(client, group)
            _put(client, key, json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    _mkdir_p(client, path)
    _put(client, f"{path}/zarr.json", plan.zarr_json(list(dims), json.dumps(attrs)))
    for d in plan.unit_dirs():
        _mkdir_p(client, f"{path}/{d}")


def _check(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"{strategy!r} is not a strategy ({', '.join(STRATEGIES)})")


def _attempt(f) -> BaseException | None:
    try:
        f()
        return None
    except Exception as e:  # noqa: BLE001 - re-raised on every rank by _raise_any
        return e


def write(
    comm: MPI.Comm,
    client: Client,
    path: str,
    local: np.ndarray,
    *,
    shape,
    chunks,
    grid,
    dist,
    shards=None,
    dims=None,
    attrs=None,
    strategy: str = "server-directed",
    wait_ms: int = 30_000,
) -> int:
    """Collective: store the array whose block on this rank is ``local``
    at ``path`` on the server. Every rank passes the same description.
    Returns the bytes this rank moved; raises on every rank if any failed."""
    _check(strategy)
    path = path.strip("/")
    rank = comm.Get_rank()
    plan = ArrayPlan(list(shape), np.dtype(local.dtype).name, list(chunks), list(grid), list(dist),
                     list(shards) if shards is not None else None)
    if plan.ranks != comm.Get_size():
        raise ValueError(f"the grid {tuple(grid)} has {plan.ranks} ranks, the communicator {comm.Get_size()}")
    if tuple(local.shape) != tuple(plan.local_shape(rank)):
        raise ValueError(f"rank {rank}'s block has shape {local.shape}, the distribution gives {tuple(plan.local_shape(rank))}")
    local = np.ascontiguousarray(local)
    dims = dims or [f"dim_{i}" for i in range(len(shape))]
    _raise_any(comm, _attempt(lambda: _create(client, path, plan, dims, attrs or {})) if rank == 0 else None)
    _raise_any(comm, _attempt(lambda: plan.prepare(client, path, rank)))
    base = comm.bcast(secrets.randbits(63) if rank == 0 else None, root=0) if strategy == "server-directed" else None
    moved = [0]
    _raise_any(comm, _attempt(lambda: moved.__setitem__(0, plan.transfer(client, path, rank, local, True, base, wait_ms))))
    return moved[0]


def read(
    comm: MPI.Comm,
    client: Client,
    path: str,
    *,
    grid,
    dist,
    strategy: str = "server-directed",
    wait_ms: int = 30_000,
) -> np.ndarray:
    """Collective: this rank's block of the array at ``path`` under the
    distribution (any distribution, not only the one it was written with)."""
    _check(strategy)
    path = path.strip("/")
    rank = comm.Get_rank()
    found = [None]
    _raise_any(comm, _attempt(lambda: found.__setitem__(0, _resolve(client, path))) if rank == 0 else None)
    path, text = comm.bcast(found[0], root=0)
    plan = ArrayPlan.from_zarr_json(text, list(grid), list(dist))
    if plan.ranks != comm.Get_size():
        raise ValueError(f"the grid {tuple(grid)} has {plan.ranks} ranks, the communicator {comm.Get_size()}")
    local = np.empty(plan.local_shape(rank), dtype=np.dtype(plan.dtype))
    base = comm.bcast(secrets.randbits(63) if rank == 0 else None, root=0) if strategy == "server-directed" else None
    _raise_any(comm, _attempt(lambda: plan.transfer(client, path, rank, local, False, base, wait_ms)))
    return local
