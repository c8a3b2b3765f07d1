//! `sluice ls :DIR`: list a directory on the server (directories end in /).

use clap::Args;

use super::remote::{connect, remote_path};

#[derive(Args)]
pub struct LsArgs {
    /// Server address (default: $SLUICE_SERVER).
    #[arg(long)]
    server: Option<String>,
    /// Directory on the server, written :DIR.
    dir: String,
}

pub fn run(a: LsArgs) -> anyhow::Result<()> {
    let path = remote_path(&a.dir).ok_or_else(|| anyhow::anyhow!("ls: {:?} is not on the server (write :DIR)", a.dir))?;
    let client = connect(a.server.as_deref())?;
    let entries = client.readdir(path).map_err(|e| anyhow::anyhow!("ls: {e}"))?;
    for e in entries {
        let slash = if e.kind == sluice_client::FileKind::Dir { "/" } else { "" };
        println!("{}{slash}", e.name);
    }
    Ok(())
}
