//! The core's error type. Every refusal is explicit: nothing is dropped.

use std::fmt;

/// Why the scheduler refused a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// `queued_requests_max` requests are already waiting.
    QueueFull,
    /// Admitting the request would exceed `queued_bytes_max`.
    QueueBytesFull,
    /// `files_max` distinct files already have pending work.
    TooManyFiles,
    /// `apps_max` applications are already registered.
    TooManyApps,
    /// The request has length 0, or `offset + len` overflows.
    InvalidRequest,
    /// The request is longer than `request_bytes_max`.
    RequestTooLarge,
    /// `complete` named a dispatch that is not in flight.
    UnknownDispatch,
    /// A weight outside `0..=weight_max`.
    InvalidWeight,
    /// `background_held_max` background requests are already held.
    BackgroundFull,
}

/// An error from the scheduling core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    /// The bound that was hit, where there is one.
    pub limit: u64,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, limit: u64) -> Error {
        Error { kind, limit }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = self.limit;
        match self.kind {
            ErrorKind::QueueFull => write!(f, "scheduler queue full ({l} requests queued, queued_requests_max)"),
            ErrorKind::QueueBytesFull => write!(f, "scheduler queue full ({l} bytes, queued_bytes_max)"),
            ErrorKind::TooManyFiles => write!(f, "too many files with pending I/O (files_max = {l})"),
            ErrorKind::TooManyApps => write!(f, "too many applications (apps_max = {l})"),
            ErrorKind::InvalidRequest => write!(f, "invalid request: zero length or offset + length overflows"),
            ErrorKind::RequestTooLarge => write!(f, "request larger than request_bytes_max ({l} bytes)"),
            ErrorKind::UnknownDispatch => write!(f, "completion for a dispatch that is not in flight"),
            ErrorKind::InvalidWeight => write!(f, "weight must be between 0 (background) and {l}"),
            ErrorKind::BackgroundFull => write!(f, "background queue full ({l} background requests held, background_held_max)"),
        }
    }
}

impl std::error::Error for Error {}
