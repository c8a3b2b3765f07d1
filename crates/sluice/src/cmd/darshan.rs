//! Reading Darshan logs: their DXT records through pydarshan (which wraps
//! darshan-util's reader), by `scripts/darshan-dxt.py`, compiled in and run
//! with `$SLUICE_PYTHON`, else `python3`. `make test` installs the `darshan`
//! package into the project venv (`.venv`). Used by `sluice what-if` and
//! `sluice bench custom --darshan`.

use anyhow::{bail, Context};

/// The converter, run by the Python that has `darshan`.
const DXT_SCRIPT: &str = include_str!("../../../../scripts/darshan-dxt.py");

/// The log's DXT records as the converter prints them.
pub fn dxt_json(log: &std::path::Path, layer: Option<&str>) -> anyhow::Result<String> {
    let python = std::env::var("SLUICE_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut cmd = std::process::Command::new(&python);
    cmd.args(["-c", DXT_SCRIPT]).arg(log);
    if let Some(l) = layer {
        cmd.args(["--layer", l]);
    }
    let out = cmd.output().with_context(|| format!("cannot run {python} to read the Darshan log (set SLUICE_PYTHON to a Python with the darshan package)"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!("{}", err.trim().lines().last().unwrap_or("the Darshan reader failed"));
    }
    String::from_utf8(out.stdout).context("the Darshan reader printed something that is not UTF-8")
}
