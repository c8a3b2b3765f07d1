//! Helpers shared by the client commands: `:path` arguments and connecting.

use sluice_client::server_addr;
use sluice_remote::Remote;

/// The server path of a `:path` argument, or `None` for a local one.
pub fn remote_path(arg: &str) -> Option<&str> {
    arg.strip_prefix(':')
}

/// Connect to `--server ADDR`, else `$SLUICE_SERVER`: one server or a
/// cluster's metadata role.
pub fn connect(server: Option<&str>) -> anyhow::Result<Remote> {
    let addr = server_addr(server)?;
    Ok(Remote::connect(&addr)?)
}

/// How a client waits for a silent or restarting server; flattened into
/// the commands that talk to one.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Patience {
    /// Seconds before a silent server is reported ("not responding, still
    /// trying") or, with --soft, the call fails with ETIMEDOUT (default:
    /// $SLUICE_TIMEOUT, else 30).
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<u64>,
    /// Fail calls with ETIMEDOUT after --timeout instead of waiting for the
    /// server (NFS's soft mount).
    #[arg(long)]
    pub soft: bool,
}

impl Patience {
    /// The environment variables the client library reads, for this
    /// process (before any client is made) and the programs it starts.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut v = Vec::new();
        if let Some(t) = self.timeout {
            v.push((sluice_client::TIMEOUT_ENV, t.max(1).to_string()));
        }
        if self.soft {
            v.push((sluice_client::SOFT_ENV, "1".to_string()));
        }
        v
    }

    /// Apply to this process: called first thing, while it has one thread.
    pub fn apply(&self) {
        for (k, v) in self.env() {
            std::env::set_var(k, v);
        }
    }
}
