//! `sluice qos list|stats|set FILE|rm CLASS|clear`: the service classes of
//! a running server (docs/qos.md), changed without a restart. Only root or
//! the server's own user on its host, or a key holder over TCP, may.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

#[derive(Subcommand)]
pub enum QosCmd {
    /// The classes and rules in force, as a rules file.
    List,
    /// Each class's counters: waiting, admitted, dispatched, expired, guaranteed.
    Stats,
    /// Replace the classes and rules with those of a rules file.
    Set {
        /// The rules file (TOML, at most 60 KiB; docs/qos.md).
        file: PathBuf,
    },
    /// Remove a class and the rules that name it.
    Rm { class: String },
    /// Remove every class: applications share the device as without --qos.
    Clear,
}

#[derive(Args)]
pub struct QosArgs {
    /// Server address (default: $SLUICE_SERVER).
    #[arg(long, global = true)]
    server: Option<String>,
    /// A server on a Unix socket must run as root or as this uid (default:
    /// $SLUICE_SERVER_UID, else your own uid).
    #[arg(long, value_name = "UID", global = true)]
    server_uid: Option<u32>,
    #[command(subcommand)]
    cmd: QosCmd,
}

pub fn run(a: QosArgs) -> anyhow::Result<()> {
    let command = match &a.cmd {
        QosCmd::List => "list".to_string(),
        QosCmd::Stats => "stats".to_string(),
        QosCmd::Set { file } => format!("set\n{}", std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?),
        QosCmd::Rm { class } => format!("rm {class}"),
        QosCmd::Clear => "clear".to_string(),
    };
    let addr = sluice_client::server_addr(a.server.as_deref())?;
    let mut opts = sluice_client::ConnectOptions { app: Some("sluice-qos".into()), shm: false, ..Default::default() };
    opts.server_uid = a.server_uid.or(opts.server_uid);
    let client = sluice_client::Client::connect_with(&addr, opts).with_context(|| format!("connecting to {addr}"))?;
    let answer = client.qos(&command).map_err(|e| anyhow::anyhow!("qos: {e}"))?;
    print!("{answer}");
    Ok(())
}
