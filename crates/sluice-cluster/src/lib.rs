//! # sluice-cluster: striped files over several sluice servers
//!
//! A cluster is one metadata role and N data servers. The metadata role
//! ([`MetaServer`], backed by [`MetaStore`], a `redb` database) owns the
//! namespace and each file's [`Layout`]; the data servers are ordinary
//! `sluice-server`s whose file `objects/<id>` holds one object of a file.
//! [`StripedClient`] asks the metadata role for a file's layout, opens its
//! objects on the data servers, and maps each read or write (list I/O
//! included) onto one list-I/O message per server, sent in parallel.
//! [`LocalCluster`] starts a whole cluster in one process (`sluice cluster`
//! and the tests).
//!
//! ```no_run
//! use sluice_cluster::{StripedClient, LayoutRequest};
//!
//! let c = StripedClient::connect("unix:/tmp/cluster/meta.sock").unwrap();
//! let f = c.create("big.dat", LayoutRequest { stripe_bytes: 1 << 20, count: -1, start: -1 }).unwrap();
//! c.pwrite(&f, &vec![7u8; 4 << 20], 0).unwrap();
//! assert_eq!(c.size(&f).unwrap(), 4 << 20);
//! ```
//!
//! The file size is not stored: it is the largest file offset any object
//! holds plus one ([`sluice_stripe::file_size`]), read from the objects'
//! sizes, so concurrent writers on different servers never race on it.

mod ahead;
pub mod bench;
mod client;
mod error;
mod local;
mod meta;
mod net;
mod proto;
mod remote;
mod server;

pub use ahead::{READ_AHEAD_BYTES_MAX, READ_AHEAD_TOTAL_MAX, READ_AHEAD_TTL};
pub use client::{ObjectInfo, StripedClient, StripedFile, OBJECTS_DIR};
pub use error::{Error, ErrorKind, Result};
pub use local::{LocalCluster, LocalClusterConfig, DATA_SOCKET_PREFIX, META_SOCKET};
pub use meta::{Entry, EntryKind, MetaStore, META_DIR_ENTRIES_MAX, META_RENAME_ENTRIES_MAX};
pub use proto::{MetaReply, MetaRequest, CLUSTER_ERRNO, META_FRAME_BYTES_MAX};
pub use remote::{file_stat, Cluster, Remote, RemoteKind, RemoteResult, REMOTE_FILES_MAX, STRIPED_BLKSIZE_MAX};
pub use server::{MetaHandle, MetaServer, META_CONNECTIONS_MAX};
pub use sluice_stripe::{Layout, LayoutRequest};
