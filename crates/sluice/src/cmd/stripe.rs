//! `sluice setstripe` and `sluice getstripe`: a file's or directory's
//! layout on a cluster, in the spirit of Lustre's `lfs`.

use clap::Args;

use super::size::parse_size;
use sluice_client::server_addr;
use sluice_remote::{EntryKind, ErrorKind, LayoutRequest, StripedClient};

#[derive(Args)]
pub struct SetstripeArgs {
    /// Cluster address (default: $SLUICE_SERVER).
    #[arg(long)]
    server: Option<String>,
    /// Stripe size, a multiple of 512: bytes, or with K, M, G, T (binary
    /// units); 0 = inherit.
    #[arg(short = 'S', long = "stripe-size", default_value = "0", value_parser = parse_size)]
    size: u64,
    /// Objects per file; -1 = every data server, 0 = inherit.
    #[arg(short = 'c', long = "stripe-count", default_value_t = 0, allow_negative_numbers = true)]
    count: i32,
    /// Data server of the first object; -1 = any.
    #[arg(short = 'i', long = "stripe-index", default_value_t = -1, allow_negative_numbers = true)]
    index: i32,
    /// A new file (created empty with this layout) or a directory (its default).
    path: String,
}

#[derive(Args)]
pub struct GetstripeArgs {
    /// Cluster address (default: $SLUICE_SERVER).
    #[arg(long)]
    server: Option<String>,
    /// File or directory in the cluster's namespace.
    path: String,
}

fn connect(server: Option<&str>) -> anyhow::Result<StripedClient> {
    Ok(StripedClient::connect(&server_addr(server)?)?)
}

/// Accept `:path` as `cp` and `ls` write it.
fn ns_path(p: &str) -> &str {
    p.strip_prefix(':').unwrap_or(p)
}

pub fn set(a: SetstripeArgs) -> anyhow::Result<()> {
    let c = connect(a.server.as_deref())?;
    let req = LayoutRequest { stripe_bytes: a.size, count: a.count, start: a.index };
    let path = ns_path(&a.path);
    match c.lookup(path) {
        Ok(e) if e.kind == EntryKind::Dir => {
            c.set_dir_default(path, req).map_err(|e| anyhow::anyhow!("setstripe: {e}"))?;
        }
        Ok(_) => {
            anyhow::bail!("setstripe: {path:?} exists; a file's layout is set when it is created")
        }
        Err(e) if e.kind == ErrorKind::NotFound => {
            let f = c.create(path, req).map_err(|e| anyhow::anyhow!("setstripe: {e}"))?;
            c.close(&f)?;
        }
        Err(e) => anyhow::bail!("setstripe: {e}"),
    }
    Ok(())
}

pub fn get(a: GetstripeArgs) -> anyhow::Result<()> {
    let c = connect(a.server.as_deref())?;
    let path = ns_path(&a.path);
    let (e, objects) = c.objects(path).map_err(|e| anyhow::anyhow!("getstripe: {e}"))?;
    println!("{path}");
    match e.layout {
        None => {
            let d = e.default.unwrap_or(LayoutRequest::ROOT_DEFAULT);
            println!("stripe_count:  {} stripe_size:   {} stripe_offset: {}", d.count, d.stripe_bytes, d.start);
        }
        Some(l) => {
            println!("lmm_stripe_count:  {}", l.count);
            println!("lmm_stripe_size:   {}", l.stripe_bytes);
            println!("lmm_stripe_offset: {}", l.start);
            println!("lmm_file_id:       0x{:x}", e.id);
            println!("\tobdidx\tobject\tsize\tserver\tpath");
            for o in objects {
                let size = o.size.map_or_else(|err| format!("unavailable ({err})"), |s| s.to_string());
                println!("\t{}\t{}\t{}\t{}\t{}", o.server, o.object, size, o.addr, o.path);
            }
        }
    }
    Ok(())
}
