//! The operator's files in `examples/deploy/` work: the systemd unit's
//! `ExecStart=` line parses and validates with the real `sluice serve`
//! (`--check`), the unit keeps its promises (socket under the runtime
//! directory, root, a key file, metrics on loopback), and the Slurm task
//! prolog and epilog are valid bash that print what Slurm reads, with a
//! fake job's environment and a fake metrics endpoint.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn deploy(name: &str) -> PathBuf {
    Path::new(ROOT).join("examples/deploy").join(name)
}

/// The value of the unit's `KEY=` line (the first one).
fn unit_value(unit: &str, key: &str) -> String {
    let prefix = format!("{key}=");
    unit.lines().find_map(|l| l.strip_prefix(&prefix)).unwrap_or_else(|| panic!("sluice.service has no {key}=")).trim().to_string()
}

/// The value following `flag` in `args`.
fn flag<'a>(args: &'a [String], name: &str) -> &'a str {
    let i = args.iter().position(|a| a == name).unwrap_or_else(|| panic!("ExecStart has no {name}: {args:?}"));
    &args[i + 1]
}

#[test]
fn the_systemd_unit_parses_with_the_real_cli() {
    let unit = std::fs::read_to_string(deploy("sluice.service")).unwrap();
    assert_eq!(unit_value(&unit, "User"), "root");
    assert_eq!(unit_value(&unit, "RuntimeDirectory"), "sluice");
    let exec: Vec<String> = unit_value(&unit, "ExecStart").split_whitespace().map(String::from).collect();
    assert!(exec[0].ends_with("/bin/sluice") && exec[1] == "serve", "{exec:?}");
    let mut args = exec[1..].to_vec();
    assert!(flag(&args, "--listen").starts_with("unix:/run/sluice/"), "the socket lives in RuntimeDirectory: {args:?}");
    assert!(flag(&args, "--metrics").starts_with("127.0.0.1:"), "metrics on loopback: {args:?}");
    assert!(flag(&args, "--key-file").starts_with('/'), "{args:?}");
    // The served directory and the key are the host's: point them at a
    // scratch directory, keep every other argument as written.
    let scratch = tempfile::tempdir().unwrap();
    for (name, value) in [("--root", scratch.path().to_path_buf()), ("--key-file", scratch.path().join("key"))] {
        let i = args.iter().position(|a| a == name).unwrap();
        args[i + 1] = value.display().to_string();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_sluice")).args(&args).arg("--check").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "sluice {args:?} --check: {}{stdout}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("configuration ok") && stdout.contains("listen: unix:/run/sluice/sluice.sock") && stdout.contains("metrics: 127.0.0.1:9464"), "{stdout}");
    assert!(!scratch.path().join("key").exists(), "--check creates nothing");
    // And --check refuses what the server would refuse, without listening.
    let bad = Command::new(env!("CARGO_BIN_EXE_sluice")).args(&args).args(["--queue-depth", "0", "--check"]).output().unwrap();
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("queue depth 0"), "{bad:?}");
}

/// Run a Slurm script with only `env` (and PATH) set.
fn slurm(script: &str, env: &[(&str, &str)]) -> Output {
    let path = deploy("slurm").join(script);
    let syntax = Command::new("bash").arg("-n").arg(&path).output().unwrap();
    assert!(syntax.status.success(), "bash -n {script}: {}", String::from_utf8_lossy(&syntax.stderr));
    let mut c = Command::new("bash");
    c.arg(&path).env_clear().env("PATH", std::env::var("PATH").unwrap_or_default());
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "{script} must never fail a job: {out:?}");
    out
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn the_task_prolog_exports_the_server_and_the_job_s_application() {
    let o = slurm("task-prolog.sh", &[("SLURM_JOB_ID", "42")]);
    assert_eq!(stdout(&o), "export SLUICE_SERVER=unix:/run/sluice/sluice.sock\nexport SLUICE_APP=slurm-42\n");
    // A job array is one application; a name or server the user set is kept.
    let o = slurm("task-prolog.sh", &[("SLURM_JOB_ID", "43"), ("SLURM_ARRAY_JOB_ID", "40")]);
    assert!(stdout(&o).contains("export SLUICE_APP=slurm-40\n"), "{}", stdout(&o));
    let o = slurm("task-prolog.sh", &[("SLURM_JOB_ID", "42"), ("SLUICE_APP", "climate"), ("SLUICE_SERVER", "tcp:io1:7000")]);
    assert_eq!(stdout(&o), "");
    // Outside a job: the server only.
    assert_eq!(stdout(&slurm("task-prolog.sh", &[])), "export SLUICE_SERVER=unix:/run/sluice/sluice.sock\n");
}

/// A metrics endpoint that answers one scrape with `body`.
fn fake_metrics(body: &'static str) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            let mut req = [0u8; 4096];
            let _ = s.read(&mut req);
            let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        }
    });
    format!("http://{addr}/metrics")
}

#[test]
fn the_epilog_reports_the_job_s_counters_and_never_fails() {
    assert!(Command::new("curl").arg("--version").output().is_ok_and(|o| o.status.success()), "curl is missing: `make deps` installs it");
    let url = fake_metrics(concat!(
        "# TYPE sluice_app_bytes_total counter\n",
        "sluice_app_bytes_total{app=\"slurm-42\",op=\"read\"} 4096\n",
        "sluice_app_bytes_total{app=\"slurm-7\",op=\"read\"} 1\n",
        "sluice_requests_total 9\n",
    ));
    let o = slurm("epilog.sh", &[("SLURM_JOB_ID", "42"), ("SLUICE_METRICS", &url)]);
    assert_eq!(stdout(&o), "sluice: job 42 (slurm-42): sluice_app_bytes_total{app=\"slurm-42\",op=\"read\"} 4096\n");
    // No server listening, or no job: a line, and exit 0.
    let o = slurm("epilog.sh", &[("SLURM_JOB_ID", "42"), ("SLUICE_METRICS", "http://127.0.0.1:1/metrics")]);
    assert!(stdout(&o).contains("job 42 (slurm-42): no metrics at"), "{}", stdout(&o));
    slurm("epilog.sh", &[]);
}
