//! `sluice calibrate`: measure the device under a directory and write its
//! cost model as TOML, for `sluice serve --device-model` and `sluice sim
//! --device-model`; with `--host`, measure what answering a request costs
//! this machine's cores, for `sluice what-if` (`sluice_bench::host`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use sluice_bench::calibrate::{self, CalibrateConfig};

#[derive(Args)]
pub struct CalibrateArgs {
    /// A directory on the device to measure (a scratch file is made there
    /// and removed); with --host, the disk the profile keeps (default
    /// /var/tmp, where `sluice sim --validate` runs).
    #[arg(long, required_unless_present = "host")]
    root: Option<PathBuf>,
    /// Measure the host instead of a device: the cores and the CPU one
    /// answered request costs them (32 processes against a server on the
    /// null device, three runs), and the disk under --root with O_DIRECT,
    /// written to --out, by default the profile `sluice what-if` reads
    /// ($XDG_CACHE_HOME/sluice/host.toml, else ~/.cache/sluice/host.toml).
    #[arg(long, conflicts_with_all = ["direct", "file_size"])]
    host: bool,
    /// Measure with O_DIRECT (what `sluice serve --direct` sees).
    #[arg(long)]
    direct: bool,
    /// Write the model here as TOML.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Milliseconds per measured cell (14 cells; 17 with --direct).
    #[arg(long, default_value_t = 1_000)]
    cell_ms: u64,
    /// Size of the scratch file (random reads spread over it; K, M, G, T).
    #[arg(long, default_value = "256M", value_parser = super::size::parse_size_positive)]
    file_size: u64,
}

pub fn run(a: CalibrateArgs) -> anyhow::Result<()> {
    if a.host {
        let disk_root = a.root.clone().unwrap_or_else(|| PathBuf::from("/var/tmp"));
        return host(a.out.as_deref(), &disk_root, a.cell_ms);
    }
    let root = a.root.clone().context("--root is required")?;
    let cfg = CalibrateConfig { root, direct: a.direct, file_bytes: a.file_size, cell_ms: a.cell_ms };
    let model = calibrate::run(&cfg).map_err(anyhow::Error::msg)?;
    print!("{}", calibrate::table(&model));
    if let Some(path) = &a.out {
        std::fs::write(path, model.to_toml()).with_context(|| format!("writing {}", path.display()))?;
        println!("model: {}", path.display());
    }
    Ok(())
}

fn host(out: Option<&std::path::Path>, disk_root: &std::path::Path, cell_ms: u64) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("locating the sluice executable")?;
    let p = sluice_bench::host::calibrate(&exe, &std::env::temp_dir(), disk_root, cell_ms, true).map_err(anyhow::Error::msg)?;
    let us = |n: u64| n as f64 / 1e3;
    let runs: Vec<String> = p.runs_ns.iter().map(|[s, c]| format!("{:.1} + {:.1}", us(*s), us(*c))).collect();
    println!(
        "host: {} cores; an answer costs {:.1} us of the server's loop (at least the wake floor, {:.1} us) and {:.1} us of a process (runs, loop + process: {})",
        p.cores,
        us(p.server_ns),
        us(p.wake_ns),
        us(p.client_ns),
        runs.join(", ")
    );
    match &p.disk {
        Some(m) => print!("disk under {} (O_DIRECT):\n{}", disk_root.display(), calibrate::table(m)),
        None => println!("disk: not measured (O_DIRECT refused under {}; --root DIR on the disk)", disk_root.display()),
    }
    let path = match out {
        Some(p) => p.to_path_buf(),
        None => sluice_bench::host::default_path().context("neither XDG_CACHE_HOME nor HOME is set: give --out")?,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&path, p.to_toml()).with_context(|| format!("writing {}", path.display()))?;
    println!("host profile: {}", path.display());
    Ok(())
}
