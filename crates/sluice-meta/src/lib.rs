//! # sluice-meta: a cluster's metadata role
//!
//! [`MetaStore`] keeps the namespace and each file's layout in a `redb`
//! database, or in an etcd cluster that several roles may share (each
//! change one transaction, `kv.rs`, `etcd.rs`); [`MetaServer`] serves
//! it over the metadata protocol (`sluice_remote::proto`) on a Unix or TCP
//! socket (TCP clients prove the shared key first). Clients are in
//! `sluice-remote`; a whole cluster in one process is
//! `sluice_launch::LocalCluster`.

mod etcd;
mod kv;
mod server;
mod store;

pub use server::{MetaHandle, MetaServer, MetaTimeouts, META_CONNECTIONS_MAX};
pub use store::{MetaStore, META_DIR_ENTRIES_MAX, META_ID_BLOCK, META_RENAME_ENTRIES_MAX};
