//! `sluice calibrate`: measure the device under a directory and write its
//! cost model as TOML, for `sluice serve --device-model` and `sluice sim
//! --device-model`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use sluice_bench::calibrate::{self, CalibrateConfig};

#[derive(Args)]
pub struct CalibrateArgs {
    /// A directory on the device to measure (a scratch file is made there and removed).
    #[arg(long)]
    root: PathBuf,
    /// Measure with O_DIRECT (what `sluice serve --direct` sees).
    #[arg(long)]
    direct: bool,
    /// Write the model here as TOML.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Milliseconds per measured cell (12 cells).
    #[arg(long, default_value_t = 1_000)]
    cell_ms: u64,
    /// Size of the scratch file (random reads spread over it; K, M, G, T).
    #[arg(long, default_value = "256M", value_parser = super::size::parse_size_positive)]
    file_size: u64,
}

pub fn run(a: CalibrateArgs) -> anyhow::Result<()> {
    let cfg = CalibrateConfig { root: a.root.clone(), direct: a.direct, file_bytes: a.file_size, cell_ms: a.cell_ms };
    let model = calibrate::run(&cfg).map_err(anyhow::Error::msg)?;
    print!("{}", calibrate::table(&model));
    if let Some(path) = &a.out {
        std::fs::write(path, model.to_toml()).with_context(|| format!("writing {}", path.display()))?;
        println!("model: {}", path.display());
    }
    Ok(())
}
