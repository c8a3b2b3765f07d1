"""Where a benchmark's CPU goes, per request: the server's event loop and
the worker processes, each split by system call.

Record one `sluice bench decomposition` run system-wide, then read it:

  perf record -F 4000 -a -g -o aioli.data -- \
      sluice bench decomposition --direct --granularity 4K --procs 32 \
      --scale 0.0625 --policies aioli
  perf script -i aioli.data -F comm,pid,tid,time,ip,sym | \
      python3 scripts/perf-per-request.py 4000 65536

The arguments are perf's sampling rate and the run's request count
(file bytes over the granularity: 4 GiB x 0.0625 / 4 KiB = 65,536). Each
sample counts 1/rate seconds of CPU for its thread and is charged to the
first system call on its stack (`sys futex`, `sys io_uring_enter`, ...),
else to `user/other` (user code, page faults) or `irq/kernel`. Threads:
- `server loop`: the server's event loop (`sluice-loop`);
- `driver`: the main thread of the process that sampled first among
  those whose name starts with `sluice` (the bench itself, which makes
  the files and, in the policies' runs, holds the server's threads: its
  other threads are listed as `server other`);
- `workers`: every other such process (the ranks).
Only runs of one mode each: a run with `--policies direct,aioli` would
mix both modes' workers.
"""

import collections
import re
import sys


def samples(lines):
    """(comm, pid, time, frames) for each sample of `perf script`."""
    head = re.compile(r"\s*(\S.*?)\s+(\d+)/(\d+)\s+([\d.]+):\s*$")
    cur = None
    for line in lines:
        line = line.rstrip("\n")
        m = None if line.startswith("\t") else head.match(line)
        if m:
            if cur:
                yield cur
            cur = (m.group(1), int(m.group(2)), float(m.group(4)), [])
        elif line.strip() and cur is not None:
            parts = line.split(None, 1)
            cur[3].append(parts[1] if len(parts) > 1 else "?")
        elif not line.strip() and cur is not None:
            yield cur
            cur = None
    if cur:
        yield cur


def category(frames):
    for f in frames:
        m = re.match(r"(?:__x64_sys_|__do_sys_|__se_sys_)(\w+)", f)
        if m:
            return "sys " + m.group(1)
    if any("irq" in f for f in frames[:3]):
        return "irq/kernel"
    return "user/other"


def main():
    rate, requests = float(sys.argv[1]), float(sys.argv[2])
    all_samples = [s for s in samples(sys.stdin) if s[0] != "swapper"]
    sluice = [s for s in all_samples if s[0].startswith("sluice")]
    if not sluice:
        sys.exit("no samples of sluice processes")
    first = min(sluice, key=lambda s: s[2])
    driver, driver_comm = first[1], first[0]
    seconds = collections.Counter()
    by_call = collections.Counter()
    for comm, pid, _, frames in all_samples:
        if comm == "sluice-loop":
            who = "server loop"
        elif pid == driver:
            who = "driver" if comm == driver_comm else "server other"
        elif comm.startswith("sluice"):
            who = "workers"
        else:
            who = "other"
        seconds[who] += 1 / rate
        by_call[(who, category(frames))] += 1 / rate
    for who in ["server loop", "workers", "server other", "driver", "other"]:
        if not seconds[who]:
            continue
        print(f"{who}: {seconds[who]:.3f} s CPU, {seconds[who] / requests * 1e6:.2f} us a request")
        for (w, call), s in sorted(by_call.items(), key=lambda kv: -kv[1]):
            if w == who and s / seconds[who] >= 0.02:
                print(f"    {call:24s} {100 * s / seconds[who]:5.1f}%  {s / requests * 1e6:5.2f} us")


if __name__ == "__main__":
    main()
