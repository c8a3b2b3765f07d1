"""Collective I/O benchmark: ``mpirun -np N python -m sluice.bench collective``.

A BLOCK-distributed 3-D array of float64 (BLOCK over the first axis or a
2-D process grid, the local blocks described by subarray filetypes) is
written and read back collectively, by:

- OpenMPI's MPI-IO (``File.Write_all``/``Read_all`` through the same view),
  on the local file system under the server's root, and with ``--mount``
  through ``sluice mount`` of the server;
- ``sluice.mpi`` through a sluice server on that root, with each scheme;
- ``sluice.array`` (the same blocks stored as a Zarr v3 array whose chunks
  are half of x, all of y and half of z), server-directed and independent;
- plain ``pwrite``/``pread`` with neither, as a yardstick of what the file
  system takes: the same blocks, one call a contiguous run, and each
  rank's bytes as one contiguous share of the file in 1 MiB calls.

With ``--cluster N`` the service is a cluster of N data servers (``sluice
cluster``) whose files are striped over all of them in ``--stripe`` units
(``sluice setstripe``); ``--mount`` then mounts the cluster. The local file
system's rows stay local. sluice.mpi's ``server`` scheme makes one group
per data server there: each gathers its share of the ranks' messages.

Each mode runs ``--rounds`` times; the best time counts (the page cache is
not dropped: the figures are what the I/O paths add, not the disk). It
prints a table on rank 0 and writes JSON with ``--json PATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

from . import array as sa
from ._sluice import Client
from .mpi import SCHEMES, File, _coalesce, _runs_of_type


def grid(size: int) -> tuple[int, int]:
    """A 2-D process grid as square as ``size`` allows."""
    a = int(size**0.5)
    while size % a:
        a -= 1
    return a, size // a


def layout(comm, n: int):
    """The local block and its subarray type of an n x n x n array."""
    px, py = grid(comm.Get_size())
    r = comm.Get_rank()
    ix, iy = r // py, r % py
    lx, ly = n // px, n // py
    local = np.full((lx, ly, n), float(r), dtype=np.float64)
    local += np.arange(n, dtype=np.float64)
    sub = MPI.DOUBLE.Create_subarray([n, n, n], [lx, ly, n], [ix * lx, iy * ly, 0]).Commit()
    return local, sub


def _pieces(offset: int, nbytes: int, piece: int) -> tuple[list[int], list[int]]:
    """``[offset, offset + nbytes)`` as runs of at most ``piece`` bytes."""
    offs = list(range(offset, offset + nbytes, piece))
    return offs, [min(piece, offset + nbytes - o) for o in offs]


def _posix_io(path: str, runs, buf: memoryview, write: bool) -> None:
    """Plain ``pwrite``/``pread`` of ``buf``'s bytes, in order, to or from
    the file runs ``(offsets, lengths)``; a short transfer is an error."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT if write else os.O_RDONLY, 0o644)
    try:
        at = 0
        for o, n in zip(*(np.asarray(x).tolist() for x in runs)):
            part = buf[at : at + n]
            done = os.pwrite(fd, part, o) if write else os.preadv(fd, [part], o)
            if done != n:
                raise OSError(f"{path}: {'wrote' if write else 'read'} {done} of {n} bytes at {o}")
            at += n
    finally:
        os.close(fd)


def timed(comm, f) -> float:
    comm.Barrier()
    t = time.perf_counter()
    f()
    comm.Barrier()
    return comm.allreduce(time.perf_counter() - t, op=MPI.MAX)


def collective(args) -> None:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    local, sub = layout(comm, args.n)
    total = args.n**3 * 8
    # One server (or with --cluster, one cluster) for the run, on a scratch
    # root (rank 0 starts it).
    root, proc, addr = None, None, None
    if rank == 0:
        root = tempfile.mkdtemp(prefix="sluice-coll-", dir=args.dir)
        (Path(root) / "root").mkdir()
        extra = ["--policy", args.policy] if args.policy else []
        extra += ["--direct"] if args.direct else []
        extra += ["--device", args.device] if args.device else []
        if args.cluster:
            # Its data servers write through their page cache themselves
            # only under write leases, which a cluster does not lend.
            sock = Path(root) / "cluster" / "meta.sock"
            cmd = [args.sluice, "cluster", "--servers", str(args.cluster), "--root", f"{root}/cluster", *extra]
        else:
            sock = Path(root) / "s.sock"
            extra += ["--no-write-leases"] if args.no_write_leases else []
            cmd = [args.sluice, "serve", "--root", f"{root}/root", "--listen", f"unix:{sock}", *extra]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            with socket.socket(socket.AF_UNIX) as probe:
                try:
                    probe.connect(str(sock))
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"{cmd[1]} did not come up")
            time.sleep(0.01)
        addr = f"unix:{sock}"
        if args.cluster:
            # Every file striped over every data server in --stripe units.
            subprocess.run([args.sluice, "setstripe", "--server", addr, "-S", args.stripe, "-c", "-1", "/"], check=True, stdout=subprocess.DEVNULL)
    mount = None
    if rank == 0 and args.mount:
        # OpenMPI's MPI-IO through `sluice mount` of the same server.
        mnt = Path(root) / "mnt"
        mnt.mkdir()
        mount = subprocess.Popen([args.sluice, "mount", "--server", addr, str(mnt)], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not os.path.ismount(mnt):
            if mount.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("sluice mount did not come up")
            time.sleep(0.02)
    root, addr = comm.bcast((root, addr), root=0)
    # The local file system's rows (MPI-IO, plain pwrite) write here: the
    # server's root, or beside a cluster's data servers.
    data_dir = f"{root}/root"
    rows = []
    try:
        modes = [("mpi-io", None)] + ([("mpi-io", "mount")] if args.mount else []) + [("sluice", s) for s in SCHEMES]
        modes += [("array", s) for s in sa.STRATEGIES]
        # What the file system itself takes, without MPI-IO or sluice: the
        # same blocks written with one `pwrite` a contiguous run, and each
        # rank's bytes as one contiguous share (the most favourable layout).
        modes += [("posix", "same blocks"), ("posix", "contiguous")]
        # The first row stays: every other is compared with it.
        kept = set(args.modes.split(","))
        modes = modes[:1] + [m for m in modes[1:] if m[0] in kept]
        src = memoryview(np.ascontiguousarray(local)).cast("B")
        share = (rank * src.nbytes, src.nbytes)
        block_runs = _coalesce(*_runs_of_type(sub))
        px, py = grid(comm.Get_size())
        agrid, adist = (px, py, 1), ["block", "block", "*"]
        # Zarr chunks that differ from the blocks: half of x, all of y, half of z.
        achunks = (max(args.n // 2, 1), args.n, max(args.n // 2, 1))
        client = Client(addr, client_id=rank) if any(m == "array" for m, _ in modes) else None
        for mode, scheme in modes:
            best_w, best_r = float("inf"), float("inf")
            groups = None
            for k in range(args.rounds):
                name = f"{mode}-{scheme or 'romio'}-{k}.bin"
                back = np.zeros_like(local)
                if mode == "mpi-io":
                    where = f"{root}/mnt" if scheme == "mount" else data_dir

                    def w():
                        fh = MPI.File.Open(comm, f"{where}/{name}", MPI.MODE_CREATE | MPI.MODE_WRONLY)
                        fh.Set_view(0, MPI.DOUBLE, sub)
                        fh.Write_all(local)
                        fh.Close()

                    def r():
                        fh = MPI.File.Open(comm, f"{where}/{name}", MPI.MODE_RDONLY)
                        fh.Set_view(0, MPI.DOUBLE, sub)
                        fh.Read_all(back)
                        fh.Close()
                elif mode == "posix":
                    path = f"{data_dir}/{name}"
                    runs = block_runs if scheme == "same blocks" else _pieces(*share, 1 << 20)

                    def w():
                        _posix_io(path, runs, src, write=True)

                    def r():
                        _posix_io(path, runs, memoryview(back).cast("B"), write=False)
                elif mode == "array":
                    def w():
                        sa.write(comm, client, name, local, shape=(args.n,) * 3, chunks=achunks, grid=agrid, dist=adist, strategy=scheme)

                    def r():
                        back[...] = sa.read(comm, client, name, grid=agrid, dist=adist, strategy=scheme)
                else:
                    def w():
                        nonlocal groups
                        with File.open(comm, name, MPI.MODE_CREATE | MPI.MODE_WRONLY, server=addr, scheme=scheme, k_bytes=args.k_bytes) as f:
                            f.set_view(0, MPI.DOUBLE, sub)
                            f.write_all(local)
                            groups = f.groups

                    def r():
                        with File.open(comm, name, MPI.MODE_RDONLY, server=addr, scheme=scheme, k_bytes=args.k_bytes) as f:
                            f.set_view(0, MPI.DOUBLE, sub)
                            f.read_all(back)

                best_w = min(best_w, timed(comm, w))
                best_r = min(best_r, timed(comm, r))
                ok = comm.allreduce(bool(np.array_equal(back, local)), op=MPI.LAND)
                if not ok:
                    raise SystemExit(f"{mode} {scheme}: read back differs")
                if rank == 0 and mode == "mpi-io" and scheme == "mount":
                    os.unlink(f"{root}/mnt/{name}")
                elif rank == 0 and not (args.cluster and mode in ("sluice", "array")):
                    # (A cluster's files stay until the scratch root goes.)
                    if mode == "array":
                        shutil.rmtree(f"{data_dir}/{name}")
                    else:
                        os.unlink(f"{data_dir}/{name}")
            label = {None: "local fs", "mount": "sluice mount"}.get(scheme, scheme) if mode == "mpi-io" else scheme
            if mode == "posix":
                label = f"pwrite, {scheme}"
            if mode == "array":
                label = f"zarr {scheme}"
            rows.append({"mode": mode, "scheme": label, "write_s": best_w, "read_s": best_r, "write_mib_s": total / best_w / 2**20, "read_mib_s": total / best_r / 2**20, "aggregators": len(groups) if groups else None})
    finally:
        comm.Barrier()
        if rank == 0:
            if mount is not None:
                subprocess.run(["fusermount3", "-u", f"{root}/mnt"], check=False)
                mount.terminate()
                mount.wait()
            proc.terminate()
            proc.wait()
            shutil.rmtree(root, ignore_errors=True)
    if rank == 0:
        base = rows[0]
        on = f", a cluster of {args.cluster} data servers in {args.stripe} stripes" if args.cluster else ""
        print(f"collective: {args.n}^3 float64 ({total / 2**20:.0f} MiB), {comm.Get_size()} ranks, best of {args.rounds}{on}")
        print(f"{'mode':<8} {'scheme':<22} {'write MiB/s':>12} {'read MiB/s':>11} {'write vs MPI-IO':>16} {'read vs MPI-IO':>15} {'aggregators':>12}")
        for r in rows:
            r["write_vs_mpiio"] = base["write_s"] / r["write_s"]
            r["read_vs_mpiio"] = base["read_s"] / r["read_s"]
            print(f"{r['mode']:<8} {r['scheme']:<22} {r['write_mib_s']:>12.0f} {r['read_mib_s']:>11.0f} {r['write_vs_mpiio']:>15.2f}x {r['read_vs_mpiio']:>14.2f}x {str(r['aggregators'] or '-'):>12}")
        if args.json:
            Path(args.json).write_text(json.dumps({"n": args.n, "ranks": comm.Get_size(), "bytes": total, "rounds": args.rounds, "cluster": args.cluster, "stripe": args.stripe if args.cluster else None, "rows": rows}, indent=2))
            print(f"json: {args.json}")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m sluice.bench")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collective", help="BLOCK-distributed 3-D array: MPI-IO vs sluice.mpi")
    c.add_argument("--n", type=int, default=128, help="the array is n x n x n float64 (default 128: 16 MiB)")
    c.add_argument("--rounds", type=int, default=3)
    c.add_argument("--k-bytes", type=int, default=32 << 20)
    c.add_argument("--dir", default="/var/tmp", help="where the scratch root goes")
    c.add_argument("--sluice", default=os.environ.get("SLUICE_BIN", "sluice"), help="the sluice binary (default: $SLUICE_BIN, else sluice on PATH)")
    c.add_argument("--mount", action="store_true", help="also MPI-IO through `sluice mount` of the server")
    c.add_argument("--no-write-leases", action="store_true", help="start the server with --no-write-leases (every write scheduled; by default its clients write through the page cache themselves)")
    c.add_argument("--write-leases", action="store_true", help=argparse.SUPPRESS)  # the default; older command lines
    c.add_argument("--policy", help="the server's policy (default: the server's own, aioli)")
    c.add_argument("--direct", action="store_true", help="start the server with --direct (O_DIRECT on its files)")
    c.add_argument("--device", help="the server's device (real, or hdd7200 for its emulated disk)")
    c.add_argument("--cluster", type=int, default=0, help="a cluster of N data servers (`sluice cluster`) instead of one server, every file striped over all of them")
    c.add_argument("--stripe", default="1M", help="with --cluster: the stripe size (default 1M)")
    c.add_argument("--modes", default="mpi-io,sluice,array,posix", help="which kinds of rows to run, of mpi-io, sluice, array, posix (default: all; MPI-IO on the local file system always runs first)")
    c.add_argument("--json")
    args = p.parse_args()
    if args.cmd == "collective":
        collective(args)


if __name__ == "__main__":
    main()
