//! `sluice man DIR` (hidden): write the manual pages, generated from the
//! command-line definitions with `clap_mangen`: `sluice.1`, and one page
//! per subcommand, nested ones included (`sluice-serve.1`,
//! `sluice-bench-matrix.1`, ...). `make install` runs it into
//! `$PREFIX/share/man/man1`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Command};

#[derive(Args)]
pub struct ManArgs {
    /// Directory to write the pages into (created if missing).
    dir: PathBuf,
}

/// Write every page of `cli` (the whole command, as `main` defines it).
pub fn run(a: ManArgs, mut cli: Command) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.dir).with_context(|| format!("creating {}", a.dir.display()))?;
    // Building gives each subcommand its display name ("sluice-serve") and
    // usage line ("sluice serve [OPTIONS] ...").
    cli.build();
    let written = write_pages(&a.dir, &cli)?;
    println!("sluice: {written} manual pages in {}", a.dir.display());
    Ok(())
}

/// Write `cmd`'s page and its visible subcommands' pages; how many.
fn write_pages(dir: &Path, cmd: &Command) -> anyhow::Result<usize> {
    let name = cmd.get_display_name().unwrap_or_else(|| cmd.get_name()).to_string();
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut page)?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
    let mut written = 1;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        written += write_pages(dir, sub)?;
    }
    Ok(written)
}
