"""MPI-IO semantics over sluice, for mpi4py programs.

A :class:`File` is opened collectively by a communicator's ranks. Each rank
sees the file through a *view* (``set_view(disp, etype, filetype)``, as in
MPI-IO): the bytes of its data stream go, in order, to the bytes the
filetype selects, tiled from ``disp`` on. Filetypes are mpi4py datatypes
(subarray, vector, indexed, ...) or numpy dtypes; they are flattened into
byte runs with MPI's own ``Pack``, so any derived type works as OpenMPI
reads it.

Independent calls (``read_at``/``write_at``, ``read``/``write``) turn a
rank's part into one list request to the server. Collective calls
(``read_at_all``/``write_at_all``, ``read_all``/``write_all``) aggregate:

- ``scheme="two-phase"`` (ROMIO's): the ranks' union range is split evenly
  into one file domain per aggregator; every rank sends each aggregator the
  pieces (and, for writes, the bytes) of its domain (one ``Alltoallv``);
  each aggregator merges them into contiguous runs and moves them with as
  few list requests as it can; reads come back the same way. On a file
  striped over a cluster's data servers the domains follow the stripes
  instead, as Lustre-aware ROMIO's do: one aggregator per data server
  (at most one per rank), aggregator ``d`` taking every stripe of the
  objects ``d``, ``d + A``, ..., so that each talks to its own servers.
- ``scheme="dynamic"`` (dynamic segmentation): the same, with domain
  bounds placed so that each aggregator gets an equal share of the bytes
  actually accessed (sparse or uneven access stays balanced).
- ``scheme="static"`` (static segmentation): each aggregator takes the data
  of its own group of ranks, wherever it lies in the file (no exchange
  across groups).
- ``scheme="server"`` (server-directed, as the arrays' collectives): no
  exchange between ranks; each rank sends its own pieces as list requests
  tagged with a group (its j-th request joins group j), and the server
  holds each group until every rank's part has come, then serves the
  whole group in file order as one application's work, in dispatches as
  large as the scheduler allows. A group that never completes (a rank
  died) fails on every rank with ETIMEDOUT after ``wait_ms``, nothing of
  it done.
- ``scheme="independent"``: no aggregation (each rank's own list request);
  the baseline.

The number of aggregators follows the seed's rule (Chaarawi and Gabriel):
with ``k`` the bytes one aggregator should move per call (the write
saturation size; OMPIO's ``bytes_per_agg`` default, 32 MiB), start from
``ceil(total / k)`` groups of consecutive ranks, then split a group whose
share is above ``k`` and join neighbours whose shares together stay at or
below ``k``. ``File.groups`` reports the last choice.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from ._sluice import Client, group_base

#: Bytes one aggregator moves per collective call before another is added
#: (OMPIO's ``bytes_per_agg`` default).
K_BYTES_DEFAULT = 32 << 20
#: The most of one message of the ``server`` scheme that goes to one data
#: server of a striped file (``sluice_remote``'s ``STRIPED_LIST_BYTES_MAX``):
#: each object's share of a message is one group message.
STRIPED_SHARE_BYTES = 8 << 20

#: Pieces in one list request (the protocol's ``LIST_PIECES_MAX``).
LIST_PIECES_MAX = 4096
#: Bytes in one list request (below the protocol's 64 MiB ``IO_BYTES_MAX``).
LIST_BYTES_MAX = 32 << 20
SCHEMES = ("two-phase", "dynamic", "static", "server", "independent")
#: Bytes in one server-directed list request: the arrays' collective
#: messages' bound, lowered with many ranks so that a group (one message
#: per rank) stays within half the server's default
#: ``collective_bytes_max`` (1 GiB): 16 MiB up to 32 ranks.
SERVER_MESSAGE_BYTES = 16 << 20
SERVER_GROUP_BYTES_MAX = 512 << 20
#: How long the server waits for a group's last rank (milliseconds).
SERVER_WAIT_MS = 30_000


def _pack_offsets(datatype: MPI.Datatype) -> np.ndarray:
    """The byte offsets one instance of ``datatype`` selects, in typemap
    order, found by MPI's own ``Pack`` (works for every constructor, costs
    a pass over the type's span per byte of offset width). The type is
    shifted by ``B`` bytes and resized to its whole span first, so a
    negative lower bound packs from inside the buffer and exactly one
    instance is packed."""
    lb, extent = datatype.Get_extent()
    true_lb, true_extent = datatype.Get_true_extent()
    shift_b = -min(0, lb, true_lb)
    span = shift_b + max(lb + extent, true_lb + true_extent)
    one = MPI.Datatype.Create_struct([1], [shift_b], [datatype]).Create_resized(0, span).Commit()
    size = datatype.Get_size()
    pos = np.arange(span, dtype=np.int64)
    offsets = np.zeros(size, dtype=np.int64)
    shift = 0
    try:
        while True:
            plane = ((pos >> shift) & 0xFF).astype(np.uint8)
            out = np.empty(size, dtype=np.uint8)
            one.Pack(plane, out, 0, MPI.COMM_SELF)
            offsets |= out.astype(np.int64) << shift
            shift += 8
            if span >> shift == 0:
                return offsets - shift_b
    finally:
        one.Free()


def _replicate(base: tuple[np.ndarray, np.ndarray], displacements: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``base``'s runs placed at each byte displacement, in order."""
    o, n = base
    d = np.asarray(displacements, dtype=np.int64)
    return (d[:, None] + o[None, :]).reshape(-1), np.broadcast_to(n, (len(d), len(n))).reshape(-1)


def _blocks(base_dt: MPI.Datatype, base: tuple[np.ndarray, np.ndarray], starts_bytes, blocklengths) -> tuple[np.ndarray, np.ndarray]:
    """Blocks of ``blocklengths[i]`` consecutive base instances from byte
    ``starts_bytes[i]`` (the base tiles at its extent)."""
    _, ext = base_dt.Get_extent()
    disp = [s + j * ext for s, b in zip(starts_bytes, blocklengths) for j in range(b)]
    return _replicate(base, np.array(disp, dtype=np.int64))


def _runs_of_type(dt: MPI.Datatype) -> tuple[np.ndarray, np.ndarray] | None:
    """Runs of one instance of ``dt`` from its constructor (``decode``);
    ``None`` for a constructor this does not know (then MPI packs it)."""
    if dt.is_predefined:
        # One run only where the type has no hole: MPI.SHORT_INT is a
        # short, 2 bytes of padding and an int (6 bytes over 8), which a
        # single 6-byte run put 2 bytes early. Such a type MPI packs.
        true_lb, true_extent = dt.Get_true_extent()
        if true_lb != 0 or true_extent != dt.Get_size():
            return None
        return np.zeros(1, np.int64), np.array([dt.Get_size()], np.int64)
    base_dt, combiner, p = dt.decode()
    if combiner == "STRUCT":
        return None
    base = _runs_of_type(base_dt)
    if base is None:
        return None
    _, ext = base_dt.Get_extent()
    if combiner == "DUP":
        return base
    if combiner == "RESIZED":
        return base
    if combiner == "CONTIGUOUS":
        return _blocks(base_dt, base, [0], [p["count"]])
    if combiner in ("VECTOR", "HVECTOR"):
        stride = p["stride"] * (ext if combiner == "VECTOR" else 1)
        return _blocks(base_dt, base, [i * stride for i in range(p["count"])], [p["blocklength"]] * p["count"])
    if combiner in ("INDEXED", "HINDEXED"):
        unit = ext if combiner == "INDEXED" else 1
        return _blocks(base_dt, base, [d * unit for d in p["displacements"]], p["blocklengths"])
    if combiner in ("INDEXED_BLOCK", "HINDEXED_BLOCK"):
        unit = ext if combiner == "INDEXED_BLOCK" else 1
        return _blocks(base_dt, base, [d * unit for d in p["displacements"]], [p["blocklength"]] * len(p["displacements"]))
    if combiner == "SUBARRAY":
        sizes, subsizes, starts = p["sizes"], p["subsizes"], p["starts"]
        if p["order"] == MPI.ORDER_FORTRAN:
            sizes, subsizes, starts = sizes[::-1], subsizes[::-1], starts[::-1]
        # Element strides (C order), then every element of the sub-block
        # in C order: its offset, the base's runs there.
        strides = np.cumprod([1] + list(sizes[:0:-1]))[::-1]
        if len(base[0]) == 1 and base[0][0] == 0 and base[1][0] == ext:
            # A contiguous base: one run per row of the last dimension
            # (a 128 x 128 x 256 block of doubles is 16,384 runs, not 4 M
            # elements to enumerate and coalesce: 0.1-0.3 s of a 0.15-0.43 s
            # collective write of 128 MiB on 4 ranks).
            rows = [np.arange(st, st + sub, dtype=np.int64) * int(sd) for st, sub, sd in zip(starts[:-1], subsizes[:-1], strides[:-1])]
            heads = np.zeros(1, np.int64)
            for r in rows:
                heads = (heads[:, None] + r[None, :]).reshape(-1)
            heads = (heads + int(starts[-1]) * int(strides[-1])) * ext
            return heads, np.full(len(heads), int(subsizes[-1]) * ext, np.int64)
        grids = np.meshgrid(*[np.arange(st, st + sub, dtype=np.int64) for st, sub in zip(starts, subsizes)], indexing="ij")
        elems = sum(g * int(sd) for g, sd in zip(grids, strides)).reshape(-1)
        return _replicate(base, elems * ext)
    return None


def runs_of(offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Coalesce byte offsets into runs ``(starts, lengths)``, in order."""
    return _coalesce(offsets.astype(np.int64), np.ones(len(offsets), np.int64))


def _coalesce(o: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge runs that touch (in their order)."""
    if len(o) == 0:
        return o.astype(np.int64), n.astype(np.int64)
    touching = o[1:] == o[:-1] + n[:-1]
    heads = np.nonzero(np.concatenate(([True], ~touching)))[0]
    return o[heads].astype(np.int64), np.add.reduceat(n, heads).astype(np.int64)


def choose_groups(shares: list[int], k: int) -> list[list[int]]:
    """Groups of consecutive ranks, each to be served by one aggregator.

    ``shares``: the bytes each rank moves. Start from ``ceil(total / k)``
    groups of equal rank counts; split a group whose bytes exceed ``k``
    (while it has more than one rank); join neighbours whose bytes together
    stay at or below ``k``.
    """
    n, total = len(shares), sum(shares)
    if n == 0:
        return []
    count = min(n, max(1, math.ceil(total / max(k, 1))))
    bounds = [round(i * n / count) for i in range(count + 1)]
    groups = [list(range(bounds[i], bounds[i + 1])) for i in range(count) if bounds[i] < bounds[i + 1]]
    size = lambda g: sum(shares[r] for r in g)  # noqa: E731
    out: list[list[int]] = []
    for g in groups:  # split
        stack = [g]
        while stack:
            h = stack.pop(0)
            if size(h) > k and len(h) > 1:
                stack[:0] = [h[: len(h) // 2], h[len(h) // 2 :]]
            else:
                out.append(h)
    joined = [out[0]]
    for g in out[1:]:  # join
        if size(joined[-1]) + size(g) <= k:
            joined[-1] = joined[-1] + g
        else:
            joined.append(g)
    return joined


@dataclass
class View:
    disp: int
    etype_size: int
    starts: np.ndarray  # runs of one filetype instance, relative
    lengths: np.ndarray
    cum: np.ndarray  # stream bytes before each run
    size: int  # stream bytes per filetype instance
    extent: int

    def file_runs(self, stream_at: int, nbytes: int) -> tuple[np.ndarray, np.ndarray]:
        """The file runs ``(offsets, lengths)`` that stream bytes
        ``[stream_at, stream_at + nbytes)`` go to, in stream order."""
        if nbytes <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        if len(self.lengths) == 1 and self.lengths[0] == self.extent:
            # A contiguous view: one run, however many tiles it spans.
            at = self.disp + int(self.starts[0]) + (stream_at // self.size) * self.extent + stream_at % self.size
            return np.array([at], np.int64), np.array([nbytes], np.int64)
        end = stream_at + nbytes
        first, last = stream_at // self.size, (end - 1) // self.size
        offs, lens = [], []

        def part(tile: int, lo: int, hi: int) -> None:
            """Tile `tile`'s runs covering its stream bytes [lo, hi)."""
            i0 = int(np.searchsorted(self.cum, lo, side="right")) - 1
            i1 = int(np.searchsorted(self.cum, hi, side="left"))
            s = self.starts[i0:i1].copy()
            n = self.lengths[i0:i1].copy()
            front = lo - int(self.cum[i0])
            s[0] += front
            n[0] -= front
            n[-1] -= int(self.cum[i1 - 1] + self.lengths[i1 - 1]) - hi
            offs.append(self.disp + tile * self.extent + s)
            lens.append(n)

        if first == last:
            part(first, stream_at - first * self.size, end - first * self.size)
        else:
            part(first, stream_at - first * self.size, self.size)
            middle = np.arange(first + 1, last, dtype=np.int64)
            if len(middle):
                offs.append((self.disp + middle[:, None] * self.extent + self.starts[None, :]).reshape(-1))
                lens.append(np.broadcast_to(self.lengths, (len(middle), len(self.lengths))).reshape(-1))
            part(last, 0, end - last * self.size)
        o, n = np.concatenate(offs).astype(np.int64), np.concatenate(lens).astype(np.int64)
        # Runs of consecutive tiles may touch: merge them.
        return _coalesce(o, n)


def _as_bytes(buf, writable: bool = False) -> np.ndarray:
    """A buffer's bytes in memory order, as a flat uint8 array (no copy);
    like mpi4py, a buffer without one contiguous layout is refused."""
    a = np.asarray(buf) if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
    if not (a.flags.c_contiguous or a.flags.f_contiguous):
        raise ValueError("the buffer must be contiguous (C or Fortran order)")
    if writable and not a.flags.writeable:
        raise ValueError("the buffer is read-only")
    return a.ravel(order="K").view(np.uint8)


def _merge(offs: np.ndarray, lens: np.ndarray, overlap: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sort pieces by offset and merge touching ones (and, with `overlap`,
    overlapping ones: the union): ``(offsets, lengths, order, run)``,
    ``order`` the sorting permutation of the input pieces and ``run[k]`` the
    merged run that sorted piece ``k`` lies in (with `overlap`; touching
    merges keep every piece whole in its run too)."""
    order = np.argsort(offs, kind="stable")
    o, n = offs[order], lens[order]
    if len(o) == 0:
        return o, n, order, np.zeros(0, np.int64)
    ends = o + n
    if overlap:
        reach = np.maximum.accumulate(ends)
        heads = np.concatenate(([True], o[1:] > reach[:-1]))
    else:
        heads = np.concatenate(([True], o[1:] != ends[:-1]))
    starts = np.nonzero(heads)[0]
    merged_off = o[starts]
    merged_len = (np.maximum.reduceat(ends, starts) - merged_off) if overlap else np.add.reduceat(n, starts)
    return merged_off, merged_len, order, np.cumsum(heads) - 1


class File:
    """A file opened collectively on a sluice server (see the module docs)."""

    def __init__(self, comm: MPI.Comm, client: Client, fd: int, scheme: str, k_bytes: int):
        self.comm, self.client, self.fd = comm, client, fd
        self.scheme, self.k_bytes = scheme, k_bytes
        self.view = View(0, 1, np.zeros(1, np.int64), np.ones(1, np.int64), np.zeros(1, np.int64), 1, 1)
        self.position = 0  # individual file pointer, in etypes
        #: The rank groups of the last collective call, one aggregator each.
        self.groups: list[list[int]] = []
        #: The path to remove at close (``MPI.MODE_DELETE_ON_CLOSE``).
        self.delete_on_close: str | None = None
        #: The file's size as last asked (reads within it need not ask).
        self._size_seen = 0

    @classmethod
    def open(cls, comm: MPI.Comm, path: str, amode: int = MPI.MODE_RDONLY, server: str | None = None, scheme: str = "two-phase", k_bytes: int = K_BYTES_DEFAULT) -> "File":
        """Open ``path`` on ``server`` (default ``$SLUICE_SERVER``) on every
        rank of ``comm``; ``amode`` as MPI's (``MPI.MODE_CREATE |
        MPI.MODE_RDWR``...). Rank 0 creates the file before the others open
        (``MODE_EXCL``: fails on every rank if it exists); ``MODE_APPEND``
        puts the file pointer at the end of the file; ``MODE_DELETE_ON_CLOSE``
        removes the file at ``close``. (Before commit 01a8436 these three were
        ignored: an append overwrote the file's start.)"""
        if scheme not in SCHEMES:
            raise ValueError(f"scheme {scheme!r}: one of {SCHEMES}")
        server = server or os.environ.get("SLUICE_SERVER")
        if not server:
            raise ValueError("no server: pass server= or set SLUICE_SERVER")
        flags = os.O_RDWR if amode & MPI.MODE_RDWR else (os.O_WRONLY if amode & MPI.MODE_WRONLY else os.O_RDONLY)
        client, err = None, None
        try:
            client = Client(server, client_id=comm.Get_rank())
            if comm.Get_rank() == 0 and amode & MPI.MODE_CREATE:
                excl = os.O_EXCL if amode & MPI.MODE_EXCL else 0
                client.close(client.open(path, flags | os.O_CREAT | excl, 0o644))
        except Exception as e:  # noqa: BLE001 (every rank must hear of it)
            err = e
        _raise_any(comm, err)
        fd = None
        try:
            fd = client.open(path, flags, 0o644)
        except Exception as e:  # noqa: BLE001
            err = e
        _raise_any(comm, err)
        f = cls(comm, client, fd, scheme, k_bytes)
        if amode & MPI.MODE_APPEND:
            f.position = client.size(fd)
        if amode & MPI.MODE_DELETE_ON_CLOSE:
            f.delete_on_close = path
        return f

    def close(self) -> None:
        self.comm.Barrier()
        self.client.close(self.fd)
        if self.delete_on_close is not None:
            # Every rank has closed; then rank 0 removes it.
            self.comm.Barrier()
            if self.comm.Get_rank() == 0:
                self.client.unlink(self.delete_on_close)

    def __enter__(self) -> "File":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- views ---------------------------------------------------------

    def set_view(self, disp: int = 0, etype=MPI.BYTE, filetype=None) -> None:
        """``etype``/``filetype``: mpi4py datatypes or numpy dtypes (a dtype
        stands for a contiguous type of its size). Resets the file pointer."""
        etype = _datatype(etype)
        filetype = _datatype(filetype) if filetype is not None else etype
        runs = _runs_of_type(filetype)
        starts, lengths = _coalesce(*runs) if runs is not None else runs_of(_pack_offsets(filetype))
        cum = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
        _, extent = filetype.Get_extent()
        self.view = View(disp, etype.Get_size(), starts, lengths, cum, int(filetype.Get_size()), int(extent))
        self.position = 0

    def _runs(self, offset: int, nbytes: int) -> tuple[np.ndarray, np.ndarray]:
        return self.view.file_runs(offset * self.view.etype_size, nbytes)

    # ---- independent ---------------------------------------------------

    def write_at(self, offset: int, buf) -> int:
        data = _as_bytes(buf)
        offs, lens = self._runs(offset, data.nbytes)
        return _list_io(self.client, self.fd, offs, lens, data, write=True)

    def read_at(self, offset: int, buf) -> int:
        data = _as_bytes(buf, writable=True)
        offs, lens = self._runs(offset, data.nbytes)
        return self._within_file(offs, lens, _list_io(self.client, self.fd, offs, lens, data, write=False))

    def _within_file(self, offs: np.ndarray, lens: np.ndarray, n: int) -> int:
        """A read's count as MPI's: the bytes of the buffer, in order, up to
        the end of the file (the bytes past it are zeros). Before, a read
        past the end counted them all, and ``while f.read(b)`` never
        ended."""
        if len(offs) == 0 or int((offs + lens).max()) <= self._size_seen:
            return n
        self._size_seen = size = self.client.size(self.fd)
        got = 0
        for o, ln in zip(offs.tolist(), lens.tolist()):
            if o + ln <= size:
                got += ln
            else:
                got += max(0, size - o)
                break
        return min(n, got)

    def write(self, buf) -> int:
        n = self.write_at(self.position, buf)
        self.position += n // self.view.etype_size
        return n

    def read(self, buf) -> int:
        n = self.read_at(self.position, buf)
        self.position += n // self.view.etype_size
        return n

    # ---- collective ----------------------------------------------------

    def write_at_all(self, offset: int, buf) -> int:
        return self._collective(offset, self._collective_bytes(buf, False), write=True)

    def read_at_all(self, offset: int, buf) -> int:
        data = self._collective_bytes(buf, True)
        n = self._collective(offset, data, write=False)
        offs, lens = self._runs(offset, data.nbytes)
        return self._within_file(offs, lens, n)

    def _collective_bytes(self, buf, writable: bool) -> np.ndarray:
        """``_as_bytes`` of a collective call's buffer, raised on every rank
        if it fails on one: a rank with a strided buffer left the others
        waiting in the collective for ever."""
        out, err = None, None
        try:
            out = _as_bytes(buf, writable=writable)
        except Exception as e:  # noqa: BLE001 (every rank must hear of it)
            err = e
        _raise_any(self.comm, err)
        return out

    def write_all(self, buf) -> int:
        n = self.write_at_all(self.position, buf)
        self.position += n // self.view.etype_size
        return n

    def read_all(self, buf) -> int:
        n = self.read_at_all(self.position, buf)
        self.position += n // self.view.etype_size
        return n

    def _server_directed(self, offs: np.ndarray, lens: np.ndarray, data: np.ndarray, write: bool) -> int:
        """The ``"server"`` scheme: every rank's j-th list request is a
        participant of group j, which the server serves whole."""
        comm, err, n = self.comm, None, 0
        message = max(64 << 10, min(SERVER_MESSAGE_BYTES, SERVER_GROUP_BYTES_MAX // comm.Get_size()))
        striped = self.client.servers > 1
        if striped:
            # Each object's share of a message is one message to its data
            # server, of at most STRIPED_SHARE_BYTES.
            message = min(message, STRIPED_SHARE_BYTES)
        offs, lens = _split_long(offs, lens, message)
        chunks = list(_chunks(offs, lens, message))
        counts = comm.allgather(len(chunks))
        # On a cluster's striped file the j-th messages form one group per
        # object (data server): its participants are the ranks whose j-th
        # message touches that object.
        touched = None
        if striped:
            mine = None
            try:
                mine = [self.client.objects_touched(self.fd, list(zip(offs[a:b].tolist(), lens[a:b].tolist()))) for a, b in chunks]
            except Exception as e:  # noqa: BLE001 (every rank must hear of it before any waits)
                err = e
            _raise_any(comm, err)
            touched = comm.allgather(mine)
        # One id per call, the same on every rank, unlikely to meet another
        # program's: rank 0's base (made as every collective's is), then
        # one per message index.
        base = comm.bcast(group_base() if comm.Get_rank() == 0 else None, root=0)
        self.groups = []  # no aggregator ranks: the server aggregates
        try:
            at = 0
            for j, (a, b) in enumerate(chunks):
                participants = sum(1 for c in counts if c > j)
                if touched is not None:
                    objects = 1 + max((max(t[j]) for t in touched if len(t) > j and t[j]), default=0)
                    participants = [sum(1 for t in touched if len(t) > j and k in t[j]) for k in range(objects)]
                pieces = list(zip(offs[a:b].tolist(), lens[a:b].tolist()))
                size = int(lens[a:b].sum())
                part = data[at : at + size]
                gid = (base + j) & ((1 << 64) - 1)
                if write:
                    n += self.client.write_list_group(self.fd, pieces, part, gid, participants, SERVER_WAIT_MS)
                else:
                    n += self.client.read_list_group(self.fd, pieces, part, gid, participants, SERVER_WAIT_MS)
                at += size
        except Exception as e:  # noqa: BLE001 (every rank must hear of it)
            err = e
        _raise_any(comm, err)
        return n

    def _collective(self, offset: int, data: np.ndarray, write: bool) -> int:
        """A collective access. Every rank raises when any rank failed, at
        each point where they would otherwise wait for each other."""
        comm, err = self.comm, None
        offs = lens = np.zeros(0, np.int64)
        try:
            offs, lens = self._runs(offset, data.nbytes)
        except Exception as e:  # noqa: BLE001
            err = e
        _raise_any(comm, err)
        if self.scheme == "independent":
            n = 0
            try:
                n = _list_io(self.client, self.fd, offs, lens, data, write)
            except Exception as e:  # noqa: BLE001
                err = e
            _raise_any(comm, err)
            return n
        if self.scheme == "server":
            return self._server_directed(offs, lens, data, write)
        # Who aggregates: one rank per group, groups from the byte shares;
        # on a striped file under two-phase, one per data server.
        shares = comm.allgather(int(data.nbytes))
        stripe = self.client.stripe(self.fd) if self.scheme == "two-phase" and self.client.servers > 1 else None
        if stripe is not None:
            self.groups = _spread_groups(comm.Get_size(), min(stripe[1], comm.Get_size()))
        else:
            self.groups = choose_groups(shares, self.k_bytes)
        aggs = [g[len(g) // 2] for g in self.groups]
        lo = comm.allreduce(int(offs.min()) if len(offs) else np.iinfo(np.int64).max, op=MPI.MIN)
        hi = comm.allreduce(int((offs + lens).max()) if len(offs) else 0, op=MPI.MAX)
        if hi <= lo:
            return 0
        pos = (np.cumsum(lens) - lens).astype(np.int64)
        if self.scheme == "static":
            # Static segmentation: each aggregator takes its own group's
            # data, wherever it lies in the file.
            mine = next(i for i, g in enumerate(self.groups) if comm.Get_rank() in g)
            p_off, p_len, p_pos = offs, lens, pos
            p_dom = np.full(len(offs), mine, dtype=np.int64)
        elif stripe is not None:
            # Two-phase on a striped file: on stripe boundaries, cyclically
            # (as Lustre-aware ROMIO does): aggregator d takes the stripes
            # of objects d, d + A, ..., so each writes to its own data
            # servers only.
            p_off, p_len, p_pos, p_dom = _cut_stripes(offs, lens, pos, stripe[0], stripe[1], len(aggs))
        else:
            if self.scheme == "dynamic":
                # Dynamic segmentation: domain bounds where each aggregator
                # gets an equal share of the data actually accessed.
                every = comm.allgather((offs, lens))
                all_off = np.concatenate([o for o, _ in every])
                all_len = np.concatenate([n for _, n in every])
                m_off, m_len, _, _ = _merge(all_off, all_len, overlap=True)
                before = np.concatenate(([0], np.cumsum(m_len)))
                total = int(before[-1])
                cuts = [lo]
                for i in range(1, len(aggs)):
                    want = total * i // len(aggs)
                    r = int(np.searchsorted(before, want, side="right")) - 1
                    cuts.append(int(m_off[r]) + (want - int(before[r])))
                cuts.append(hi)
            else:
                # Two-phase (ROMIO): [lo, hi) split evenly.
                cuts = [lo + (hi - lo) * i // len(aggs) for i in range(len(aggs) + 1)]
            # My pieces, cut at domain bounds, per aggregator; with where
            # their bytes sit in my stream.
            p_off, p_len, p_pos, p_dom = _cut(offs, lens, pos, np.array(cuts[1:-1], dtype=np.int64))
        size = comm.Get_size()
        send_pieces = [None] * size
        for d, a in enumerate(aggs):
            sel = p_dom == d
            send_pieces[a] = (p_off[sel], p_len[sel], p_pos[sel])
        for r in range(size):
            if send_pieces[r] is None:
                send_pieces[r] = (np.zeros(0, np.int64),) * 3
        got = comm.alltoall([(o, l) for o, l, _ in send_pieces])
        me = comm.Get_rank()
        err = None
        if write:
            # Data in piece order, per destination.
            parts = [data[s : s + n] for _, l, p in send_pieces for s, n in zip(p.tolist(), l.tolist())]
            counts = [int(l.sum()) for _, l, _ in send_pieces]
            sendbuf = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
            rcounts = [int(l.sum()) for _, l in got]
            recvbuf = np.empty(sum(rcounts), np.uint8)
            comm.Alltoallv([sendbuf, counts], [recvbuf, rcounts])
            if me in aggs:
                all_off = np.concatenate([o for o, _ in got]) if got else np.zeros(0, np.int64)
                all_len = np.concatenate([l for _, l in got]) if got else np.zeros(0, np.int64)
                try:
                    _aggregate_write(self.client, self.fd, all_off, all_len, recvbuf)
                except Exception as e:  # noqa: BLE001 (every rank must hear of it)
                    err = e
            _raise_any(comm, err)
            return int(data.nbytes)
        # Read: aggregators read their domains' pieces and send them back.
        replies = [np.zeros(0, np.uint8) for _ in range(size)]
        if me in aggs:
            try:
                all_off = np.concatenate([o for o, _ in got])
                all_len = np.concatenate([l for _, l in got])
                buf = _aggregate_read(self.client, self.fd, all_off, all_len)
                at = 0
                for r, (o, l) in enumerate(got):
                    n = int(l.sum())
                    replies[r] = buf[at : at + n]
                    at += n
            except Exception as e:  # noqa: BLE001 (every rank must hear of it)
                err = e
        _raise_any(comm, err)
        scounts = [len(x) for x in replies]
        sendbuf = np.concatenate(replies) if sum(scounts) else np.zeros(0, np.uint8)
        rcounts = [int(l.sum()) for _, l, _ in send_pieces]
        recvbuf = np.empty(sum(rcounts), np.uint8)
        comm.Alltoallv([sendbuf, scounts], [recvbuf, rcounts])
        at = 0
        for _, l, p in send_pieces:
            for s, n in zip(p, l):
                data[s : s + n] = recvbuf[at : at + n]
                at += n
        return int(data.nbytes)


def _datatype(t) -> MPI.Datatype:
    if isinstance(t, MPI.Datatype):
        return t
    dt = np.dtype(t)
    return MPI.BYTE.Create_contiguous(dt.itemsize).Commit()


def _cut(offs, lens, pos, cuts):
    """Cut pieces at the domain bounds ``cuts``: ``(offsets, lengths,
    stream positions, domain index)``."""
    o_out, l_out, p_out, d_out = [], [], [], []
    for o, n, p in zip(offs.tolist(), lens.tolist(), pos.tolist()):
        end = o + n
        d = int(np.searchsorted(cuts, o, side="right"))
        while o < end:
            bound = int(cuts[d]) if d < len(cuts) else end
            take = min(end, bound) - o
            if take > 0:
                o_out.append(o), l_out.append(take), p_out.append(p), d_out.append(d)
                o, p = o + take, p + take
            d += 1
    a = lambda x: np.array(x, dtype=np.int64)  # noqa: E731
    return a(o_out), a(l_out), a(p_out), a(d_out)


def _cut_stripes(offs, lens, pos, stripe: int, count: int, aggs: int):
    """Cut pieces at stripe boundaries, each part to the aggregator of its
    object: byte ``o`` is in object ``(o // stripe) % count``, taken by
    aggregator ``object % aggs``. ``(offsets, lengths, stream positions,
    aggregator index)``, as ``_cut``."""
    o_out, l_out, p_out, d_out = [], [], [], []
    for o, n, p in zip(offs.tolist(), lens.tolist(), pos.tolist()):
        end = o + n
        while o < end:
            take = min(end, (o // stripe + 1) * stripe) - o
            o_out.append(o), l_out.append(take), p_out.append(p), d_out.append((o // stripe) % count % aggs)
            o, p = o + take, p + take
    a = lambda x: np.array(x, dtype=np.int64)  # noqa: E731
    return a(o_out), a(l_out), a(p_out), a(d_out)


def _spread_groups(size: int, n: int) -> list[list[int]]:
    """``n`` groups of consecutive ranks, as even as they divide: one
    aggregator (the middle rank) each."""
    return [list(range(size * i // n, size * (i + 1) // n)) for i in range(n)]


def _split_long(offs: np.ndarray, lens: np.ndarray, bytes_max: int = LIST_BYTES_MAX) -> tuple[np.ndarray, np.ndarray]:
    """Pieces longer than ``bytes_max`` cut into pieces no longer."""
    if len(lens) == 0 or int(lens.max()) <= bytes_max:
        return offs, lens
    o_out, n_out = [], []
    for o, n in zip(offs.tolist(), lens.tolist()):
        while n > bytes_max:
            o_out.append(o), n_out.append(bytes_max)
            o, n = o + bytes_max, n - bytes_max
        o_out.append(o), n_out.append(n)
    return np.array(o_out, np.int64), np.array(n_out, np.int64)


def _chunks(offs: np.ndarray, lens: np.ndarray, bytes_max: int = LIST_BYTES_MAX):
    """Consecutive slices of pieces that fit one list request of at most
    ``bytes_max`` (pieces are at most that long: `_split_long`)."""
    start, total = 0, 0
    for i, n in enumerate(lens.tolist()):
        if i > start and (i - start >= LIST_PIECES_MAX or total + n > bytes_max):
            yield start, i
            start, total = i, 0
        total += n
    if start < len(lens):
        yield start, len(lens)


#: Runs at least this long go as plain reads and writes (which the client
#: moves through shared memory or a cache lease) rather than in a list
#: request (whose data crosses the socket).
RUN_BYTES_PLAIN = 256 << 10


def _list_io(client: Client, fd: int, offs: np.ndarray, lens: np.ndarray, data: np.ndarray, write: bool) -> int:
    """Move ``data`` to or from the pieces: long runs one by one, short ones
    gathered in list requests."""
    if len(lens) and int(lens.min()) >= RUN_BYTES_PLAIN:
        done, at = 0, 0
        for o, n in zip(offs.tolist(), lens.tolist()):
            part = data[at : at + n]
            got = client.pwrite(fd, part, o) if write else client.pread(fd, part, o)
            done += got
            at += n
        return done
    offs, lens = _split_long(offs, lens)
    done, at = 0, 0
    for a, b in _chunks(offs, lens):
        pieces = list(zip(offs[a:b].tolist(), lens[a:b].tolist()))
        n = int(lens[a:b].sum())
        part = data[at : at + n]
        done += client.write_list(fd, pieces, part) if write else client.read_list(fd, pieces, part)
        at += n
    return done


def _aggregate_write(client: Client, fd: int, offs: np.ndarray, lens: np.ndarray, data: np.ndarray) -> None:
    """Write pieces (in the order their bytes sit in ``data``) as merged runs
    of touching pieces; where pieces overlap, the later in offset order
    wins (MPI leaves overlapping collective writes undefined)."""
    if len(offs) == 0:
        return
    starts = np.cumsum(lens) - lens
    m_off, m_len, order, _ = _merge(offs, lens)
    sorted_data = np.concatenate([data[starts[i] : starts[i] + lens[i]] for i in order])
    _list_io(client, fd, m_off, m_len, sorted_data, write=True)


def _aggregate_read(client: Client, fd: int, offs: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Read the union of the pieces as runs; their bytes in the pieces'
    order (pieces may overlap: ranks sharing a header or a halo). Bytes
    past the end of the file read as zeros."""
    if len(offs) == 0:
        return np.zeros(0, np.uint8)
    m_off, m_len, order, run = _merge(offs, lens, overlap=True)
    buf = np.zeros(int(m_len.sum()), np.uint8)
    _list_io(client, fd, m_off, m_len, buf, write=False)
    sorted_off, sorted_len = offs[order], lens[order]
    run_at = np.cumsum(m_len) - m_len
    piece_at = run_at[run] + (sorted_off - m_off[run])
    out_at = np.cumsum(lens) - lens
    out = np.zeros(int(lens.sum()), np.uint8)
    for k, i in enumerate(order):
        out[out_at[i] : out_at[i] + lens[i]] = buf[piece_at[k] : piece_at[k] + sorted_len[k]]
    return out


def _raise_any(comm: MPI.Comm, err: BaseException | None) -> None:
    """Raise on every rank if any rank failed (collective semantics)."""
    errs = [e for e in comm.allgather(err) if e is not None]
    if errs:
        raise errs[0]
