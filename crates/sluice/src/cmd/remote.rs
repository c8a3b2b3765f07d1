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
    connect_trusting(server, None)
}

/// `connect`, trusting a server on a Unix socket that runs as
/// `server_uid` (`--server-uid`) besides root.
pub fn connect_trusting(server: Option<&str>, server_uid: Option<u32>) -> anyhow::Result<Remote> {
    let addr = server_addr(server)?;
    let mut opts = sluice_client::ConnectOptions::default();
    opts.server_uid = server_uid.or(opts.server_uid);
    Ok(Remote::connect_with(&addr, opts)?)
}

/// How a client waits for a silent or restarting server, and which
/// server it trusts; flattened into the commands that talk to one.
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
    /// A server on a Unix socket must run as root or as this uid (default:
    /// $SLUICE_SERVER_UID, else your own uid); any other is refused before
    /// anything is sent to it.
    #[arg(long, value_name = "UID")]
    pub server_uid: Option<u32>,
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
        if let Some(u) = self.server_uid {
            v.push((sluice_client::SERVER_UID_ENV, u.to_string()));
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
