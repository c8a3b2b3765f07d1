//! # sluice-remote: the client side of sluice clusters and forwarder sets
//!
//! A cluster is one metadata role (`sluice-meta`) and N data servers
//! (ordinary `sluice-server`s whose file `objects/<id>` holds one object of
//! a file). This crate is everything a client needs, and nothing a server
//! does: [`StripedClient`] asks the metadata role for a file's layout,
//! opens its objects on the data servers, and maps each read or write (list
//! I/O included) onto one list-I/O message per server; [`Forwarders`]
//! sends each file's calls to its home among several servers over one
//! shared root; [`Remote`] puts one server, a cluster or a forwarder set
//! behind the single-server client's calls, for the FUSE mount, the
//! interposer, the commands and Python; [`proto`] is the metadata
//! protocol both sides speak. It links no server and no database, so the
//! interposer that is injected into every process stays small.
//!
//! ```no_run
//! use sluice_remote::{StripedClient, LayoutRequest};
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
mod client;
mod entry;
mod error;
mod forward;
pub mod proto;
mod remote;

pub use ahead::{READ_AHEAD_BYTES_MAX, READ_AHEAD_TOTAL_MAX, READ_AHEAD_TTL};
pub use client::{ObjectInfo, StripedClient, StripedFile, MESSAGES_IN_FLIGHT_MAX, OBJECTS_DIR, STRIPED_LIST_BYTES_MAX, STRIPED_LIST_PIECES_MAX};
pub use entry::{normalize, META_NAME_BYTES_MAX, META_PATH_BYTES_MAX};
pub use error::{Error, ErrorKind, Result};
pub use proto::{MetaReply, MetaRequest, CLUSTER_ERRNO, META_FRAME_BYTES_MAX};
pub use forward::{address_set, home_among, path_key, Forwarders, Home, FAILOVER_SILENCE, FORWARDERS_MAX, HOME_ENV, PROBE_EVERY, RETIRED_MAX};
pub use remote::{file_stat, Cluster, GroupTicket, Remote, RemoteKind, RemoteResult, REMOTE_FILES_MAX, STRIPED_BLKSIZE_MAX};
pub use sluice_proto::meta::{Entry, EntryKind};
pub use sluice_stripe::{Layout, LayoutRequest};
