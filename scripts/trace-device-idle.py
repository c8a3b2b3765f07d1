#!/usr/bin/env python3
"""How busy a live trace's device was: is a policy leaving it idle?

Usage: python3 trace-device-idle.py [--op read|write] TRACE.json [TRACE.json ...]

Reads live traces of `sluice serve --trace` (docs/observability.md) and,
for the requests of one kind (`--op`, default read) from the first
arrival to the last answer, prints per trace: the span, the dispatches,
the mean number in flight (time-weighted), the time with nothing in
flight, the part of it with a request waiting (arrived, not yet
dispatched: the time a scheduler held the device idle), and the median
and mean service time of a dispatch and median wait of a request. A
dispatch's "throughput cost" is the span over the dispatches: on a
device at its bandwidth it stays the same whatever the depth.

With `--json` it prints one JSON object per trace instead.
"""

import json
import sys


def analyze(path, op="read"):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    dispatches, requests = {}, {}
    for e in events:
        if e.get("ph") not in ("b", "e") or not e.get("name", "").startswith(op):
            continue
        if e.get("cat") == "dispatch":
            dispatches.setdefault(e["id"], {})[e["ph"]] = e["ts"]
        elif e.get("cat") == "request":
            r = requests.setdefault(e["id"], {})
            r[e["ph"]] = e["ts"]
            if e["ph"] == "b":
                r["dispatch"] = "d%d" % e["args"]["dispatch"]
    requests = {k: r for k, r in requests.items() if "b" in r and "e" in r and r.get("dispatch") in dispatches}
    dispatches = {k: d for k, d in dispatches.items() if "b" in d and "e" in d}
    if not requests:
        raise SystemExit(f"{path}: no complete {op} requests in the trace")
    t0 = min(r["b"] for r in requests.values())
    t1 = max(r["e"] for r in requests.values())
    # (time, change in flight, change waiting); at one instant, ends
    # before starts, so a dispatch that leaves as another ends is not idle.
    changes = []
    for d in dispatches.values():
        changes += [(d["b"], 1, 0), (d["e"], -1, 0)]
    for r in requests.values():
        changes += [(r["b"], 0, 1), (dispatches[r["dispatch"]]["b"], 0, -1)]
    changes.sort(key=lambda c: (c[0], c[1] + c[2]))
    inflight = waiting = 0
    last = t0
    weighted = idle = idle_waiting = 0.0
    for t, di, dw in changes:
        span = max(0.0, min(t, t1) - max(last, t0))
        weighted += inflight * span
        if inflight == 0:
            idle += span
            if waiting > 0:
                idle_waiting += span
        inflight += di
        waiting += dw
        last = max(last, t)
    span = t1 - t0
    service = sorted(d["e"] - d["b"] for d in dispatches.values())
    wait = sorted(dispatches[r["dispatch"]]["b"] - r["b"] for r in requests.values())
    return {
        "trace": path,
        "op": op,
        "span_ms": span / 1e3,
        "dispatches": len(dispatches),
        "requests": len(requests),
        "mean_inflight": weighted / span if span > 0 else 0.0,
        "idle_ms": idle / 1e3,
        "idle_waiting_ms": idle_waiting / 1e3,
        "service_median_us": service[len(service) // 2],
        "service_mean_us": sum(service) / len(service),
        "wait_median_us": wait[len(wait) // 2],
        "span_per_dispatch_us": span / len(dispatches),
    }


def main(argv):
    op, as_json, paths = "read", False, []
    args = iter(argv)
    for a in args:
        if a == "--op":
            op = next(args, "")
            if op not in ("read", "write"):
                raise SystemExit("--op takes read or write")
        elif a == "--json":
            as_json = True
        else:
            paths.append(a)
    if not paths:
        raise SystemExit(__doc__.strip().splitlines()[2])
    for p in paths:
        s = analyze(p, op)
        if as_json:
            print(json.dumps(s))
        else:
            print(
                f"{p}: {s['requests']} {op}s in {s['dispatches']} dispatches over {s['span_ms']:.1f} ms, "
                f"{s['mean_inflight']:.2f} in flight, idle {s['idle_ms']:.1f} ms "
                f"({s['idle_waiting_ms']:.1f} ms with a request waiting), service median {s['service_median_us']:.0f} us "
                f"(mean {s['service_mean_us']:.0f}), wait median {s['wait_median_us']:.0f} us, "
                f"{s['span_per_dispatch_us']:.0f} us of span a dispatch"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
