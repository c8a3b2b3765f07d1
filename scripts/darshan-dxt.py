"""Read a Darshan log's DXT trace and print it as JSON for sluice.

`sluice what-if LOG.darshan` runs this with the project venv's Python
(`$SLUICE_PYTHON`, else `python3`), where `make test` installs the `darshan`
package from PyPI: pydarshan, which wraps darshan-util's own log reader
(bundled as libdarshan-util in its wheel). No binary parsing here.

Output: one JSON object
  {"source": "darshan", "exe": ..., "nprocs": N, "layer": "DXT_POSIX",
   "files": [name, ...],
   "segments": [[rank, file, "r" or "w", offset, length, start_s, end_s], ...],
   "zero_length": count of zero-length accesses left out}
segments sorted by start time. The POSIX layer is what reaches the file
system, so it is taken when the log has it; `--layer DXT_MPIIO` takes the
MPI-IO layer instead.

Usage: python3 darshan-dxt.py LOG [--layer DXT_POSIX|DXT_MPIIO]
"""

import json
import sys


def main(argv):
    if len(argv) < 2:
        sys.stderr.write("usage: darshan-dxt.py LOG [--layer DXT_POSIX|DXT_MPIIO]\n")
        return 2
    log = argv[1]
    layer = None
    if "--layer" in argv:
        layer = argv[argv.index("--layer") + 1]
    try:
        import darshan  # noqa: PLC0415 (a clear message when it is missing)
    except ImportError:
        sys.stderr.write("the Python package 'darshan' is not installed in this interpreter (make test installs it into .venv; or pip install darshan)\n")
        return 3
    report = darshan.DarshanReport(log, read_all=False)
    have = [m for m in ("DXT_POSIX", "DXT_MPIIO") if m in report.modules]
    if not have:
        sys.stderr.write(f"{log}: no DXT records (run the application with DXT_ENABLE_IO_TRACE=1)\n")
        return 4
    layer = layer or have[0]
    if layer not in have:
        sys.stderr.write(f"{log}: no {layer} records (it has {', '.join(have)})\n")
        return 4
    report.mod_read_all_dxt_records(layer)
    names = report.name_records
    files, index, segments, zero = [], {}, [], 0
    for rec in report.records[layer].to_df():
        fid = rec["id"]
        if fid not in index:
            index[fid] = len(files)
            files.append(names.get(fid, str(fid)))
        for op, key in (("r", "read_segments"), ("w", "write_segments")):
            df = rec[key]
            if len(df) == 0:
                continue
            for off, length, start, end in zip(df["offset"], df["length"], df["start_time"], df["end_time"]):
                if int(length) == 0:
                    zero += 1
                    continue
                segments.append([int(rec["rank"]), index[fid], op, int(off), int(length), float(start), float(end)])
    segments.sort(key=lambda s: (s[5], s[0]))
    job = report.metadata.get("job", {})
    out = {
        "source": "darshan",
        "exe": report.metadata.get("exe", ""),
        "nprocs": int(job.get("nprocs", 0)),
        "layer": layer,
        "files": files,
        "segments": segments,
        "zero_length": zero,
    }
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
