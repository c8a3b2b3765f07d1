//! Reading Darshan logs: their DXT records through pydarshan (which wraps
//! darshan-util's reader), by `scripts/darshan-dxt.py`, compiled in and run
//! with `$SLUICE_PYTHON`, else `python3`. `make test` installs the `darshan`
//! package into the project venv (`.venv`). Used by `sluice what-if` and
//! `sluice bench custom --darshan`.

use anyhow::{bail, Context};

/// The converter, run by the Python that has `darshan`.
const DXT_SCRIPT: &str = include_str!("../../../../scripts/darshan-dxt.py");

/// The log's DXT records as the converter prints them: at most
/// `DXT_JSON_BYTES_MAX` (a compressed log can expand past any memory).
pub fn dxt_json(log: &std::path::Path, layer: Option<&str>) -> anyhow::Result<String> {
    let python = std::env::var("SLUICE_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut cmd = std::process::Command::new(&python);
    cmd.args(["-c", DXT_SCRIPT]).arg(log);
    if let Some(l) = layer {
        cmd.args(["--layer", l]);
    }
    output_within(cmd, DXT_JSON_BYTES_MAX)
        .with_context(|| format!("reading the Darshan log {} with {python} (set SLUICE_PYTHON to a Python with the darshan package)", log.display()))
}

/// The log's accesses for real processes to replay (`sluice bench custom
/// --darshan`, `sluice sim --validate`), saying how many think times were
/// cut to the replay's longest.
pub fn replay_log(log: &std::path::Path, layer: Option<&str>) -> anyhow::Result<sluice_bench::workload::replay::ReplayLog> {
    use sluice_bench::workload::replay::{ReplayLog, THINK_NS_MAX};
    let replay = ReplayLog::from_dxt_json(&dxt_json(log, layer)?).map_err(|e| anyhow::anyhow!("{e}"))?;
    if replay.thinks_cut > 0 {
        eprintln!("sluice: {} think times of {} over {} s were cut to it", replay.thinks_cut, log.display(), THINK_NS_MAX / 1_000_000_000);
    }
    Ok(replay)
}

/// Bytes of JSON the converter may print: what `sluice what-if` reads of
/// a JSON trace (`TRACE_FILE_BYTES_MAX`).
pub const DXT_JSON_BYTES_MAX: u64 = sluice_sim::whatif::TRACE_FILE_BYTES_MAX;

/// Run `cmd` and return what it printed, refused (the command killed)
/// past `max` bytes; its error output's last line when it fails.
fn output_within(mut cmd: std::process::Command, max: u64) -> anyhow::Result<String> {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().context("cannot start the reader")?;
    let mut stderr = child.stderr.take().expect("piped");
    // Read apart, so that a chatty error stream cannot stall the output.
    let errors = std::thread::spawn(move || {
        let mut e = Vec::new();
        let _ = stderr.by_ref().take(1 << 20).read_to_end(&mut e);
        e
    });
    let mut out = Vec::new();
    let read = child.stdout.take().expect("piped").take(max + 1).read_to_end(&mut out);
    if out.len() as u64 > max {
        let _ = child.kill();
        let _ = child.wait();
        bail!("the reader printed more than {max} bytes; larger logs are refused");
    }
    read.context("reading the reader's output")?;
    let status = child.wait().context("waiting for the reader")?;
    let err = errors.join().unwrap_or_default();
    if !status.success() {
        let err = String::from_utf8_lossy(&err);
        bail!("{}", err.trim().lines().last().unwrap_or("the reader failed"));
    }
    String::from_utf8(out).context("the reader printed something that is not UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn printing(n: usize) -> std::process::Command {
        let mut c = std::process::Command::new("sh");
        c.args(["-c", &format!("yes | head -c {n}")]);
        c
    }

    #[test]
    fn the_readers_output_bound_at_n_and_n_plus_one() {
        assert_eq!(output_within(printing(4096), 4096).unwrap().len(), 4096);
        let e = output_within(printing(4097), 4096).unwrap_err();
        assert!(e.to_string().contains("more than 4096 bytes"), "{e}");
        // Past the bound, the reader is stopped, not read to its end.
        let e = output_within(printing(1 << 30), 4096).unwrap_err();
        assert!(e.to_string().contains("more than 4096 bytes"), "{e}");
    }

    #[test]
    fn a_failing_reader_says_why() {
        let mut c = std::process::Command::new("sh");
        c.args(["-c", "echo noise; echo 'no module named darshan' >&2; exit 1"]);
        assert_eq!(output_within(c, 4096).unwrap_err().to_string(), "no module named darshan");
    }
}
