//! `sluice bench decomposition|interference|mix10|custom`: the seed's
//! experiments with real processes on a real disk.
//!
//! One OS process per rank (the `sluice` binary re-executed as
//! `sluice bench worker`), grouped into applications, each doing
//! synchronous I/O, against either the backing files directly (`direct`,
//! the seed's "POSIX" column) or a sluice server under a named policy.

pub mod cpu;
pub mod mount;
pub mod pattern;
pub mod repeat;
pub mod replay;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod worker;

use std::fmt;

/// Why a workload could not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadErrorKind {
    /// A bad option, scenario or state.
    Usage,
    /// A system call failed.
    Io,
    /// The sluice client reported an error.
    Client,
}

/// An error from a workload run.
#[derive(Debug)]
pub struct WorkloadError {
    pub kind: WorkloadErrorKind,
    pub message: String,
}

impl WorkloadError {
    pub(crate) fn usage(message: String) -> WorkloadError {
        WorkloadError { kind: WorkloadErrorKind::Usage, message }
    }

    pub(crate) fn io(what: String, e: std::io::Error) -> WorkloadError {
        WorkloadError { kind: WorkloadErrorKind::Io, message: format!("{what}: {e}") }
    }

    pub(crate) fn client(e: sluice_client::ClientError) -> WorkloadError {
        WorkloadError { kind: WorkloadErrorKind::Client, message: e.to_string() }
    }
}

impl fmt::Display for WorkloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for WorkloadError {}
