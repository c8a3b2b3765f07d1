//! The request model shared by every policy and every driver.
//!
//! Time is a plain `u64` count of nanoseconds ([`Nanos`]) chosen by the
//! driver: the daemon passes a monotonic clock reading, the simulator its
//! virtual time. The core never reads a clock itself.

/// Nanoseconds on the driver's clock.
pub type Nanos = u64;

/// An application: the unit of fairness (a job, an MPI program, a `cat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AppId(pub u32);

/// One issuer inside an application: a process, or a connection.
/// Synchronous-reader detection is per `(AppId, ClientId)` stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClientId(pub u32);

/// A file on the device, as numbered by the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FileId(pub u64);

/// The driver's name for one request; returned inside dispatches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

/// The scheduler's name for one dispatch; handed back on completion.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DispatchId(pub u64);

/// Direction of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    Read,
    Write,
}

/// One POSIX-level request as the I/O server sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub id: RequestId,
    pub app: AppId,
    pub client: ClientId,
    pub file: FileId,
    pub op: Op,
    pub offset: u64,
    /// Length in bytes; must be at least 1.
    pub len: u64,
}

impl Request {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }

    /// Whether the byte ranges of `self` and `other` share a byte.
    pub fn overlaps(&self, other: &Request) -> bool {
        self.file == other.file && self.offset < other.end() && other.offset < self.end()
    }
}

/// An aggregate handed to the device: one file, one op, one contiguous byte
/// range `[offset, offset + len)`, covering exactly the member requests.
///
/// Members are sorted by offset. Read members may overlap each other (two
/// applications reading the same bytes); write members never do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dispatch {
    pub id: DispatchId,
    pub file: FileId,
    pub op: Op,
    pub offset: u64,
    pub len: u64,
    pub members: Vec<Request>,
}

impl Dispatch {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }

    /// The same dispatch with an empty member list (no allocation).
    pub(crate) fn clone_header(&self) -> Dispatch {
        Dispatch { id: self.id, file: self.file, op: self.op, offset: self.offset, len: self.len, members: Vec::new() }
    }
}

/// What the device should do now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Issue this aggregate, then call `complete` with its id.
    Dispatch(Dispatch),
    /// Requests are queued, but the policy prefers to keep the device for a
    /// request it expects soon. Call `next` again at this time, or earlier
    /// when a request arrives or a dispatch completes. Always later than `now`.
    WaitUntil(Nanos),
    /// Nothing can be dispatched until a request arrives or a dispatch
    /// completes (the queue is empty, everything queued waits on an
    /// overlapping write in flight, or `dispatches_inflight_max` is reached).
    Idle,
}
