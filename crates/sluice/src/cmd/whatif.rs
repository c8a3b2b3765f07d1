//! `sluice what-if TRACE --policy P...`: replay a live trace (`sluice serve
//! --trace`) under other policies and print, per application, what
//! happened and what would have (`sluice_sim::whatif`).

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use sluice_sim::whatif::{self, Device, Recording, TRACE_FILE_BYTES_MAX};

use super::output::write_json;

#[derive(Args)]
pub struct WhatIfArgs {
    /// A trace written by `sluice serve --trace PATH`.
    trace: PathBuf,
    /// A policy to replay under; repeat for several.
    #[arg(long = "policy", default_values_t = ["fifo".to_string(), "aioli".to_string()])]
    policies: Vec<String>,
    /// The replayed device: recorded (the cost model the trace's own
    /// dispatches imply) or hdd7200 (the emulated 7200 rpm disk).
    #[arg(long, default_value = "recorded")]
    device: String,
    /// Write the table as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn run(a: WhatIfArgs) -> anyhow::Result<()> {
    let device = match a.device.as_str() {
        "recorded" => Device::Recorded,
        "hdd7200" => Device::Hdd7200,
        d => bail!("--device {d:?}: use recorded or hdd7200"),
    };
    let len = std::fs::metadata(&a.trace).with_context(|| format!("cannot read the trace {}", a.trace.display()))?.len();
    if len > TRACE_FILE_BYTES_MAX {
        bail!("{} is {} MiB; what-if reads traces up to {} MiB", a.trace.display(), len >> 20, TRACE_FILE_BYTES_MAX >> 20);
    }
    let text = std::fs::read_to_string(&a.trace).with_context(|| format!("cannot read the trace {}", a.trace.display()))?;
    let rec = Recording::parse(&text)?;
    let w = whatif::what_if(&rec, &a.policies, device)?;
    print!("{}", whatif::table(&w));
    if let Some(p) = a.json {
        write_json(&p, &w)?;
        println!("json: {}", p.display());
    }
    Ok(())
}
