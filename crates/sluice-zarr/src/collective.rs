//! Collective writes and reads of a distributed array, by plan.
//!
//! The ranks are threads of this process, each with its own connection
//! (one application to the scheduler, as the ranks of one `mpirun` are).
//! Two strategies of the three are here:
//!
//! - **Independent**: each rank sends its own pieces, file by file, as
//!   list I/O; the server's scheduler orders and joins them. Before that,
//!   each file's aggregator creates it on its server (placement), sizes it
//!   and writes its shard index, and the ranks wait at a barrier.
//! - **Two-phase** (client side, ROMIO's collective buffering): each
//!   file's aggregator assembles the whole file from every rank's pieces
//!   and writes it with large contiguous requests; a read is the reverse.
//!   Here the exchange between ranks is a memory copy within the process,
//!   so it costs less than it would over a network.
//!
//! - **Server-directed** (Panda): as independent, but each rank's list
//!   message carries a group tag (`sluice_proto::Group`), and the server
//!   holds the messages of a file until every participant's has come, then
//!   serves them together in disk order as one application's work
//!   (`sluice-server/src/collective.rs`). Nothing of a group is done unless
//!   all of it arrives in time. A rank whose share of a file needs several
//!   messages sends them as successive groups (the j-th messages of every
//!   rank form group j), and may keep up to `GROUPS_IN_FLIGHT_MAX` of its
//!   messages in flight (`group_window`), so the server has the next groups
//!   while it serves one (Panda's overlap of communication and disk; on the
//!   2-core VM it measured slower, so the default window is 1).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_array::{gather, scatter, Distribution, Dtype, Layout, Message, MessageLimits, Piece, Plan};
use sluice_client::{Fd, Group};
use sluice_remote::Remote;

use crate::store::SluiceStore;
use crate::Error;

/// Bytes per list-I/O message or contiguous request. Large enough that a
/// request's fixed cost is small against its transfer, small enough that
/// several are in flight per server (the protocol allows 64 MiB).
pub const TRANSFER_BYTES_MAX: u64 = MessageLimits::COLLECTIVE.bytes_max;

/// How a collective moves its pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    Independent,
    TwoPhase,
    ServerDirected,
}

/// How long a server-directed group waits for its last participant (the
/// server clamps it to its `collective_wait_ms_max`).
pub const GROUP_WAIT_MS_DEFAULT: u32 = 30_000;

impl Strategy {
    pub fn parse(s: &str) -> Result<Strategy, Error> {
        match s {
            "independent" => Ok(Strategy::Independent),
            "two-phase" | "twophase" => Ok(Strategy::TwoPhase),
            "server-directed" | "server" => Ok(Strategy::ServerDirected),
            _ => Err(Error::new(format!("{s:?} is not a strategy (independent, two-phase, server-directed)"))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Strategy::Independent => "independent",
            Strategy::TwoPhase => "two-phase",
            Strategy::ServerDirected => "server-directed",
        }
    }
}

/// An array to create: its server path (`group/name`), layout, dimension
/// names and user attributes.
#[derive(Debug, Clone)]
pub struct ArraySpec {
    pub path: String,
    pub layout: Layout,
    pub dims: Vec<String>,
    pub attributes: Value,
}

/// One collective operation: where, what, and who does what.
pub struct Collective<'a> {
    /// The sluice address each rank connects to.
    pub addr: &'a str,
    pub spec: &'a ArraySpec,
    pub dist: &'a Distribution,
    pub plan: &'a Plan,
    /// Each file's server (from `sluice_array::place`).
    pub unit_server: &'a [usize],
    /// Each file's aggregator rank (from `sluice_array::aggregators`).
    pub unit_aggregator: &'a [usize],
    pub strategy: Strategy,
    /// Server-directed: each group's wait for its last participant.
    pub group_wait_ms: u32,
    /// Server-directed: messages a rank keeps in flight (1 to
    /// [`GROUPS_IN_FLIGHT_MAX`]; 1 waits for each answer before the next).
    pub group_window: usize,
}

/// Write the group metadata of every ancestor of `spec.path` that has
/// none, the array's `zarr.json`, and the directories of its files.
pub fn create(remote: Arc<Remote>, spec: &ArraySpec) -> Result<(), Error> {
    use zarrs::storage::{ReadableStorageTraits, StoreKey, WritableStorageTraits};
    let store = SluiceStore::new(remote.clone(), "");
    let path = spec.path.trim_matches('/');
    let key = |p: &str| StoreKey::new(if p.is_empty() { "zarr.json".to_string() } else { format!("{p}/zarr.json") });
    // The root and every group above the array: "", "a", "a/b" for "a/b/x".
    let parts: Vec<&str> = path.split('/').collect();
    for depth in 0..parts.len() {
        let k = key(&parts[..depth].join("/")).map_err(Error::other)?;
        if store.size_key(&k).map_err(Error::other)?.is_none() {
            let group = json!({"zarr_format": 3, "node_type": "group", "attributes": {}});
            store.set(&k, serde_json::to_vec_pretty(&group).map_err(Error::other)?.into()).map_err(Error::other)?;
        }
    }
    let meta = spec.layout.zarr_json(&spec.dims, spec.attributes.clone());
    store.set(&key(path).map_err(Error::other)?, serde_json::to_vec_pretty(&meta).map_err(Error::other)?.into()).map_err(Error::other)?;
    let mut dirs: Vec<String> = (0..spec.layout.units())
        .map(|u| {
            let k = spec.layout.key(u);
            format!("{path}/{}", &k[..k.rfind('/').unwrap_or(0)])
        })
        .collect();
    dirs.dedup();
    for d in dirs {
        mkdir_p(&remote, &d)?;
    }
    Ok(())
}

fn mkdir_p(remote: &Remote, dir: &str) -> Result<(), Error> {
    let mut at = 0;
    loop {
        let end = dir[at..].find('/').map(|i| at + i).unwrap_or(dir.len());
        match remote.mkdir(&dir[..end], 0o755) {
            Ok(()) => {}
            Err(e) if e.posix_errno() == libc::EEXIST => {}
            Err(e) => return Err(Error::client(&format!("mkdir {}", &dir[..end]), e)),
        }
        if end == dir.len() {
            return Ok(());
        }
        at = end + 1;
    }
}

/// The pieces of each file, in disk order.
fn by_unit(plan: &Plan, units: u64) -> Vec<Vec<Piece>> {
    let mut v = vec![Vec::new(); units as usize];
    for p in plan.disk_order() {
        v[p.unit as usize].push(p);
    }
    v
}

/// Run `f(rank, remote)` on one thread per rank, each with its own
/// connection; the first error wins. `f` gets the failure flag so that a
/// rank waiting at a barrier learns that another one failed.
fn ranks<T: Send>(c: &Collective, f: impl Fn(usize, &Remote, &Phases) -> Result<T, Error> + Sync) -> Result<Vec<T>, Error> {
    let n = c.dist.ranks() as usize;
    let phases = Phases { barrier: Barrier::new(n), failed: AtomicBool::new(false) };
    let results: Vec<Result<T, Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (f, phases) = (&f, &phases);
                s.spawn(move || {
                    let out = Remote::connect(c.addr).map_err(|e| Error::client(&format!("rank {r}: connect to {}", c.addr), e)).and_then(|remote| f(r, &remote, phases));
                    if out.is_err() {
                        phases.failed.store(true, Ordering::SeqCst);
                    }
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(Error::new("a rank panicked")))).collect()
    });
    // Report the failure itself, not a rank that stopped because of it.
    if let Some(e) = results.iter().filter_map(|r| r.as_ref().err()).find(|e| e.message != ANOTHER_RANK_FAILED) {
        return Err(e.clone());
    }
    results.into_iter().collect()
}

/// What a rank that stopped at a barrier because another failed reports.
const ANOTHER_RANK_FAILED: &str = "another rank failed";

/// A barrier that every rank reaches even after a failure, and that tells
/// the ranks whether to go on.
struct Phases {
    barrier: Barrier,
    failed: AtomicBool,
}

impl Phases {
    /// Wait for every rank; `Err` if any has failed (its own error is the
    /// one reported).
    fn next(&self, ok: Result<(), Error>) -> Result<(), Error> {
        if ok.is_err() {
            self.failed.store(true, Ordering::SeqCst);
        }
        self.barrier.wait();
        ok?;
        if self.failed.load(Ordering::SeqCst) {
            return Err(Error::new(ANOTHER_RANK_FAILED));
        }
        Ok(())
    }
}

/// What a collective took.
#[derive(Debug, Clone, Copy)]
pub struct Transfer {
    pub bytes: u64,
    pub elapsed: Duration,
}

/// Write every rank's local array (`locals[r]`) into the array's files.
/// The array must have been made with [`create`].
pub fn write(c: &Collective, locals: &[Vec<u8>]) -> Result<Transfer, Error> {
    let units = by_unit(c.plan, c.spec.layout.units());
    let t0 = Instant::now();
    let groups = Groups::new(c);
    ranks(c, |r, remote, phases| match c.strategy {
        Strategy::Independent | Strategy::ServerDirected => {
            let mut prepared = Ok(());
            for u in aggregated(c, r) {
                prepared = prepared.and_then(|()| prepare_unit(c, remote, u));
            }
            phases.next(prepared)?;
            transfer_pieces(c, remote, r, Side::Write(&locals[r]), &groups)
        }
        Strategy::TwoPhase => {
            for u in aggregated(c, r) {
                let mut buf = vec![0u8; c.spec.layout.unit_bytes() as usize];
                for p in &units[u as usize] {
                    let src = &locals[p.rank as usize][p.mem_off as usize..(p.mem_off + p.len) as usize];
                    buf[p.file_off as usize..(p.file_off + p.len) as usize].copy_from_slice(src);
                }
                let index = c.spec.layout.shard_index(u);
                let at = c.spec.layout.unit_data_bytes() as usize;
                buf[at..at + index.len()].copy_from_slice(&index);
                let fd = create_unit(c, remote, u)?;
                let r = write_contiguous(remote, fd, &buf, &unit_path(c, u));
                close(remote, fd, &unit_path(c, u), r)?;
            }
            Ok(())
        }
    })?;
    Ok(Transfer { bytes: c.plan.bytes(), elapsed: t0.elapsed() })
}

/// Read the array's files into one local array per rank.
pub fn read(c: &Collective) -> Result<(Vec<Vec<u8>>, Transfer), Error> {
    let units = by_unit(c.plan, c.spec.layout.units());
    let el = c.spec.layout.dtype().bytes();
    let t0 = Instant::now();
    let staged: Mutex<Vec<Option<Arc<Vec<u8>>>>> = Mutex::new(vec![None; units.len()]);
    let groups = Groups::new(c);
    let locals = ranks(c, |r, remote, phases| {
        let mut local = vec![0u8; (c.dist.local_elements(r as u64) * el) as usize];
        match c.strategy {
            Strategy::Independent | Strategy::ServerDirected => transfer_pieces(c, remote, r, Side::Read(&mut local), &groups)?,
            Strategy::TwoPhase => {
                let mut staged_ok = Ok(());
                for u in aggregated(c, r) {
                    staged_ok = staged_ok.and_then(|()| {
                        let buf = read_unit(c, remote, u)?;
                        staged.lock().unwrap_or_else(|p| p.into_inner())[u as usize] = Some(Arc::new(buf));
                        Ok(())
                    });
                }
                phases.next(staged_ok)?;
                let staged = staged.lock().unwrap_or_else(|p| p.into_inner()).clone();
                for p in c.plan.rank(r as u64) {
                    let unit = staged[p.unit as usize].as_ref().ok_or_else(|| Error::new("a file was not staged"))?;
                    local[p.mem_off as usize..(p.mem_off + p.len) as usize].copy_from_slice(&unit[p.file_off as usize..(p.file_off + p.len) as usize]);
                }
            }
        }
        Ok(local)
    })?;
    Ok((locals, Transfer { bytes: c.plan.bytes(), elapsed: t0.elapsed() }))
}

/// The files rank `r` aggregates.
fn aggregated<'a>(c: &'a Collective, r: usize) -> impl Iterator<Item = u64> + 'a {
    (0..c.unit_aggregator.len()).filter(move |&u| c.unit_aggregator[u] == r).map(|u| u as u64)
}

fn unit_path(c: &Collective, u: u64) -> String {
    format!("{}/{}", c.spec.path.trim_matches('/'), c.spec.layout.key(u))
}

/// Create file `u` on its server (a cluster places it with a one-object
/// layout starting there; one server just creates it), truncated.
fn create_unit(c: &Collective, remote: &Remote, u: u64) -> Result<Fd, Error> {
    let path = unit_path(c, u);
    remote.create_on(&path, c.unit_server[u as usize], 0o644).map_err(|e| Error::client(&format!("create {path}"), e))
}

/// Give file `u` its full size and, with shards, its index.
fn prepare_unit(c: &Collective, remote: &Remote, u: u64) -> Result<(), Error> {
    let path = unit_path(c, u);
    let fd = create_unit(c, remote, u)?;
    let index = c.spec.layout.shard_index(u);
    let r = if index.is_empty() {
        remote.ftruncate(fd, c.spec.layout.unit_bytes()).map_err(|e| Error::client(&format!("truncate {path}"), e))
    } else {
        let at = c.spec.layout.unit_data_bytes();
        remote.pwrite(fd, &index, at).map(|_| ()).map_err(|e| Error::client(&format!("write {path}"), e))
    };
    close(remote, fd, &path, r)
}

fn close(remote: &Remote, fd: Fd, path: &str, r: Result<(), Error>) -> Result<(), Error> {
    let closed = remote.close(fd).map_err(|e| Error::client(&format!("close {path}"), e));
    r.and(closed)
}

fn write_contiguous(remote: &Remote, fd: Fd, data: &[u8], path: &str) -> Result<(), Error> {
    for (i, part) in data.chunks(TRANSFER_BYTES_MAX as usize).enumerate() {
        remote.pwrite(fd, part, i as u64 * TRANSFER_BYTES_MAX).map_err(|e| Error::client(&format!("write {path}"), e))?;
    }
    Ok(())
}

fn read_unit(c: &Collective, remote: &Remote, u: u64) -> Result<Vec<u8>, Error> {
    let path = unit_path(c, u);
    let fd = remote.open(&path, libc::O_RDONLY, 0).map_err(|e| Error::client(&format!("open {path}"), e))?;
    let mut buf = vec![0u8; c.spec.layout.unit_data_bytes() as usize];
    let mut r = Ok(());
    for (i, part) in buf.chunks_mut(TRANSFER_BYTES_MAX as usize).enumerate() {
        r = r.and_then(|()| {
            let n = remote.pread(fd, part, i as u64 * TRANSFER_BYTES_MAX).map_err(|e| Error::client(&format!("read {path}"), e))?;
            if n < part.len() {
                return Err(Error::new(format!("{path} is short: the array is incomplete")));
            }
            Ok(())
        });
    }
    close(remote, fd, &path, r)?;
    Ok(buf)
}

/// List messages: at most `LIST_PIECES_MAX` pieces and
/// [`TRANSFER_BYTES_MAX`] bytes each.
pub const MESSAGE_LIMITS: MessageLimits = MessageLimits::COLLECTIVE;

/// Rank `r`'s messages, file by file (`sluice_array::rank_messages`, as
/// the Python binding sends them), with their groups if server-directed.
fn rank_messages(c: &Collective, r: usize, groups: &Groups) -> Vec<Vec<Message>> {
    sluice_array::rank_messages(c.plan, r as u64, &MESSAGE_LIMITS, groups.ids.as_ref())
}

/// The most server-directed messages a rank keeps in flight at once
/// (`Collective::group_window`; Panda's overlap: the server holds the next
/// groups while it serves one). Four messages of at most
/// `TRANSFER_BYTES_MAX` (16 MiB) are 64 MiB in all, within a server's
/// `reply_bytes_max` (128 MiB), so it never stops reading a rank's
/// connection. A group's wait starts at its first message, so with a
/// window above 1 a rank far ahead starts its groups' clocks early: keep
/// `group_wait_ms` well above the time a window of groups takes. No deadlock: every
/// rank sends its messages in the same order (file, then j), so the
/// oldest incomplete group always has every participant's message in
/// flight or sent.
pub const GROUPS_IN_FLIGHT_MAX: usize = 4;

/// The direction of a pipelined collective, with the rank's memory.
enum Side<'a> {
    Write(&'a [u8]),
    Read(&'a mut [u8]),
}

/// One rank's server-directed transfer: its messages in (file, j) order,
/// up to [`GROUPS_IN_FLIGHT_MAX`] in flight, each file opened before its
/// first message and closed after its last answer. After an error the
/// messages in flight are still waited for, then the first error wins.
fn pipelined(c: &Collective, remote: &Remote, r: usize, mut side: Side, groups: &Groups) -> Result<(), Error> {
    use sluice_remote::GroupTicket;
    use std::collections::VecDeque;
    struct Flying {
        file: usize,
        ticket: GroupTicket,
        pieces: Vec<Piece>,
    }
    let msgs = rank_messages(c, r, groups);
    let mut fds: Vec<Option<Fd>> = vec![None; msgs.len()];
    let mut left: Vec<usize> = msgs.iter().map(|m| m.len()).collect();
    let order: Vec<(usize, usize)> = msgs.iter().enumerate().flat_map(|(i, m)| (0..m.len()).map(move |j| (i, j))).collect();
    let (mut flying, mut next, mut first): (VecDeque<Flying>, usize, Option<Error>) = (VecDeque::new(), 0, None);
    let flags = if matches!(side, Side::Write(_)) { libc::O_WRONLY } else { libc::O_RDONLY };
    loop {
        while first.is_none() && next < order.len() && flying.len() < c.group_window.clamp(1, GROUPS_IN_FLIGHT_MAX) {
            let (i, j) = order[next];
            next += 1;
            let path = unit_path(c, msgs[i][0].unit);
            let fd = match fds[i] {
                Some(fd) => fd,
                None => match remote.open(&path, flags, 0) {
                    Ok(fd) => *fds[i].insert(fd),
                    Err(e) => {
                        first = Some(Error::client(&format!("open {path}"), e));
                        break;
                    }
                },
            };
            let m = &msgs[i][j];
            let tag = groups.tag(m).expect("server-directed");
            let sent = match &side {
                Side::Write(local) => remote.submit_list_group(fd, &m.ranges(), Some(&gather(&m.pieces, local)), tag),
                Side::Read(_) => remote.submit_list_group(fd, &m.ranges(), None, tag),
            };
            match sent {
                Ok(ticket) => flying.push_back(Flying { file: i, ticket, pieces: m.pieces.clone() }),
                Err(e) => first = Some(Error::client(&format!("send to {path}"), e)),
            }
        }
        let Some(f) = flying.pop_front() else { break };
        let path = unit_path(c, msgs[f.file][0].unit);
        let total: usize = f.pieces.iter().map(|p| p.len as usize).sum();
        let mut data = vec![0u8; if matches!(side, Side::Read(_)) { total } else { 0 }];
        match remote.wait_list_group(f.ticket, &mut data) {
            Ok(_) => {
                if let Side::Read(local) = &mut side {
                    scatter(&f.pieces, &data, local);
                }
            }
            Err(e) => {
                first.get_or_insert(Error::client(&format!("transfer of {path}"), e));
            }
        }
        left[f.file] -= 1;
        if left[f.file] == 0 || (first.is_some() && !flying.iter().any(|g| g.file == f.file)) {
            if let Some(fd) = fds[f.file].take() {
                if let Err(e) = remote.close(fd) {
                    first.get_or_insert(Error::client(&format!("close {path}"), e));
                }
            }
        }
    }
    for fd in fds.into_iter().flatten() {
        let _ = remote.close(fd);
    }
    first.map_or(Ok(()), Err)
}

/// The server-directed groups of one collective (`sluice_array::Groups`,
/// the base from `sluice_array::group_base`), with their wait.
struct Groups {
    /// None unless server-directed.
    ids: Option<sluice_array::Groups>,
    wait_ms: u32,
    on: bool,
}

impl Groups {
    fn new(c: &Collective) -> Groups {
        let on = c.strategy == Strategy::ServerDirected;
        let ids = on.then(|| sluice_array::Groups::new(c.plan, c.spec.layout.units(), &MESSAGE_LIMITS, sluice_array::group_base()));
        Groups { ids, wait_ms: c.group_wait_ms, on }
    }

    /// The group of message `m`, if server-directed.
    fn tag(&self, m: &Message) -> Option<Group> {
        m.group.map(|t| Group { id: t.id, participants: t.participants, wait_ms: self.wait_ms })
    }
}

/// One rank's pieces, file by file, one list message at a time (and
/// server-directed, through [`pipelined`]).
fn transfer_pieces(c: &Collective, remote: &Remote, r: usize, mut side: Side, groups: &Groups) -> Result<(), Error> {
    if groups.on {
        return pipelined(c, remote, r, side, groups);
    }
    let flags = if matches!(side, Side::Write(_)) { libc::O_WRONLY } else { libc::O_RDONLY };
    for file in rank_messages(c, r, groups) {
        let path = unit_path(c, file[0].unit);
        let fd = remote.open(&path, flags, 0).map_err(|e| Error::client(&format!("open {path}"), e))?;
        let mut res = Ok(());
        for m in &file {
            res = match &mut side {
                Side::Write(local) => remote.write_list(fd, &m.ranges(), &gather(&m.pieces, local)).map(|_| ()).map_err(|e| Error::client(&format!("write {path}"), e)),
                Side::Read(local) => {
                    let mut data = vec![0u8; m.bytes() as usize];
                    remote.read_list(fd, &m.ranges(), &mut data).map(|_| scatter(&m.pieces, &data, local)).map_err(|e| Error::client(&format!("read {path}"), e))
                }
            };
            if res.is_err() {
                break;
            }
        }
        close(remote, fd, &path, res)?;
    }
    Ok(())
}

/// The test pattern: element `g` holds its C-order linear index, as the
/// element type (integers wrap).
pub fn pattern_value(dtype: Dtype, linear: u64, out: &mut [u8]) {
    match dtype {
        Dtype::F64 => out.copy_from_slice(&(linear as f64).to_le_bytes()),
        Dtype::F32 => out.copy_from_slice(&(linear as f32).to_le_bytes()),
        _ => out.copy_from_slice(&linear.to_le_bytes()[..dtype.bytes() as usize]),
    }
}

/// Rank `r`'s local array filled with the test pattern.
pub fn pattern_local(dist: &Distribution, dtype: Dtype, r: u64) -> Vec<u8> {
    let el = dtype.bytes() as usize;
    let maps = dist.local_to_global(r);
    let local_shape: Vec<u64> = maps.iter().map(|m| m.len() as u64).collect();
    let count: u64 = local_shape.iter().product();
    let mut out = vec![0u8; count as usize * el];
    if count == 0 {
        return out;
    }
    let shape = dist.shape();
    let n = shape.len();
    let mut idx = vec![0usize; n];
    for e in 0..count as usize {
        let linear = (0..n).fold(0, |acc, d| acc * shape[d] + maps[d][idx[d]]);
        pattern_value(dtype, linear, &mut out[e * el..(e + 1) * el]);
        for d in (0..n).rev() {
            idx[d] += 1;
            if idx[d] < maps[d].len() {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn collective_messages_fit_the_protocol() {
        assert_eq!(super::MESSAGE_LIMITS.pieces_max, sluice_proto::LIST_PIECES_MAX);
        assert!(super::MESSAGE_LIMITS.bytes_max <= u64::from(sluice_proto::IO_BYTES_MAX));
    }
}
