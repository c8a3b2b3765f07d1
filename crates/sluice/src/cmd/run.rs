//! `sluice run [--server ADDR] [--prefix PATH] [--app NAME] -- CMD ARGS…`:
//! run CMD with the interposer `libsluice_preload.so` preloaded, so that
//! its file calls under PATH go to the server. The library is looked up
//! at `$SLUICE_PRELOAD`, next to this executable, then in `../lib`.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use clap::Args;

/// File name of the interposer library.
pub const PRELOAD_LIB: &str = "libsluice_preload.so";
/// Environment variable overriding where the library is.
pub const PRELOAD_ENV: &str = "SLUICE_PRELOAD";
/// Environment variable carrying the prefix to the library.
pub use sluice_client::PREFIX_ENV;
/// The prefix when none is given.
pub const PREFIX_DEFAULT: &str = "/sluice";

#[derive(Args)]
pub struct RunArgs {
    /// Server address (default: $SLUICE_SERVER).
    #[arg(long)]
    server: Option<String>,
    /// Local path that stands for the server root; need not exist.
    #[arg(long, default_value = PREFIX_DEFAULT)]
    prefix: PathBuf,
    /// Application id (default: $SLUICE_APP, else each program's name).
    #[arg(long)]
    app: Option<String>,
    #[command(flatten)]
    patience: super::remote::Patience,
    /// The command and its arguments.
    #[arg(required = true, last = true, allow_hyphen_values = true)]
    cmd: Vec<OsString>,
}

/// Where `libsluice_preload.so` is: `$SLUICE_PRELOAD`, else next to `exe`,
/// else in `exe/../lib`.
pub fn find_library(exe: &Path, overridden: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(p) = overridden {
        if p.is_file() {
            return Ok(p);
        }
        bail!("{PRELOAD_ENV}={} is not a file", p.display());
    }
    let dir = exe.parent().context("the sluice executable has no directory")?;
    let candidates = [dir.join(PRELOAD_LIB), dir.join("../lib").join(PRELOAD_LIB)];
    candidates.iter().find(|p| p.is_file()).cloned().with_context(|| format!("cannot find {PRELOAD_LIB} next to {} or in ../lib (build it, or set {PRELOAD_ENV})", exe.display()))
}

/// `LD_PRELOAD` with `lib` appended to `existing`.
pub fn preload_value(existing: Option<OsString>, lib: &Path) -> OsString {
    match existing.filter(|e| !e.is_empty()) {
        Some(mut e) => {
            e.push(":");
            e.push(lib);
            e
        }
        None => lib.as_os_str().to_owned(),
    }
}

/// Replace this process with CMD; returns only on failure.
pub fn run(a: RunArgs) -> anyhow::Result<()> {
    let server = sluice_client::server_addr(a.server.as_deref())?;
    let exe = std::env::current_exe().context("cannot locate the sluice executable")?;
    let lib = find_library(&exe, std::env::var_os(PRELOAD_ENV).map(PathBuf::from))?;
    let lib = lib.canonicalize().with_context(|| format!("cannot resolve {}", lib.display()))?;
    let prefix = std::path::absolute(&a.prefix).with_context(|| format!("bad prefix {}", a.prefix.display()))?;
    let (prog, args) = a.cmd.split_first().context("no command given")?;
    let mut cmd = Command::new(prog);
    cmd.args(args).env("LD_PRELOAD", preload_value(std::env::var_os("LD_PRELOAD"), &lib)).env(sluice_client::SERVER_ENV, &server).env(PREFIX_ENV, &prefix);
    cmd.envs(a.patience.env());
    if let Some(app) = &a.app {
        cmd.env(sluice_client::APP_ENV, app);
    }
    let e = cmd.exec();
    Err(e).with_context(|| format!("cannot run {}", prog.to_string_lossy()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_is_appended_to_an_existing_preload() {
        let lib = Path::new("/x/libsluice_preload.so");
        assert_eq!(preload_value(None, lib), "/x/libsluice_preload.so");
        assert_eq!(preload_value(Some("".into()), lib), "/x/libsluice_preload.so");
        assert_eq!(preload_value(Some("/a.so".into()), lib), "/a.so:/x/libsluice_preload.so");
    }

    #[test]
    fn a_missing_library_is_a_clear_error() {
        let e = find_library(Path::new("/nonexistent/bin/sluice"), None).unwrap_err().to_string();
        assert!(e.contains(PRELOAD_LIB), "{e}");
        let e = find_library(Path::new("/nonexistent/bin/sluice"), Some("/nonexistent.so".into())).unwrap_err().to_string();
        assert!(e.contains(PRELOAD_ENV), "{e}");
    }
}
