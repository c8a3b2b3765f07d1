"""Merge a live trace (`sluice serve --trace`) and one run of a simulated
trace (`sluice sim --trace`) into one trace-event document, so that both
open side by side in one viewer (ui.perfetto.dev, chrome://tracing, or
catapult's `tracing/bin/trace2html`, which made the README's picture).

The simulated run is shifted to start where the live run's first read
arrived; the live run's events before it (file setup) are left out.

Usage: python3 trace-side-by-side.py LIVE.json SIM.json OUT.json [SIM_RUN]
SIM_RUN: which run of the simulated trace (1 = the first mode), default 2.
"""

import json
import sys


def main(argv):
    live_path, sim_path, out_path = argv[1], argv[2], argv[3]
    run = int(argv[4]) if len(argv) > 4 else 2
    live = json.load(open(live_path))
    sim = json.load(open(sim_path))
    procs, devices = 2 * run - 1, 2 * run
    sim_ev = [e for e in sim["traceEvents"] if e["pid"] in (procs, devices) and e.get("cat") != "piece"]
    reads = [e["ts"] for e in live["traceEvents"] if e.get("cat") == "request" and e["ph"] == "b" and e["name"].startswith("read")]
    first = min(reads) if reads else 0.0
    for e in sim_ev:
        e["pid"] += 10
        if e["ph"] != "M":
            e["ts"] += first
        if e["name"] == "process_name":
            e["args"]["name"] = "simulated: " + e["args"]["name"]
    for e in live["traceEvents"]:
        if e["name"] == "process_name" and not e["args"]["name"].startswith("live"):
            e["args"]["name"] = "live: " + e["args"]["name"]
    live_ev = [e for e in live["traceEvents"] if e["ph"] == "M" or e["ts"] >= first - 1000]
    apps = sorted(e["pid"] for e in live_ev if e["name"] == "process_name" and e["pid"] >= 1000)
    order = {2: 0, devices + 10: 1, procs + 10: 2 + len(apps)}
    order.update({p: 2 + i for i, p in enumerate(apps)})
    meta = [{"name": "process_sort_index", "ph": "M", "pid": p, "tid": 0, "ts": 0, "args": {"sort_index": k}} for p, k in order.items()]
    json.dump({"traceEvents": meta + live_ev + sim_ev, "displayTimeUnit": "ms"}, open(out_path, "w"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
