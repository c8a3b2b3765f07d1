//! Helpers shared by the client commands: `:path` arguments and connecting.

use sluice_client::server_addr;
use sluice_cluster::Remote;

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
