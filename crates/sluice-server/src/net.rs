//! The connected stream type is `sluice_net::Stream`; the listener is
//! `sluice_net::Listener`.

/// A connected client: the workspace's one socket type.
pub use sluice_net::Stream;
