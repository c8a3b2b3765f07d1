//! `Forwarders`: several `sluice serve` in front of one shared file system
//! (the I/O-forwarding model: each forwarder mounts the same Lustre, NFS or
//! local directory), reached through one address list,
//! `unix:/run/a.sock,unix:/run/b.sock` or `tcp:h1:p,tcp:h2:p`.
//!
//! **One home per file.** Every request for a path goes to that path's
//! home: the live member with the highest rendezvous score for the path
//! (`home_among`). Every client computes the same home from the same
//! list, so all the requests for one file meet in one scheduler, which
//! orders and aggregates them as a single server would. Removing a member
//! moves only the files whose home it was. `SLUICE_HOME=client` hashes the
//! client instead of the path (a home per client, as a static map of
//! compute nodes to forwarders does): the benchmark's comparison.
//!
//! **Failover.** Members are dialled when first needed, with
//! `Recovery::Failover`: a member whose connection breaks, or that is
//! silent for `FAILOVER_SILENCE` (or `SLUICE_TIMEOUT`, when shorter), is
//! out of this client's set; its files get new homes and each open handle
//! is reopened there by path (as the single-server client reopens after a
//! restart) on its next call, which is then sent again: reads, stats,
//! `fsync` and writes at a given offset (a write sent twice leaves the
//! same bytes, as NFS's retransmitted writes do). Namespace changes,
//! `O_APPEND` reservations and collective messages in flight fail with
//! the error instead. A member out of the set is dialled again at most
//! every `PROBE_EVERY`, when one of its files is looked up; once back,
//! its files move home on their next call. When no member answers, the
//! client waits as a single server's does (hard), or fails at `timeout`
//! (`SLUICE_SOFT=1`).
//!
//! Durability is the shared file system's: a write acknowledged by a
//! forwarder that then dies is on the shared file system only as far as
//! that forwarder's host had written it back; `fsync` acknowledged is.
//!
//! Bounds: at most `FORWARDERS_MAX` members; at most `REMOTE_FILES_MAX`
//! open handles per set (one more is ENFILE); a handle keeps at most
//! `RETIRED_MAX` handles of members it moved away from (closed with it,
//! so a call still in flight on one is not cut).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sluice_client::{Client, ClientError, ClientErrorKind, ConnectOptions, Fd, Recovery};

use crate::proto::CLUSTER_ERRNO;
use crate::remote::{RemoteResult, REMOTE_FILES_MAX};

/// Members of one forwarder set.
pub const FORWARDERS_MAX: usize = 1024;
/// A member silent this long (while a call waits on it) is out of the set.
pub const FAILOVER_SILENCE: Duration = Duration::from_secs(5);
/// A member out of the set is dialled again at most this often.
pub const PROBE_EVERY: Duration = Duration::from_secs(2);
/// Handles of former homes one open file keeps until it is closed.
pub const RETIRED_MAX: usize = 4;
/// Environment variable: `file` (default) or `client`, what a home is for.
pub const HOME_ENV: &str = "SLUICE_HOME";

/// What is hashed to choose a home.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Home {
    /// The file's path: one scheduler sees every request for a file.
    File,
    /// The client (its client id, else its pid): for comparison only.
    Client,
}

impl Home {
    /// `SLUICE_HOME`, default `File`; anything else is refused.
    pub fn from_env() -> RemoteResult<Home> {
        match std::env::var(HOME_ENV).as_deref() {
            Err(_) | Ok("" | "file") => Ok(Home::File),
            Ok("client") => Ok(Home::Client),
            Ok(other) => Err(ClientError::invalid(format!("{HOME_ENV}={other:?}: give file or client"))),
        }
    }
}

/// The members of an address list (`a,b,c`), when it has a comma; empty
/// entries are skipped.
pub fn address_set(addr: &str) -> Option<Vec<String>> {
    addr.contains(',').then(|| addr.split(',').map(str::trim).filter(|a| !a.is_empty()).map(String::from).collect())
}

/// FNV-1a: stable across processes and machines, as every client of a set
/// must agree on it.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// A 64-bit finaliser (splitmix64's), so that nearby keys score apart.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The hash a path is placed by: of its normalised form, so `a//b`,
/// `/a/b` and `./a/b` have one home.
pub fn path_key(path: &str) -> u64 {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
    fnv(parts.join("/").as_bytes())
}

/// Rendezvous (highest random weight) hashing: among `members` (index,
/// member hash), the one whose score with `key` is highest; ties go to
/// the lower index. `None` for no members.
pub fn home_among(key: u64, members: impl IntoIterator<Item = (usize, u64)>) -> Option<usize> {
    members.into_iter().map(|(i, h)| (mix(key ^ mix(h)), std::cmp::Reverse(i))).max().map(|(_, std::cmp::Reverse(i))| i)
}

/// Whether `e` says the member is gone or silent (not its answer).
fn is_outage(e: &ClientError) -> bool {
    match e.kind {
        ClientErrorKind::Disconnected | ClientErrorKind::Timeout => true,
        ClientErrorKind::Connect => e.errno != libc::EACCES && e.errno != CLUSTER_ERRNO,
        _ => false,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Member {
    addr: String,
    hash: u64,
    state: Mutex<MemberState>,
}

#[derive(Default)]
struct MemberState {
    client: Option<Arc<Client>>,
    /// Out of the set: not dialled again before this.
    out_until: Option<Instant>,
}

/// An open file: where it lives now.
struct Placed {
    path: String,
    flags: i32,
    key: u64,
    ino: u64,
    member: usize,
    /// Its home with every member in the set (the list is fixed, so this
    /// is computed once).
    first: usize,
    client: Arc<Client>,
    inner: Fd,
    /// The set's epoch when it was placed.
    epoch: u64,
    /// Not on its first choice (which was out of the set).
    displaced: bool,
    retired: Vec<(Arc<Client>, Fd)>,
    /// Why it cannot be reopened (ESTALE: its path is gone or names
    /// another file).
    dead: Option<ClientError>,
}

/// A forwarder set: see the module documentation.
pub struct Forwarders {
    members: Vec<Member>,
    opts: ConnectOptions,
    member_opts: ConnectOptions,
    home: Home,
    /// The client's own key under `Home::Client`.
    client_key: u64,
    /// Bumped whenever a member leaves or comes back.
    epoch: AtomicU64,
    files: Mutex<HashMap<u64, Arc<Mutex<Placed>>>>,
    next: AtomicU64,
    files_max: usize,
    failovers: AtomicU64,
}

impl Forwarders {
    /// A set of `addrs`, sharing one root. At least one member must answer.
    pub fn connect(addrs: &[String], opts: ConnectOptions) -> RemoteResult<Forwarders> {
        Forwarders::connect_homed(addrs, opts, Home::from_env()?)
    }

    /// As `connect`, with the home rule given.
    pub fn connect_homed(addrs: &[String], mut opts: ConnectOptions, home: Home) -> RemoteResult<Forwarders> {
        if addrs.is_empty() || addrs.len() > FORWARDERS_MAX {
            return Err(ClientError::invalid(format!("a forwarder set has 1 to {FORWARDERS_MAX} members, not {}", addrs.len())));
        }
        opts.app = Some(opts.app.take().unwrap_or_else(sluice_client::default_app));
        let member_opts = ConnectOptions { recovery: Recovery::Failover, timeout: opts.timeout.min(FAILOVER_SILENCE), ..opts.clone() };
        let client_key = mix(u64::from(opts.client_id.unwrap_or_else(std::process::id)));
        let members = addrs.iter().map(|a| Member { addr: a.clone(), hash: fnv(a.as_bytes()), state: Mutex::default() }).collect();
        let set = Forwarders {
            members,
            opts,
            member_opts,
            home,
            client_key,
            epoch: AtomicU64::new(0),
            files: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            files_max: REMOTE_FILES_MAX,
            failovers: AtomicU64::new(0),
        };
        // Say now if no member answers (or one refuses us), as a single
        // server's connect does.
        set.home_of(set.key_of(""), false)?;
        Ok(set)
    }

    /// The members' addresses, in the order given.
    pub fn addrs(&self) -> Vec<String> {
        self.members.iter().map(|m| m.addr.clone()).collect()
    }

    /// The members now in the set (dialled and answering, or not tried).
    pub fn live(&self) -> Vec<String> {
        self.members.iter().filter(|m| lock(&m.state).out_until.is_none()).map(|m| m.addr.clone()).collect()
    }

    /// Members that left this client's set so far.
    pub fn failovers(&self) -> u64 {
        self.failovers.load(Ordering::Relaxed)
    }

    /// Handles on former homes that `fd` keeps until it is closed (at
    /// most `RETIRED_MAX`).
    pub fn retired_handles(&self, fd: Fd) -> RemoteResult<usize> {
        let h = self.handle(fd)?;
        let n = lock(&h).retired.len();
        Ok(n)
    }

    pub fn home_rule(&self) -> Home {
        self.home
    }

    /// The member `path` lives on now (its address).
    pub fn home_addr(&self, path: &str) -> RemoteResult<String> {
        Ok(self.members[self.home_of(self.key_of(path), true)?.0].addr.clone())
    }

    pub fn app(&self) -> &str {
        self.opts.app.as_deref().unwrap_or_default()
    }

    /// Lower the open-handle bound (tests).
    pub fn set_files_max(&mut self, n: usize) {
        self.files_max = n.min(REMOTE_FILES_MAX);
    }

    /// The clients of the members now connected.
    pub fn connected(&self) -> Vec<Arc<Client>> {
        self.members.iter().filter_map(|m| lock(&m.state).client.clone()).collect()
    }

    fn key_of(&self, path: &str) -> u64 {
        match self.home {
            Home::File => path_key(path),
            Home::Client => self.client_key,
        }
    }

    /// The first choice for `key` among all members, in or out.
    fn first_choice(&self, key: u64) -> usize {
        home_among(key, self.members.iter().enumerate().map(|(i, m)| (i, m.hash))).unwrap_or(0)
    }

    /// The client of member `i`: dialled if it was never tried, or if it
    /// is out and its next try is due (`force`: due now). `None` if out.
    fn client(&self, i: usize, force: bool) -> RemoteResult<Option<Arc<Client>>> {
        let m = &self.members[i];
        let mut st = lock(&m.state);
        if let Some(c) = &st.client {
            return Ok(Some(Arc::clone(c)));
        }
        if st.out_until.is_some_and(|t| Instant::now() < t && !force) {
            return Ok(None);
        }
        match Client::connect_with(&m.addr, self.member_opts.clone()) {
            Ok(c) => {
                let c = Arc::new(c);
                st.client = Some(Arc::clone(&c));
                if st.out_until.take().is_some() {
                    eprintln!("sluice: forwarder {} is back in the set", m.addr);
                    self.epoch.fetch_add(1, Ordering::AcqRel);
                }
                Ok(Some(c))
            }
            Err(e) if e.errno == CLUSTER_ERRNO => Err(ClientError::invalid(format!("{} is a cluster's metadata role: a forwarder set's members are servers", m.addr))),
            Err(e) if is_outage(&e) => {
                if st.out_until.is_none() {
                    self.epoch.fetch_add(1, Ordering::AcqRel);
                }
                st.out_until = Some(Instant::now() + PROBE_EVERY);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Member `i` failed `c`'s call with `e`: out of the set, unless it
    /// was already replaced.
    fn lost(&self, i: usize, c: &Arc<Client>, e: &ClientError) {
        let m = &self.members[i];
        let mut st = lock(&m.state);
        if st.client.as_ref().is_some_and(|now| Arc::ptr_eq(now, c)) {
            st.client = None;
            st.out_until = Some(Instant::now() + PROBE_EVERY);
            self.epoch.fetch_add(1, Ordering::AcqRel);
            self.failovers.fetch_add(1, Ordering::Relaxed);
            eprintln!("sluice: forwarder {} left the set ({}); its files move to the others", m.addr, e.message);
        }
    }

    /// The home of `key` among the members in the set, and its client.
    /// With none answering: wait as the set's recovery says (`wait`),
    /// else fail at once.
    fn home_of(&self, key: u64, wait: bool) -> RemoteResult<(usize, Arc<Client>)> {
        let started = Instant::now();
        let mut pause = Duration::from_millis(20);
        let mut warned = false;
        let mut force = false;
        loop {
            let mut order: Vec<usize> = (0..self.members.len()).collect();
            order.sort_by_key(|&i| std::cmp::Reverse((mix(key ^ mix(self.members[i].hash)), std::cmp::Reverse(i))));
            for i in order {
                if let Some(c) = self.client(i, force)? {
                    if warned {
                        eprintln!("sluice: forwarder set OK again");
                    }
                    return Ok((i, c));
                }
            }
            let none = || ClientError::new(ClientErrorKind::Connect, libc::ECONNREFUSED, format!("no member of the forwarder set {} answers", self.addrs().join(",")));
            if !wait || self.opts.recovery == Recovery::Off || self.opts.recovery == Recovery::Failover {
                return Err(none());
            }
            if started.elapsed() >= self.opts.timeout {
                if self.opts.recovery == Recovery::Soft {
                    return Err(ClientError::new(ClientErrorKind::Timeout, libc::ETIMEDOUT, none().message));
                }
                if !warned {
                    eprintln!("sluice: {}, still trying", none().message);
                    warned = true;
                }
            }
            sluice_client::abandonable_sleep(pause, "waiting for a forwarder")?;
            pause = (pause * 2).min(Duration::from_secs(1));
            force = true;
        }
    }

    fn handle(&self, fd: Fd) -> RemoteResult<Arc<Mutex<Placed>>> {
        lock(&self.files).get(&fd.0).cloned().ok_or_else(|| ClientError::new(ClientErrorKind::Server, libc::EBADF, format!("handle {} is not open", fd.0)))
    }

    /// Open `path` on its home.
    pub fn open(&self, path: &str, flags: i32, mode: u32) -> RemoteResult<Fd> {
        if lock(&self.files).len() >= self.files_max {
            return Err(self.too_many());
        }
        let key = self.key_of(path);
        let (member, client, inner) = self.retrying(key, true, |c| c.open(path, flags, mode))?;
        let ino = client.ino(inner)?;
        let first = self.first_choice(key);
        let epoch = self.epoch.load(Ordering::Acquire);
        let placed = Placed {
            path: path.to_string(),
            flags,
            key,
            ino,
            member,
            first,
            client: Arc::clone(&client),
            inner,
            epoch,
            displaced: member != first,
            retired: Vec::new(),
            dead: None,
        };
        let mut files = lock(&self.files);
        if files.len() >= self.files_max {
            drop(files);
            let _ = client.close(inner);
            return Err(self.too_many());
        }
        let fd = self.next.fetch_add(1, Ordering::Relaxed);
        files.insert(fd, Arc::new(Mutex::new(placed)));
        Ok(Fd(fd))
    }

    fn too_many(&self) -> ClientError {
        ClientError::new(ClientErrorKind::Server, libc::ENFILE, format!("{} files open on this forwarder set (REMOTE_FILES_MAX)", self.files_max))
    }

    /// `f` on the home of `key`; after a member failed it, sent again to
    /// the next home when `again` (at most once per member), else its
    /// error returned. Says which member and client answered.
    fn retrying<T>(&self, key: u64, again: bool, mut f: impl FnMut(&Client) -> RemoteResult<T>) -> RemoteResult<(usize, Arc<Client>, T)> {
        let mut tries = 0;
        loop {
            let (m, c) = self.home_of(key, true)?;
            match f(&c) {
                Err(e) if is_outage(&e) => {
                    self.lost(m, &c, &e);
                    tries += 1;
                    if !again || tries > self.members.len() {
                        return Err(e);
                    }
                }
                r => return r.map(|t| (m, c, t)),
            }
        }
    }

    /// A call on `path`'s home (see `retrying`).
    pub fn on_path<T>(&self, path: &str, again: bool, f: impl FnMut(&Client) -> RemoteResult<T>) -> RemoteResult<T> {
        self.retrying(self.key_of(path), again, f).map(|(_, _, t)| t)
    }

    /// A call on `fd`'s file where it lives now (moved home first when the
    /// set changed); after its member failed it, the file moves and the
    /// call is sent again when `again`, else its error is returned.
    pub fn on_fd<T>(&self, fd: Fd, again: bool, mut f: impl FnMut(&Client, Fd) -> RemoteResult<T>) -> RemoteResult<T> {
        let h = self.handle(fd)?;
        let mut tries = 0;
        loop {
            let (m, c, inner) = self.placed(&h)?;
            match f(&c, inner) {
                Err(e) if is_outage(&e) => {
                    self.lost(m, &c, &e);
                    tries += 1;
                    if !again || tries > self.members.len() {
                        return Err(e);
                    }
                }
                r => return r,
            }
        }
    }

    /// Where `h` lives now: moved to its home first if the set changed
    /// since it was placed, or if its first choice may be back.
    fn placed(&self, h: &Mutex<Placed>) -> RemoteResult<(usize, Arc<Client>, Fd)> {
        let mut p = lock(h);
        loop {
            if let Some(e) = &p.dead {
                return Err(e.clone());
            }
            let epoch = self.epoch.load(Ordering::Acquire);
            let first = p.first;
            let probe_due = p.displaced && lock(&self.members[first].state).out_until.is_some_and(|t| Instant::now() >= t);
            if p.epoch == epoch && !probe_due {
                return Ok((p.member, Arc::clone(&p.client), p.inner));
            }
            let (m, c) = self.home_of(p.key, true)?;
            if m == p.member && Arc::ptr_eq(&c, &p.client) {
                (p.epoch, p.displaced) = (epoch, m != first);
                continue;
            }
            let reopen = p.flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC);
            match c.open(&p.path, reopen, 0) {
                Ok(inner) => {
                    if c.ino(inner).ok() != Some(p.ino) {
                        let _ = c.close(inner);
                        p.dead = Some(ClientError::new(ClientErrorKind::Stale, libc::ESTALE, format!("{}: another file since its forwarder left", p.path)));
                        continue;
                    }
                    let old = (std::mem::replace(&mut p.client, c), std::mem::replace(&mut p.inner, inner));
                    p.retired.push(old);
                    if p.retired.len() > RETIRED_MAX {
                        let (oc, ofd) = p.retired.remove(0);
                        let _ = oc.close(ofd);
                    }
                    (p.member, p.epoch, p.displaced) = (m, epoch, m != first);
                }
                Err(e) if is_outage(&e) => self.lost(m, &c, &e),
                Err(e) if e.errno == libc::ENOENT => {
                    p.dead = Some(ClientError::new(ClientErrorKind::Stale, libc::ESTALE, format!("{}: gone since its forwarder left", p.path)));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The client `fd`'s file lives on now, and its handle there (for a
    /// call the caller finishes later, as a collective message).
    pub fn client_of(&self, fd: Fd) -> RemoteResult<(Arc<Client>, Fd)> {
        let (_, c, inner) = self.placed(&*self.handle(fd)?)?;
        Ok((c, inner))
    }

    /// The inode number of `fd`'s file when it was opened.
    pub fn ino(&self, fd: Fd) -> RemoteResult<u64> {
        Ok(lock(&*self.handle(fd)?).ino)
    }

    /// Close `fd`, and the handles it left on former homes.
    pub fn close(&self, fd: Fd) -> RemoteResult<()> {
        let h = lock(&self.files).remove(&fd.0).ok_or_else(|| ClientError::new(ClientErrorKind::Server, libc::EBADF, format!("handle {} is not open", fd.0)))?;
        let mut p = lock(&h);
        for (c, ifd) in p.retired.drain(..) {
            let _ = c.close(ifd);
        }
        if p.dead.is_some() {
            return Ok(());
        }
        match p.client.close(p.inner) {
            // Its member left: nothing to close there any more.
            Err(e) if is_outage(&e) => Ok(()),
            r => r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(n: usize) -> Vec<(usize, u64)> {
        (0..n).map(|i| (i, fnv(format!("unix:/run/sluice/f{i}.sock").as_bytes()))).collect()
    }

    #[test]
    fn a_path_has_one_home_whatever_its_spelling() {
        let m = hashes(4);
        for (a, b) in [("a/b", "/a/b"), ("a//b", "./a/b/"), ("x.dat", "/./x.dat")] {
            assert_eq!(home_among(path_key(a), m.clone()), home_among(path_key(b), m.clone()), "{a} {b}");
        }
        assert_eq!(home_among(1, Vec::new()), None);
    }

    #[test]
    fn removing_a_member_moves_only_its_files() {
        let all = hashes(8);
        let without: Vec<_> = all.iter().copied().filter(|&(i, _)| i != 3).collect();
        let (mut moved, mut kept) = (0, 0);
        for f in 0..4000 {
            let key = path_key(&format!("data/file-{f}"));
            let before = home_among(key, all.clone()).unwrap();
            let after = home_among(key, without.clone()).unwrap();
            if before == 3 {
                assert_ne!(after, 3);
                moved += 1;
            } else {
                assert_eq!(before, after, "file {f} moved though its home stayed");
                kept += 1;
            }
        }
        // About an eighth of the files lived on member 3.
        assert!((350..650).contains(&moved), "{moved} of {}", moved + kept);
    }

    #[test]
    fn homes_spread_evenly() {
        let m = hashes(4);
        let mut count = [0u32; 4];
        for f in 0..8000 {
            count[home_among(path_key(&format!("f{f}")), m.clone()).unwrap()] += 1;
        }
        assert!(count.iter().all(|&c| (1700..2300).contains(&c)), "{count:?}");
    }

    #[test]
    fn an_address_list_is_a_set_and_one_address_is_not() {
        assert_eq!(address_set("unix:/a.sock"), None);
        assert_eq!(address_set("unix:/a.sock,unix:/b.sock"), Some(vec!["unix:/a.sock".to_string(), "unix:/b.sock".to_string()]));
        assert_eq!(address_set("tcp:h1:7000, tcp:h2:7000,"), Some(vec!["tcp:h1:7000".to_string(), "tcp:h2:7000".to_string()]));
    }

    #[test]
    fn a_set_is_bounded_and_a_dead_one_is_refused_clearly() {
        let opts = ConnectOptions::default;
        let too_many: Vec<String> = (0..=FORWARDERS_MAX).map(|i| format!("unix:/nonexistent/{i}.sock")).collect();
        let e = Forwarders::connect_homed(&too_many, opts(), Home::File).err().unwrap();
        assert_eq!(e.errno, libc::EINVAL, "{e}");
        // N members pass the bound: the set is tried (and found dead).
        let e = Forwarders::connect_homed(&too_many[..FORWARDERS_MAX], ConnectOptions { recovery: Recovery::Soft, ..opts() }, Home::File).err().unwrap();
        assert!(e.message.contains("no member of the forwarder set"), "{e}");
        let dead: Vec<String> = (0..2).map(|i| format!("unix:/nonexistent/{i}.sock")).collect();
        let e = Forwarders::connect_homed(&dead, ConnectOptions { recovery: Recovery::Soft, ..opts() }, Home::File).err().unwrap();
        assert!(e.message.contains("no member of the forwarder set"), "{e}");
    }
}
