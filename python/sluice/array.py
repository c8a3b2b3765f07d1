"""Distributed arrays as Zarr v3, written and read collectively by MPI ranks
(Panda on sluice; docs/arrays.md).

Every rank holds its block of the array as a C-ordered numpy array, as an
HPF distribution over a process grid says (``block``, ``cyclic``, ``gen_block(B0:B1:...)``,
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
without groups. ``strategy="two-phase"`` builds each file whole in the
memory of one rank (the one holding most of it) after an exchange between
ranks (``Alltoallv``), and writes it with one call (a read: the file read
whole, then the exchange): the choice when the chunks cut the blocks into
short runs, which the other two send piece by piece. It holds one file
and the rank's exchange (at most ``EXCHANGE_BYTES_MAX`` each way) in
memory.

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

import numpy as np
from mpi4py import MPI

from ._sluice import ArrayPlan, Client, group_base
from .mpi import _raise_any

__all__ = ["write", "read", "local_shape", "ArrayPlan", "Array", "ArrayGroup"]

STRATEGIES = ("server-directed", "independent", "two-phase")
#: MPI counts are C ints: a two-phase exchange moves at most this many bytes
#: to or from one rank in one call (larger arrays: another strategy, or
#: several calls on parts of the array).
EXCHANGE_BYTES_MAX = 2**31 - 1


def local_shape(shape, grid, dist, rank: int) -> tuple:
    """The shape of ``rank``'s block under the distribution."""
    return tuple(ArrayPlan.local_shape_of(list(shape), list(grid), list(dist), rank))


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
    `sluice array migrate` leaves (docs/arrays.md): from the root down, the
    first zarr.json at or above ``path`` that says where its data went. A
    mark to another server is an error naming it (this client is connected
    to one)."""
    for _ in range(RESOLVE_HOPS_MAX):
        parts = [p for p in path.split("/") if p]
        moved = False
        for n in range(len(parts) + 1):
            node = "/".join(parts[:n])
            meta = f"{node}/zarr.json" if node else "zarr.json"
            if not _exists(client, meta):
                continue
            mark = json.loads(_get(client, meta)).get("attributes", {}).get(MIGRATED_ATTRIBUTE)
            if mark is None:
                continue
            rest = "/".join(parts[n:])
            target = "/".join(p for p in (mark["path"].strip("/"), rest) if p)
            if mark.get("server"):
                raise OSError(errno.EXDEV, f"{path} was migrated to another server: {mark['server']}:{target}; read it through a client connected there")
            path, moved = target, True
            break
        if not moved:
            meta = f"{path}/zarr.json"
            if not _exists(client, meta):
                raise FileNotFoundError(errno.ENOENT, f"{path}: no zarr.json", path)
            return path, _get(client, meta)
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


def _two_phase(comm: MPI.Comm, client: Client, plan: ArrayPlan, path: str, rank: int, local: np.ndarray, write: bool, time=None) -> None:
    """Move ``local`` to (``write``) or from the array's files by two-phase
    (see the module docs); raises on every rank if any failed."""
    counts = [None]

    def count():
        to, frm = plan.two_phase_counts(rank)
        if not write:
            to, frm = frm, to
        if sum(to) > EXCHANGE_BYTES_MAX or sum(frm) > EXCHANGE_BYTES_MAX:
            raise ValueError(f"rank {rank}'s two-phase exchange ({sum(to)} bytes out, {sum(frm)} in) is over "
                             f"{EXCHANGE_BYTES_MAX} bytes: use another strategy, or write the array in parts")
        counts[0] = (to, frm)

    _raise_any(comm, _attempt(count))
    to, frm = counts[0]
    send, recv = np.empty(sum(to), np.uint8), np.empty(sum(frm), np.uint8)
    if write:
        _raise_any(comm, _attempt(lambda: plan.two_phase_pack(rank, local, send)))
    else:
        _raise_any(comm, _attempt(lambda: plan.two_phase_read(client, path, rank, send, time)))
    comm.Alltoallv([send, to], [recv, frm])
    if write:
        _raise_any(comm, _attempt(lambda: plan.two_phase_write(client, path, rank, recv, time)))
    else:
        _raise_any(comm, _attempt(lambda: plan.two_phase_unpack(rank, recv, local)))


def _little(dtype) -> np.dtype:
    """``dtype`` in little-endian byte order (the bytes codec's), a type
    without one (bool, int8) as it is."""
    return np.dtype(dtype).newbyteorder("<")


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
    # One element type on every rank, checked before any rank plans: each
    # rank planned with its own, so a float32 block among float64 ones was
    # written at the others' offsets as garbage (server-directed,
    # independent) or failed on its rank alone, the others left waiting in
    # Alltoallv for ever (two-phase).
    names = comm.allgather(np.dtype(local.dtype).name)
    if len(set(names)) > 1:
        ranks_of = {}
        for r, n in enumerate(names):
            ranks_of.setdefault(n, []).append(r)
        raise ValueError("the ranks' blocks differ in element type (" + "; ".join(f"{n} on ranks {rs}" for n, rs in ranks_of.items())
                         + "): every rank passes the array's one dtype")
    plan = ArrayPlan(list(shape), np.dtype(local.dtype).name, list(chunks), list(grid), list(dist),
                     list(shards) if shards is not None else None)
    if plan.ranks != comm.Get_size():
        raise ValueError(f"the grid {tuple(grid)} has {plan.ranks} ranks, the communicator {comm.Get_size()}")

    def check():
        # On every rank, then raised on every rank: a block of the wrong
        # shape on one rank left the others waiting for ever.
        if tuple(local.shape) != tuple(plan.local_shape(rank)):
            raise ValueError(f"rank {rank}'s block has shape {local.shape}, the distribution gives {tuple(plan.local_shape(rank))}")

    _raise_any(comm, _attempt(check))
    # Zarr's bytes codec here says little-endian: a block in another byte
    # order is converted, not stored as it is (a big-endian block read back
    # as 3e-319 and the like, through sluice and zarr-python alike).
    local = np.ascontiguousarray(local, dtype=_little(local.dtype))
    dims = dims or [f"dim_{i}" for i in range(len(shape))]
    _raise_any(comm, _attempt(lambda: _create(client, path, plan, dims, attrs or {})) if rank == 0 else None)
    if strategy == "two-phase":
        _two_phase(comm, client, plan, path, rank, local, True)
        return local.nbytes
    _raise_any(comm, _attempt(lambda: plan.prepare(client, path, rank)))
    base = comm.bcast(group_base() if rank == 0 else None, root=0) if strategy == "server-directed" else None
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
    # Shards another Zarr writer laid out otherwise are refused, not read.
    _raise_any(comm, _attempt(lambda: plan.check_shard_indexes(client, path)) if rank == 0 else None)
    if plan.ranks != comm.Get_size():
        raise ValueError(f"the grid {tuple(grid)} has {plan.ranks} ranks, the communicator {comm.Get_size()}")
    local = np.empty(plan.local_shape(rank), dtype=np.dtype(plan.dtype))
    if strategy == "two-phase":
        _two_phase(comm, client, plan, path, rank, local, False)
        return local
    base = comm.bcast(group_base() if rank == 0 else None, root=0) if strategy == "server-directed" else None
    _raise_any(comm, _attempt(lambda: plan.transfer(client, path, rank, local, False, base, wait_ms)))
    return local


# -- The Panda API: arrays of a simulation, timesteps, checkpoints ---------

#: The pointer to the latest complete checkpoint, under an ArrayGroup.
CHECKPOINT_LATEST = "checkpoint/latest.json"


class Array:
    """One array of an :class:`ArrayGroup`: its name, global shape (without
    time), element type, how the ranks hold it in memory (an HPF
    distribution per dimension over the group's process grid:
    ``block``, ``cyclic``, ``cyclic(K)`` or ``*``) and how it lies on disk
    (Zarr v3 chunks, optionally grouped in shards)."""

    def __init__(self, name: str, shape, dtype="float64", memory=None, disk=None, shards=None, dims=None):
        if not name or "/" in name:
            raise ValueError(f"array name {name!r}: a non-empty name without '/'")
        self.name, self.shape, self.dtype = name, tuple(int(n) for n in shape), _little(np.dtype(dtype))
        self.memory = list(memory) if memory is not None else ["block"] + ["*"] * (len(self.shape) - 1)
        self.disk = tuple(disk) if disk is not None else self.shape
        self.shards = tuple(shards) if shards is not None else None
        self.dims = list(dims) if dims is not None else [f"dim_{i}" for i in range(len(self.shape))]
        if not (len(self.memory) == len(self.disk) == len(self.dims) == len(self.shape)):
            raise ValueError(f"array {name}: shape, memory, disk and dims need one entry per dimension")


class ArrayGroup:
    """The arrays of one simulation on a sluice server, Panda's ``ArrayGroup``.

    - :meth:`timestep` appends the arrays' values at a step: each array is
      stored at ``NAME/ARRAY`` as one Zarr v3 array with a leading ``time``
      dimension chunked one step deep, so ``xarray.open_zarr(NAME)`` is a
      Dataset with a time dimension, and the step is written collectively
      (by ``strategy``) from every rank's block.
    - :meth:`read` gives every rank its blocks of a step back.
    - :meth:`checkpoint` stores the arrays' current values under
      ``NAME/checkpoint/sSTEP`` (the step zero-padded to ten digits) and
      then, atomically (write and rename), the pointer
      ``NAME/checkpoint/latest.json``: a crash during a checkpoint leaves
      the previous one in force. :meth:`restart` reads the latest.

    ``grid`` is the process grid (default: every rank on the first
    dimension); every array's memory distribution is over it.
    ``strategy`` is how every collective call moves the data:
    ``"server-directed"`` (the default), ``"independent"`` or
    ``"two-phase"``, as for :func:`write`."""

    def __init__(self, name: str, arrays, comm: MPI.Comm, client: Client, grid=None, strategy: str = "server-directed"):
        _check(strategy)
        self.name, self.comm, self.client, self.strategy = name.strip("/"), comm, client, strategy
        self.arrays = {a.name: a for a in arrays}
        if len(self.arrays) != len(arrays):
            raise ValueError("two arrays with one name")
        self.grids = {}
        for a in arrays:
            g = list(grid) if grid is not None else [comm.Get_size()] + [1] * (len(a.shape) - 1)
            if len(g) != len(a.shape):
                raise ValueError(f"array {a.name}: the grid {tuple(g)} has {len(g)} dimensions, the array {len(a.shape)}")
            self.grids[a.name] = g

    def local_shape(self, name: str) -> tuple:
        """This rank's block shape of array ``name``."""
        a = self.arrays[name]
        return local_shape(a.shape, self.grids[name], a.memory, self.comm.Get_rank())

    def _step_plan(self, a: Array) -> ArrayPlan:
        shards = (1,) + a.shards if a.shards is not None else None
        return ArrayPlan([1, *a.shape], a.dtype.name, [1, *a.disk], [1, *self.grids[a.name]], ["*", *a.memory],
                         list(shards) if shards else None)

    def _base(self):
        rank = self.comm.Get_rank()
        return self.comm.bcast(group_base() if rank == 0 else None, root=0) if self.strategy == "server-directed" else None

    def _steps_on_disk(self, path: str) -> int:
        return int(json.loads(_get(self.client, f"{path}/zarr.json"))["shape"][0]) if _exists(self.client, f"{path}/zarr.json") else 0

    def timestep(self, step: int, data: dict) -> int:
        """Collective: write every array's value at ``step`` (``data`` maps
        each array name to this rank's block). Returns the bytes this rank
        moved."""
        rank, moved = self.comm.Get_rank(), 0
        blocks = {}

        def check():
            # On every rank, then raised on every rank: a rank-local
            # mistake must not leave the others waiting.
            if step < 0:
                raise ValueError(f"step {step}: a step is >= 0")
            if set(data) != set(self.arrays):
                raise ValueError(f"timestep needs every array of the group: {sorted(self.arrays)}, got {sorted(data)}")
            for name, a in self.arrays.items():
                local = np.ascontiguousarray(data[name], dtype=a.dtype)
                if tuple(local.shape) != self.local_shape(name):
                    raise ValueError(f"{name}: rank {rank}'s block has shape {local.shape}, the distribution gives {self.local_shape(name)}")
                blocks[name] = local

        _raise_any(self.comm, _attempt(check))
        for name, a in self.arrays.items():
            local = blocks[name]
            plan, path = self._step_plan(a), f"{self.name}/{name}"

            def meta():
                # The array's metadata, its time axis grown to hold `step`.
                steps = self._steps_on_disk(path)
                if steps == 0:
                    _create(self.client, path, plan, ["time", *a.dims], {})
                m = json.loads(plan.zarr_json(["time", *a.dims], "{}"))
                m["shape"][0] = max(steps, step + 1)
                _put(self.client, f"{path}/zarr.json", json.dumps(m, indent=2))
                for d in plan.unit_dirs(step):
                    _mkdir_p(self.client, f"{path}/{d}")

            _raise_any(self.comm, _attempt(meta) if rank == 0 else None)
            block = local.reshape((1, *local.shape))
            if self.strategy == "two-phase":
                _two_phase(self.comm, self.client, plan, path, rank, block, True, step)
                moved += block.nbytes
                continue
            _raise_any(self.comm, _attempt(lambda: plan.prepare(self.client, path, rank, step)))
            base, n = self._base(), [0]
            _raise_any(self.comm, _attempt(lambda: n.__setitem__(0, plan.transfer(self.client, path, rank, block, True, base, 30_000, step))))
            moved += n[0]
        return moved

    def read(self, step: int, names=None) -> dict:
        """Collective: this rank's blocks of the arrays (all, or ``names``)
        at ``step``, under the group's distributions. Steps never written
        read as the fill value (0)."""
        rank, out = self.comm.Get_rank(), {}
        for name in names or list(self.arrays):
            a = self.arrays[name]
            # Where the array is now (a migrated group is read where it
            # went), and its steps on disk.
            found = [None]

            def where(name=name):
                p, text = _resolve(self.client, f"{self.name}/{name}")
                found[0] = (p, int(json.loads(text)["shape"][0]))

            _raise_any(self.comm, _attempt(where) if rank == 0 else None)
            path, on_disk = self.comm.bcast(found[0], root=0)
            if not 0 <= step < on_disk:
                raise IndexError(f"{path}: no step {step} ({on_disk} steps on disk)")
            plan = self._step_plan(a)
            # A step inside the time axis that was never written has no
            # files: Zarr's missing chunks, the fill value (0).
            written = [True]
            _raise_any(self.comm, _attempt(lambda: written.__setitem__(0, _exists(self.client, f"{path}/c/{step}"))) if rank == 0 else None)
            if not self.comm.bcast(written[0], root=0):
                out[name] = np.zeros(self.local_shape(name), dtype=a.dtype)
                continue
            block = np.empty((1, *self.local_shape(name)), dtype=a.dtype)
            if self.strategy == "two-phase":
                _two_phase(self.comm, self.client, plan, path, rank, block, False, step)
            else:
                base = self._base()
                _raise_any(self.comm, _attempt(lambda: plan.transfer(self.client, path, rank, block, False, base, 30_000, step)))
            out[name] = block[0]
        return out

    def checkpoint(self, step: int, data: dict) -> None:
        """Collective: store ``data`` (every array's block on this rank) as
        the checkpoint of ``step``, then make it the latest."""
        def check():
            if set(data) != set(self.arrays):
                raise ValueError(f"a checkpoint needs every array of the group: {sorted(self.arrays)}")

        _raise_any(self.comm, _attempt(check))
        where = f"{self.name}/checkpoint/s{step:010d}"
        for name, a in self.arrays.items():
            write(self.comm, self.client, f"{where}/{name}", np.ascontiguousarray(data[name], dtype=a.dtype), shape=a.shape,
                  chunks=a.disk, grid=self.grids[name], dist=a.memory, shards=a.shards, dims=a.dims, strategy=self.strategy)
        self.comm.Barrier()

        def point():
            tmp = f"{self.name}/checkpoint/.latest.json.new"
            _put(self.client, tmp, json.dumps({"step": step, "path": where}))
            self.client.rename(tmp, f"{self.name}/{CHECKPOINT_LATEST}")

        _raise_any(self.comm, _attempt(point) if self.comm.Get_rank() == 0 else None)

    def restart(self) -> tuple:
        """Collective: ``(step, blocks)`` of the latest complete checkpoint,
        every array's block on this rank; ``FileNotFoundError`` when there
        is none."""
        found = [None]
        rank = self.comm.Get_rank()
        _raise_any(self.comm, _attempt(lambda: found.__setitem__(0, json.loads(_get(self.client, f"{self.name}/{CHECKPOINT_LATEST}")))) if rank == 0 else None)
        latest = self.comm.bcast(found[0], root=0)
        blocks = {name: read(self.comm, self.client, f"{latest['path']}/{name}", grid=self.grids[name], dist=a.memory, strategy=self.strategy)
                  for name, a in self.arrays.items()}
        return int(latest["step"]), blocks
