//! Who a connection acts for, and taking that identity on a thread.
//!
//! The model is NFS's AUTH_SYS, made strict where the kernel can vouch:
//! - A Unix peer is who `SO_PEERCRED` says (uid, gid, pid and, through
//!   `SO_PEERGROUPS`, its groups). It cannot claim anyone else.
//! - A stated identity (`Hello.cred`) is believed only from a connection
//!   that proved the shared key (TCP clients; mounts forwarding their
//!   callers), or from a local root peer, which could act as anyone anyway.
//! - Squash maps identities to the anonymous user: `root` (the default)
//!   maps uid 0 of identities the kernel did not vouch for, i.e. stated
//!   over TCP; `all` maps everyone; `none` nothing. A local root peer is
//!   root on the server's own host and is not squashed by `root`.
//! - A server not running as root cannot take other identities: it admits
//!   only its own uid (and root, which then gets the server's rights).
//!
//! Each operation that resolves a path runs under the caller's fsuid,
//! fsgid and groups (`setfsuid`/`setfsgid`/`setgroups` as raw system
//! calls, which change the calling thread only), so the kernel itself
//! checks permissions, owns created files by the caller and applies sticky
//! directories. Reads and writes go through handles opened that way: as
//! in the kernel, a handle carries the rights checked at open, so an
//! aggregate of several users' requests on one file only holds requests
//! that each passed their own check.

use sluice_net::PeerCred;
use sluice_proto::Cred;

use crate::error::{Error, ErrorKind, Result};

/// The anonymous user and group squashed identities become (nobody,
/// nogroup on Debian).
pub const ANON_ID: u32 = 65_534;

/// Which identities become the anonymous user.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Squash {
    /// uid 0 stated over the network (the default, as NFS's root_squash).
    Root,
    /// Every identity (anonymous access).
    All,
    /// None.
    None,
}

impl Squash {
    pub fn parse(s: &str) -> Result<Squash> {
        match s {
            "root" => Ok(Squash::Root),
            "all" => Ok(Squash::All),
            "none" => Ok(Squash::None),
            _ => Err(Error::config(format!("unknown squash {s:?} (known: root, all, none)"))),
        }
    }
}

/// The identity a connection's requests run as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub cred: Cred,
    /// The pid the kernel reported for a Unix peer.
    pub pid: Option<u32>,
}

impl Identity {
    /// Root after squash: may create setuid and setgid files.
    pub fn is_root(&self) -> bool {
        self.cred.uid == 0
    }
}

fn denied(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Invalid, libc::EACCES, msg)
}

/// Whether a connection must prove the key before its `Hello` is believed:
/// every TCP connection, and a Unix peer other than root that states an
/// identity.
pub fn needs_key(peer: Option<&PeerCred>, stated: Option<&Cred>) -> bool {
    match peer {
        None => true,
        Some(p) => stated.is_some() && p.uid != 0,
    }
}

/// The identity of a connection, once the key (where `needs_key`) was
/// proven. `server_uid` is the server's effective uid.
pub fn identify(peer: Option<&PeerCred>, stated: Option<&Cred>, squash: Squash, server_uid: u32) -> Result<Identity> {
    let (cred, vouched) = match (peer, stated) {
        (_, Some(c)) => (c.clone(), peer.is_some_and(|p| p.uid == 0)),
        (Some(p), None) => (Cred { uid: p.uid, gid: p.gid, groups: p.groups.clone() }, true),
        (None, None) => return Err(Error::invalid("a TCP client must state its identity in its Hello")),
    };
    let anon = Cred { uid: ANON_ID, gid: ANON_ID, groups: Vec::new() };
    let cred = match squash {
        Squash::All => anon,
        Squash::Root if cred.uid == 0 && !vouched => anon,
        // As knfsd's root_squash: group 0 stated over the network is not
        // root's group either, as primary group or supplementary.
        Squash::Root if !vouched => {
            let squash_gid = |g: u32| if g == 0 { ANON_ID } else { g };
            Cred { uid: cred.uid, gid: squash_gid(cred.gid), groups: cred.groups.iter().copied().map(squash_gid).collect() }
        }
        _ => cred,
    };
    if server_uid != 0 && cred.uid != server_uid && cred.uid != 0 {
        return Err(denied(format!("this server runs as uid {server_uid}, not root, and cannot act for uid {}; run it as root or as that user", cred.uid)));
    }
    Ok(Identity { cred, pid: peer.map(|p| p.pid) })
}

/// Mode bits a caller may give a new file or directory: setuid and setgid
/// only for root.
pub fn create_mode(id: &Identity, mode: u32) -> u32 {
    let mode = mode & 0o7777;
    if id.is_root() {
        mode
    } else {
        mode & !(libc::S_ISUID | libc::S_ISGID)
    }
}

/// Make the calling thread's file-system identity `cred`: supplementary
/// groups, then fsgid, then fsuid (raw system calls: glibc's `setgroups`
/// would change every thread of the server). A server not running as root
/// keeps its own identity (`identify` admitted only that one).
pub fn take_on_thread(cred: &Cred, server_uid: u32) -> Result<()> {
    if server_uid != 0 {
        return Ok(());
    }
    let fail = |what: &str| Error::new(ErrorKind::Io, libc::EPERM, format!("cannot take identity uid {} gid {}: {what}", cred.uid, cred.gid));
    // SAFETY: the group list outlives the call; the length is its length.
    if unsafe { libc::syscall(libc::SYS_setgroups, cred.groups.len(), cred.groups.as_ptr()) } < 0 {
        return Err(fail("setgroups failed"));
    }
    // setfsgid/setfsuid return the previous value and never fail loudly:
    // asking with an invalid id (-1) returns the current one, to check.
    // SAFETY: plain system calls on the calling thread.
    let (gid_now, uid_now) = unsafe {
        libc::syscall(libc::SYS_setfsgid, cred.gid);
        let g = libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32;
        libc::syscall(libc::SYS_setfsuid, cred.uid);
        (g, libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32)
    };
    if (uid_now, gid_now) != (cred.uid, cred.gid) {
        return Err(fail("the kernel refused the fsuid/fsgid"));
    }
    Ok(())
}

/// Capabilities a thread that moves clients' data must not hold:
/// `CAP_FSETID` (with it the kernel keeps a file's setuid and setgid bits
/// when the thread writes it, so a user who may write a setuid program
/// could change it and keep its owner's rights) and `CAP_SYS_RESOURCE`
/// (with it a write passes disk quotas and takes the blocks the file
/// system reserves for root). Bit numbers from `linux/capability.h`.
const DATA_CAPS_DROPPED: [u32; 2] = [4, 24];

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAP_VERSION_3: u32 = 0x2008_0522;

/// Drop `DATA_CAPS_DROPPED` from the calling thread's effective and
/// permitted sets (capabilities are per thread: the server's other
/// threads keep theirs). Run first on every thread that reads or writes
/// clients' data (the executors, and the event loop, which writes inline
/// and whose credentials its io_uring and the ring's kernel workers
/// take), so such a write leaves the kernel to clear the setuid and
/// setgid bits as it does for the user's own. A server without the
/// capabilities has nothing to drop.
pub fn drop_data_caps_on_thread() -> std::io::Result<()> {
    let mut data = thread_caps()?;
    let mut changed = false;
    for cap in DATA_CAPS_DROPPED {
        let (word, bit) = ((cap / 32) as usize, 1u32 << (cap % 32));
        changed |= (data[word].effective | data[word].permitted) & bit != 0;
        data[word].effective &= !bit;
        data[word].permitted &= !bit;
    }
    if !changed {
        return Ok(());
    }
    let mut head = CapHeader { version: CAP_VERSION_3, pid: 0 };
    // SAFETY: the header and two CapData of version 3 outlive the call;
    // capset only reads them.
    if unsafe { libc::syscall(libc::SYS_capset, &mut head as *mut CapHeader, data.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the calling thread holds capability `cap` in its effective set
/// (for tests).
pub fn thread_has_cap(cap: u32) -> bool {
    thread_caps().is_ok_and(|data| data[(cap / 32) as usize].effective & (1 << (cap % 32)) != 0)
}

/// The calling thread's capability sets.
fn thread_caps() -> std::io::Result<[CapData; 2]> {
    let mut head = CapHeader { version: CAP_VERSION_3, pid: 0 };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget fills two CapData for version 3; the header and data
    // outlive the call.
    if unsafe { libc::syscall(libc::SYS_capget, &mut head as *mut CapHeader, data.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(data)
}

/// The server's effective uid.
pub fn server_uid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(uid: u32) -> PeerCred {
        PeerCred { pid: 42, uid, gid: uid, groups: vec![uid, 100] }
    }

    fn cred(uid: u32) -> Cred {
        Cred { uid, gid: uid, groups: vec![] }
    }

    #[test]
    fn a_unix_peer_is_who_the_kernel_says_and_cannot_claim_another() {
        assert!(!needs_key(Some(&peer(1000)), None));
        let id = identify(Some(&peer(1000)), None, Squash::Root, 0).unwrap();
        assert_eq!((id.cred.uid, id.cred.groups.clone(), id.pid), (1000, vec![1000, 100], Some(42)));
        // Stating root from a non-root peer needs the key first.
        assert!(needs_key(Some(&peer(1000)), Some(&cred(0))));
        // Local root may forward (a mount run by root).
        assert!(!needs_key(Some(&peer(0)), Some(&cred(1000))));
    }

    #[test]
    fn squash_root_maps_group_zero_stated_over_the_network() {
        let stated = Cred { uid: 1000, gid: 0, groups: vec![0, 100] };
        let id = identify(None, Some(&stated), Squash::Root, 0).unwrap();
        assert_eq!((id.cred.uid, id.cred.gid, id.cred.groups), (1000, ANON_ID, vec![ANON_ID, 100]));
        // A local peer's groups come from the kernel: kept.
        let local = PeerCred { pid: 42, uid: 1000, gid: 0, groups: vec![0] };
        let id = identify(Some(&local), None, Squash::Root, 0).unwrap();
        assert_eq!((id.cred.gid, id.cred.groups), (0, vec![0]));
        // `--squash none` trusts the stated group.
        assert_eq!(identify(None, Some(&stated), Squash::None, 0).unwrap().cred.gid, 0);
    }

    #[test]
    fn dropping_the_data_capabilities_leaves_other_threads_theirs() {
        const CAP_FSETID: u32 = 4;
        let before = thread_has_cap(CAP_FSETID);
        let on_thread = std::thread::spawn(|| {
            drop_data_caps_on_thread().unwrap();
            (thread_has_cap(CAP_FSETID), thread_has_cap(24))
        })
        .join()
        .unwrap();
        assert_eq!(on_thread, (false, false));
        // This thread kept what it had (root in CI: CAP_FSETID).
        assert_eq!(thread_has_cap(CAP_FSETID), before);
    }

    #[test]
    fn squash_root_maps_network_root_but_not_local_root() {
        assert!(needs_key(None, Some(&cred(0))));
        assert_eq!(identify(None, Some(&cred(0)), Squash::Root, 0).unwrap().cred.uid, ANON_ID);
        assert_eq!(identify(None, Some(&cred(5)), Squash::Root, 0).unwrap().cred.uid, 5);
        assert_eq!(identify(Some(&peer(0)), None, Squash::Root, 0).unwrap().cred.uid, 0);
        assert_eq!(identify(Some(&peer(0)), Some(&cred(0)), Squash::Root, 0).unwrap().cred.uid, 0);
        assert_eq!(identify(Some(&peer(5)), None, Squash::All, 0).unwrap().cred.uid, ANON_ID);
        assert_eq!(identify(None, Some(&cred(0)), Squash::None, 0).unwrap().cred.uid, 0);
        assert!(identify(None, None, Squash::Root, 0).is_err(), "TCP must state an identity");
    }

    #[test]
    fn a_server_not_running_as_root_admits_only_its_own_user() {
        assert!(identify(Some(&peer(1000)), None, Squash::Root, 1000).is_ok());
        assert_eq!(identify(Some(&peer(1001)), None, Squash::Root, 1000).unwrap_err().errno, libc::EACCES);
        assert!(identify(Some(&peer(0)), None, Squash::Root, 1000).is_ok());
    }

    #[test]
    fn only_root_creates_setuid_or_setgid_files() {
        let user = identify(Some(&peer(1000)), None, Squash::Root, 0).unwrap();
        let root = identify(Some(&peer(0)), None, Squash::Root, 0).unwrap();
        assert_eq!(create_mode(&user, 0o104755), 0o755);
        assert_eq!(create_mode(&user, 0o2775), 0o775);
        assert_eq!(create_mode(&root, 0o4755), 0o4755);
    }
}
