//! # sluice-launch: a local cluster in one process
//!
//! [`LocalCluster`]: a metadata role and N data servers in one process,
//! each data server with its own sub-directory and Unix socket under one
//! root (what `sluice cluster` runs, and what the benchmarks and tests
//! use). Layout of `ROOT`: `meta.sock`, `meta/meta.redb`, and per server
//! `data-<i>/` (its root, with `objects/`) and `data-<i>.sock`.
//!
//! ```
//! use sluice_launch::{LocalCluster, LocalClusterConfig};
//! let root = std::env::temp_dir().join(format!("sluice-launch-doc-{}", std::process::id()));
//! let mut cluster = LocalCluster::start(LocalClusterConfig::new(&root, 2)).unwrap();
//! assert!(cluster.addr().ends_with("meta.sock"));
//! cluster.shutdown().unwrap();
//! std::fs::remove_dir_all(&root).unwrap();
//! ```
//!
//! Its errors are the cluster library's ([`sluice_remote::Error`]):
//! starting or stopping a role fails as a cluster call does, with the same
//! kinds and errno, so a caller handles one error type for both.
//!
//! Invariant: the launcher holds no data path of its own; clients reach
//! the roles through their sockets only.

use std::path::{Path, PathBuf};

use sluice_core::PolicyConfig;
use sluice_server::{DeviceKind, Listen, Server, ServerConfig, ServerHandle, Summary};

use sluice_meta::{MetaHandle, MetaServer, MetaStore};
use sluice_remote::{Error, ErrorKind, Result, OBJECTS_DIR};

/// The metadata role's socket, under the cluster root.
pub const META_SOCKET: &str = "meta.sock";
/// Data server `i` serves `data-<i>/` on `data-<i>.sock`.
pub const DATA_SOCKET_PREFIX: &str = "data-";

/// What `LocalCluster::start` needs.
#[derive(Clone, Debug)]
pub struct LocalClusterConfig {
    pub root: PathBuf,
    pub servers: u32,
    /// Applied to every data server.
    pub device: DeviceKind,
    pub policy: PolicyConfig,
    pub direct: bool,
}

impl LocalClusterConfig {
    /// `servers` data servers under `root`, real device, aioli.
    pub fn new(root: impl Into<PathBuf>, servers: u32) -> LocalClusterConfig {
        LocalClusterConfig { root: root.into(), servers, device: DeviceKind::Real, policy: PolicyConfig::from_name("aioli").expect("aioli is a known policy"), direct: false }
    }
}

/// A running local cluster; dropping it stops every role.
pub struct LocalCluster {
    cfg: LocalClusterConfig,
    meta: Option<MetaHandle>,
    data: Vec<Option<ServerHandle>>,
}

fn server_error(i: u32, e: sluice_server::Error) -> Error {
    Error::new(ErrorKind::DataServer, e.errno, format!("data server {i}: {e}"))
}

impl LocalCluster {
    /// Create the directories, start the data servers, then the metadata
    /// role. Restarting on the same root keeps every file.
    pub fn start(cfg: LocalClusterConfig) -> Result<LocalCluster> {
        let meta_dir = cfg.root.join("meta");
        std::fs::create_dir_all(&meta_dir).map_err(|e| Error::io(&format!("create {}", meta_dir.display()), &e))?;
        let store = MetaStore::open(&meta_dir.join("meta.redb"), cfg.servers)?;
        let mut c = LocalCluster { cfg, meta: None, data: Vec::new() };
        for i in 0..c.cfg.servers {
            let objects = c.data_root(i).join(OBJECTS_DIR);
            std::fs::create_dir_all(&objects).map_err(|e| Error::io(&format!("create {}", objects.display()), &e))?;
            c.data.push(None);
            c.start_data(i)?;
        }
        let addrs = (0..c.cfg.servers).map(|i| c.data_addr(i)).collect();
        c.meta = Some(MetaServer::start(store, addrs, &c.cfg.root.join(META_SOCKET))?);
        Ok(c)
    }

    /// The address clients use (`SLUICE_SERVER`).
    pub fn addr(&self) -> String {
        format!("unix:{}", self.cfg.root.join(META_SOCKET).display())
    }

    /// Data server `i`'s directory.
    pub fn data_root(&self, i: u32) -> PathBuf {
        self.cfg.root.join(format!("{DATA_SOCKET_PREFIX}{i}"))
    }

    /// Data server `i`'s address.
    pub fn data_addr(&self, i: u32) -> String {
        format!("unix:{}", socket_path(&self.cfg.root, i).display())
    }

    /// Stop data server `i` (draining it); its clients see it disconnect.
    pub fn stop_data(&mut self, i: u32) -> Result<Option<Summary>> {
        let slot = self.data.get_mut(i as usize).ok_or_else(|| Error::invalid(format!("no data server {i}")))?;
        match slot.take() {
            Some(mut h) => h.shutdown().map(Some).map_err(|e| server_error(i, e)),
            None => Ok(None),
        }
    }

    /// Start data server `i` again (no-op when running).
    pub fn start_data(&mut self, i: u32) -> Result<()> {
        if self.data.get(i as usize).ok_or_else(|| Error::invalid(format!("no data server {i}")))?.is_some() {
            return Ok(());
        }
        let mut sc = ServerConfig::new(self.data_root(i), Listen::Unix(socket_path(&self.cfg.root, i)));
        (sc.device, sc.policy, sc.direct) = (self.cfg.device, self.cfg.policy.clone(), self.cfg.direct);
        self.data[i as usize] = Some(Server::start(sc).map_err(|e| server_error(i, e))?);
        Ok(())
    }

    /// Stop the metadata role, then every data server; their summaries.
    pub fn shutdown(&mut self) -> Result<Vec<Summary>> {
        if let Some(mut m) = self.meta.take() {
            m.shutdown();
        }
        let mut out = Vec::new();
        for i in 0..self.data.len() as u32 {
            out.extend(self.stop_data(i)?);
        }
        Ok(out)
    }
}

fn socket_path(root: &Path, i: u32) -> PathBuf {
    root.join(format!("{DATA_SOCKET_PREFIX}{i}.sock"))
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}
