//! `sluice ls :DIR`: list a directory on the server (directories end in /).

use clap::Args;

use super::remote::{connect_trusting, remote_path};

#[derive(Args)]
pub struct LsArgs {
    /// Server address (default: $SLUICE_SERVER).
    #[arg(long)]
    server: Option<String>,
    /// A server on a Unix socket must run as root or as this uid (default:
    /// $SLUICE_SERVER_UID, else your own uid).
    #[arg(long, value_name = "UID")]
    server_uid: Option<u32>,
    /// Directory on the server, written :DIR.
    dir: String,
}

pub fn run(a: LsArgs) -> anyhow::Result<()> {
    let path = remote_path(&a.dir).ok_or_else(|| anyhow::anyhow!("ls: {:?} is not on the server (write :DIR)", a.dir))?;
    let client = connect_trusting(a.server.as_deref(), a.server_uid)?;
    let entries = client.readdir(path).map_err(|e| anyhow::anyhow!("ls: {e}"))?;
    for e in entries {
        let slash = if e.kind == sluice_client::FileKind::Dir { "/" } else { "" };
        println!("{}{slash}", e.name);
    }
    Ok(())
}
