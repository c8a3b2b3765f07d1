//! The metadata pool: `META_THREADS` threads that run the metadata calls
//! which may block (opens, namespace calls, syncs) off the event loop.
//!
//! Each call runs as its connection's identity: the thread takes it
//! (`ident::take_on_thread`: groups, fsgid, fsuid, which change that thread
//! only) before the call whenever it differs from the one the thread holds,
//! so the kernel checks every path and create itself. The connection's
//! session travels with the call and comes back with the reply; the
//! connection is not read meanwhile, which keeps its calls in order.

use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};

use sluice_proto::{parse_request, Cred, Header};

use crate::ops::Session;
use crate::pending::Out;
use crate::shared::Shared;
use crate::sync::lock;
use crate::waker::Waker;

/// Threads running metadata calls. Four: a slow `fsync` or `open` on one
/// connection leaves three for everybody else.
pub const META_THREADS: usize = 4;

/// One metadata call, with the session it acts in.
pub struct MetaJob {
    pub conn: u64,
    pub session: Box<Session>,
    pub header: Header,
    pub body: Vec<u8>,
}

/// Its outcome; the session comes back to the connection.
pub struct MetaDone {
    pub conn: u64,
    pub session: Box<Session>,
    pub wire_id: u64,
    pub out: Out,
}

/// Run calls until the channel closes.
pub fn worker(shared: Arc<Shared>, jobs: Arc<Mutex<Receiver<MetaJob>>>, done: Sender<MetaDone>, waker: Arc<Waker>) {
    creates_as_asked();
    let mut holding: Option<Cred> = None;
    loop {
        let next = lock(&jobs).recv();
        let Ok(job) = next else { return };
        if done.send(serve_one(&shared, job, &mut holding)).is_err() {
            return;
        }
        waker.wake();
    }
}

/// Carry out one call on this thread, holding the credentials `holding`
/// took last (a worker's loop; the test that drives the event loop by
/// hand, `evloop/sim/`, calls it too).
pub fn serve_one(shared: &Shared, mut job: MetaJob, holding: &mut Option<Cred>) -> MetaDone {
    let wire_id = job.header.request_id;
    let out = run(shared, &mut job, holding);
    MetaDone { conn: job.conn, session: job.session, wire_id, out }
}

fn run(shared: &Shared, job: &mut MetaJob, holding: &mut Option<Cred>) -> Out {
    let cred = &job.session.ident.cred;
    if holding.as_ref() != Some(cred) {
        *holding = None;
        if let Err(e) = crate::ident::take_on_thread(cred, shared.server_uid) {
            return Out::Error(e.errno, e.message);
        }
        *holding = Some(cred.clone());
    }
    match parse_request(&job.header, &job.body) {
        Ok(req) => job.session.metadata(shared, req).unwrap_or_else(|e| Out::Error(e.errno, e.message)),
        Err(e) => Out::Error(e.errno(), e.to_string()),
    }
}

/// Give this thread a file-system context of its own (`unshare(CLONE_FS)`:
/// cwd, root and umask; the server's other threads keep theirs) with a
/// umask of 0, so what it creates gets the mode the client asked for. The
/// caller's umask is the client's to apply, as NFS does: the kernel
/// applies it before a FUSE `create` or `mkdir`, the interposer before it
/// sends one. Before, the server's own umask (022) was applied again: a
/// caller with umask 002 got 0644 files. Where `unshare` fails the
/// server's umask stays.
fn creates_as_asked() {
    // SAFETY: unshare and umask act on this thread's own context.
    unsafe {
        if libc::unshare(libc::CLONE_FS) == 0 {
            libc::umask(0);
        }
    }
}
