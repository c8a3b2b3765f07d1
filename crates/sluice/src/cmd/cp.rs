//! `sluice cp SRC DST`: copy a file into, out of, or within the server (or
//! cluster); a path written `:path` is on the server. Transfers with one
//! server keep `WINDOW` requests of `CHUNK_BYTES` in flight; with a
//! cluster each batch of `WINDOW * CHUNK_BYTES` is one striped call, cut
//! per data server and sent to all of them at once.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use anyhow::{anyhow, bail, Context};
use clap::Args;
use sluice_client::Fd;
use sluice_remote::Remote;

use super::remote::{connect_trusting, remote_path};

/// Bytes per request: large enough to amortise a round trip (~40 us) over
/// ~0.3 ms of transfer.
const CHUNK_BYTES: usize = 1 << 20;
/// Requests in flight: keeps the server's queue fed while the client
/// copies a chunk.
const WINDOW: usize = 8;

#[derive(Args)]
pub struct CpArgs {
    /// Server address (default: $SLUICE_SERVER).
    #[arg(long)]
    server: Option<String>,
    /// A server on a Unix socket must run as root or as this uid (default:
    /// $SLUICE_SERVER_UID, else your own uid).
    #[arg(long, value_name = "UID")]
    server_uid: Option<u32>,
    /// Source: a local path, or :path on the server.
    src: String,
    /// Destination: a local path, or :path on the server.
    dst: String,
}

/// One side of the copy.
enum End<'a> {
    Local(File),
    Remote(&'a Remote, Fd),
}

impl End<'_> {
    /// Fill `buf` from `at`; fewer bytes only at end of file.
    fn read_batch(&self, buf: &mut [u8], at: u64) -> anyhow::Result<usize> {
        match self {
            End::Local(f) => fill(buf, at, |b, o| Ok(f.read_at(b, o)?)),
            End::Remote(r, fd) => Ok(r.read_pipelined(*fd, buf, at, CHUNK_BYTES)?),
        }
    }

    fn write_batch(&self, data: &[u8], at: u64) -> anyhow::Result<()> {
        match self {
            End::Local(f) => Ok(f.write_all_at(data, at)?),
            End::Remote(r, fd) => Ok(r.write_pipelined(*fd, data, at, CHUNK_BYTES)?),
        }
    }
}

/// Read into all of `buf` from `at` with `read` (short only at end of file).
fn fill(buf: &mut [u8], at: u64, mut read: impl FnMut(&mut [u8], u64) -> anyhow::Result<usize>) -> anyhow::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        let got = read(&mut buf[n..], at + n as u64)?;
        if got == 0 {
            break;
        }
        n += got;
    }
    Ok(n)
}

fn base_name(path: &str) -> anyhow::Result<&str> {
    Path::new(path).file_name().and_then(|n| n.to_str()).ok_or_else(|| anyhow!("{path:?} has no file name"))
}

fn open_src<'a>(c: &'a Remote, src: &str) -> anyhow::Result<End<'a>> {
    match remote_path(src) {
        Some(p) => Ok(End::Remote(c, c.open(p, libc::O_RDONLY, 0)?)),
        None => Ok(End::Local(File::open(src).with_context(|| format!("cannot open {src}"))?)),
    }
}

fn open_dst<'a>(c: &'a Remote, src: &str, dst: &str) -> anyhow::Result<End<'a>> {
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC;
    match remote_path(dst) {
        Some(p) => {
            let is_dir = c.stat(p).map(|s| s.mode & libc::S_IFMT == libc::S_IFDIR).unwrap_or(false) || p.is_empty();
            let name = || base_name(src.trim_start_matches(':'));
            // `:/abs` is refused by the server exactly as it is as a source.
            let target = match (is_dir, p.trim_end_matches('/')) {
                (true, "") if !p.starts_with('/') => name()?.to_string(),
                (true, dir) => format!("{dir}/{}", name()?),
                (false, _) => p.to_string(),
            };
            Ok(End::Remote(c, c.open(&target, flags, 0o644)?))
        }
        None => {
            let mut target = std::path::PathBuf::from(dst);
            if target.is_dir() {
                target.push(base_name(src.trim_start_matches(':'))?);
            }
            Ok(End::Local(File::create(&target).with_context(|| format!("cannot create {}", target.display()))?))
        }
    }
}

pub fn run(a: CpArgs) -> anyhow::Result<()> {
    if remote_path(&a.src).is_none() && remote_path(&a.dst).is_none() {
        bail!("cp: neither {:?} nor {:?} is on the server (write the server side as :path)", a.src, a.dst);
    }
    let client = connect_trusting(a.server.as_deref(), a.server_uid)?;
    let copy = || -> anyhow::Result<u64> {
        let src = open_src(&client, &a.src)?;
        let dst = open_dst(&client, &a.src, &a.dst)?;
        let mut buf = vec![0u8; CHUNK_BYTES * WINDOW];
        let mut at = 0u64;
        loop {
            let n = src.read_batch(&mut buf, at)?;
            dst.write_batch(&buf[..n], at)?;
            at += n as u64;
            if n < buf.len() {
                return Ok(at);
            }
        }
    };
    copy().map_err(|e| anyhow!("cp: {e:#}"))?;
    Ok(())
}
