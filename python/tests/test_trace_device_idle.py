"""scripts/trace-device-idle.py on a live trace made by hand: two read
dispatches with a gap while a request waits, and a write it must leave
out."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "trace-device-idle.py"


def ev(ph, cat, ident, ts, name="read 64 KiB", **args):
    e = {"name": name, "ph": ph, "cat": cat, "id": ident, "pid": 2 if cat == "dispatch" else 1000, "tid": 0, "ts": ts}
    if args:
        e["args"] = args
    return e


def trace():
    return {
        "traceEvents": [
            {"name": "process_name", "ph": "M", "pid": 2, "tid": 0, "ts": 0, "args": {"name": "live: device"}},
            ev("b", "dispatch", "d0", 100.0),
            ev("e", "dispatch", "d0", 300.0),
            ev("b", "request", "r0", 90.0, dispatch=0),
            ev("e", "request", "r0", 300.0),
            ev("b", "request", "r1", 150.0, dispatch=1),
            ev("b", "dispatch", "d1", 400.0),
            ev("e", "dispatch", "d1", 500.0),
            ev("e", "request", "r1", 500.0),
            # A write long after: not a read, so not in the span.
            ev("b", "dispatch", "d2", 900.0, name="write 64 KiB x1"),
            ev("e", "dispatch", "d2", 990.0, name="write 64 KiB x1"),
            ev("b", "request", "r2", 880.0, name="write 64 KiB", dispatch=2),
            ev("e", "request", "r2", 990.0, name="write 64 KiB"),
        ]
    }


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_idle_time_with_a_request_waiting_is_counted():
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.json"
        path.write_text(json.dumps(trace()))
        out = run("--json", str(path))
        assert out.returncode == 0, out.stderr
        s = json.loads(out.stdout)
        # Reads from 90 to 500 us: idle 90-100 (r0 waiting) and 300-400
        # (r1 waiting), one in flight otherwise.
        assert (s["requests"], s["dispatches"]) == (2, 2)
        assert abs(s["span_ms"] - 0.410) < 1e-9
        assert abs(s["idle_ms"] - 0.110) < 1e-9 and abs(s["idle_waiting_ms"] - 0.110) < 1e-9
        assert abs(s["mean_inflight"] - 300.0 / 410.0) < 1e-9
        assert (s["service_median_us"], s["service_mean_us"], s["wait_median_us"]) == (200.0, 150.0, 250.0)
        # The write alone: one dispatch, the device idle for the 20 us
        # its request waited.
        w = json.loads(run("--json", "--op", "write", str(path)).stdout)
        assert (w["requests"], w["dispatches"]) == (1, 1)
        assert abs(w["idle_waiting_ms"] - 0.020) < 1e-9 and abs(w["span_ms"] - 0.110) < 1e-9
        # The table form names the trace; a trace without reads is an error.
        assert str(path) in run(str(path)).stdout
        path.write_text(json.dumps({"traceEvents": []}))
        bad = run(str(path))
        assert bad.returncode != 0 and "no complete read requests" in bad.stderr
