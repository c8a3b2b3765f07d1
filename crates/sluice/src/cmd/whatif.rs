//! `sluice what-if TRACE --policy P...`: replay a live trace (`sluice serve
//! --trace`) or a Darshan log (`*.darshan`, its DXT records) under other
//! policies and print, per application, what happened and what would have
//! (`sluice_sim::whatif`). A Darshan log is read by darshan-util through
//! pydarshan (`scripts/darshan-dxt.py`, compiled in), run with
//! `$SLUICE_PYTHON`, else `python3`; `make test` installs `darshan` into the
//! project venv (`.venv`).

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use sluice_bench::host::HostProfile;
use sluice_sim::whatif::{self, Device, Options, Recording, TRACE_FILE_BYTES_MAX};

use super::output::write_json;

#[derive(Args)]
pub struct WhatIfArgs {
    /// A trace written by `sluice serve --trace PATH`, or a Darshan log
    /// (`.darshan`) with DXT records.
    trace: PathBuf,
    /// Which DXT layer of a Darshan log: DXT_POSIX (what reached the file
    /// system; the default when present) or DXT_MPIIO.
    #[arg(long)]
    layer: Option<String>,
    /// A policy to replay under; repeat for several.
    #[arg(long = "policy", default_values_t = ["fifo".to_string(), "aioli".to_string()])]
    policies: Vec<String>,
    /// The replayed device: auto (the emulated disk when the trace says
    /// its server ran on one; the host profile's calibrated disk when it
    /// ran on the real device with O_DIRECT and the profile has one; else
    /// recorded), recorded (the cost model the trace's own dispatches
    /// imply), hdd7200 (the emulated 7200 rpm disk) or calibrated (the
    /// host profile's disk, `sluice calibrate --host`). On a device it
    /// learned, the server's learner runs in each replay's loop.
    #[arg(long, default_value = "auto")]
    device: String,
    /// The host profile of the machine that recorded the trace (`sluice
    /// calibrate --host --out PATH`): its cores and what answering a
    /// request costs them. Default: this machine's, where `sluice
    /// calibrate --host` saved it ($XDG_CACHE_HOME/sluice/host.toml, else
    /// ~/.cache/sluice/host.toml); without one, and for a Darshan log
    /// (whose processes had no sluice server), the replay has no host.
    #[arg(long, conflicts_with = "no_host")]
    host: Option<PathBuf>,
    /// Replay without a host: an answer lets its process go at once.
    #[arg(long)]
    no_host: bool,
    /// A rules file (`sluice serve --qos`'s) for every replay: its classes
    /// and sharing order, its rules placing each recorded application by
    /// name and job (a trace records no uid or gid: rules by them place
    /// nothing, and a `user` or `group` level puts everyone in one group).
    #[arg(long)]
    qos: Option<PathBuf>,
    /// Write the table as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn run(a: WhatIfArgs) -> anyhow::Result<()> {
    let device = match a.device.as_str() {
        "auto" => Device::Auto,
        "recorded" => Device::Recorded,
        "hdd7200" => Device::Hdd7200,
        "calibrated" => Device::Calibrated,
        d => bail!("--device {d:?}: use auto, recorded, hdd7200 or calibrated"),
    };
    let darshan = a.trace.extension().is_some_and(|e| e == "darshan");
    // A Darshan log had no sluice server answering its processes: no
    // host's queueing to take out of its think times, unless asked.
    let profile = match &a.host {
        Some(p) => Some(HostProfile::load(p).map_err(anyhow::Error::msg)?),
        None => sluice_bench::host::load_default().map_err(anyhow::Error::msg)?,
    };
    let (host, hint) = match (&profile, a.no_host) {
        (_, true) => (None, None),
        (_, false) if darshan && a.host.is_none() => (None, Some("host: none (a Darshan log's processes had no sluice server; --host PROFILE to give one)")),
        (Some(h), false) => (Some(h.host()), None),
        (None, false) => (None, Some("host: none (an answer lets its process go at once); `sluice calibrate --host` measures this machine once, and what-if then uses it")),
    };
    // The disk is the profile's whether or not the replay has a host.
    let opts = Options { device, host, disk: profile.as_ref().and_then(HostProfile::disk) };
    let rec = if darshan {
        Recording::from_darshan(&super::darshan::dxt_json(&a.trace, a.layer.as_deref())?)?
    } else {
        let len = std::fs::metadata(&a.trace).with_context(|| format!("cannot read the trace {}", a.trace.display()))?.len();
        if len > TRACE_FILE_BYTES_MAX {
            bail!("{} is {} MiB; what-if reads traces up to {} MiB", a.trace.display(), len >> 20, TRACE_FILE_BYTES_MAX >> 20);
        }
        let text = std::fs::read_to_string(&a.trace).with_context(|| format!("cannot read the trace {}", a.trace.display()))?;
        Recording::parse(&text)?
    };
    let qos = match &a.qos {
        Some(p) => Some(plan(&rec, &sluice_server::qos::QosRules::load(p).map_err(anyhow::Error::msg)?)),
        None => None,
    };
    report(&rec, &a.policies, opts, qos.as_ref(), hint, a.json.as_deref())
}

/// Place each recorded application by `rules`, as the daemon would with
/// no uid or gid known.
fn plan(rec: &Recording, rules: &sluice_server::qos::QosRules) -> whatif::QosPlan {
    const UNKNOWN: u32 = u32::MAX;
    let apps = rec
        .app_names()
        .into_iter()
        .map(|n| {
            let class = rules.class_for(&n, UNKNOWN, UNKNOWN).map(|c| c.spec.name.clone());
            let keys = rules.share_keys(&n, UNKNOWN, UNKNOWN, class.as_deref());
            (n, (class, keys))
        })
        .collect();
    whatif::QosPlan { classes: rules.specs(), apps }
}

fn report(rec: &Recording, policies: &[String], opts: Options, qos: Option<&whatif::QosPlan>, hint: Option<&str>, json: Option<&std::path::Path>) -> anyhow::Result<()> {
    let w = whatif::what_if_with(rec, policies, opts, qos)?;
    print!("{}", whatif::table(&w));
    if let Some(h) = hint {
        println!("{h}");
    }
    if let Some(p) = json {
        write_json(p, &w)?;
        println!("json: {}", p.display());
    }
    Ok(())
}
