//! Giving up on a call whose caller is gone.
//!
//! A hard client waits for a dead or silent server for as long as it
//! takes, as an NFS hard mount does. A front end that makes calls on
//! behalf of other processes (the FUSE mount) must still let those
//! processes die: the kernel keeps a process killed in the middle of a
//! FUSE request in uninterruptible sleep until the mount answers it.
//!
//! So a thread may name a check for the call it is about to make
//! (`Abandon::when`): a plain function and one argument (the caller's
//! pid, for the mount). Wherever a call waits for the server (between
//! reconnection attempts, between looks at a post record) the client
//! runs the check at least every `CHECK_EVERY`; when it says yes, the
//! call fails at once with `Interrupted` (EINTR). Nothing else changes:
//! the connection and its recovery stay as they are for every other
//! caller, and a call that is not waiting never runs the check.

use std::cell::Cell;
use std::time::{Duration, Instant};

use crate::error::{ClientError, ClientErrorKind};

/// Longest a waiting call goes without running its thread's check.
pub const CHECK_EVERY: Duration = Duration::from_millis(100);

/// A check: `f(arg)` says whether the call should be given up.
type Check = (fn(u32) -> bool, u32);

/// A thread's check, when it last ran, and whether it said to give up.
#[derive(Clone, Copy)]
struct State {
    check: Option<Check>,
    last: Option<Instant>,
    gone: bool,
}

/// A check that said no is not run again sooner than this: a call that
/// waits in slices, or a leader reading replies for others, would
/// otherwise run it (a read of `/proc` for the mount) at every turn.
const CHECK_AGAIN_AFTER: Duration = Duration::from_millis(50);

thread_local! {
    static STATE: Cell<State> = const { Cell::new(State { check: None, last: None, gone: false }) };
}

/// The check of this thread's calls while it lives; the previous one is
/// back when it is dropped.
#[must_use = "the check lasts as long as the guard"]
pub struct Abandon {
    previous: State,
}

impl Abandon {
    /// Give up this thread's waiting calls when `f(arg)` says so.
    pub fn when(f: fn(u32) -> bool, arg: u32) -> Abandon {
        Abandon { previous: STATE.with(|c| c.replace(State { check: Some((f, arg)), last: None, gone: false })) }
    }
}

impl Drop for Abandon {
    fn drop(&mut self) {
        STATE.with(|c| c.set(self.previous));
    }
}

/// Whether this thread's calls have a check: their caller may go away.
pub(crate) fn armed() -> bool {
    STATE.with(Cell::get).check.is_some()
}

/// `Err(Interrupted)` when this thread's check says to give up. Once it
/// said so, it says so at once for the rest of the guard (each call a
/// dying caller still waits for leaves without a slice); a check that
/// said no runs again only after `CHECK_AGAIN_AFTER`.
pub(crate) fn check(what: &str) -> Result<(), ClientError> {
    let mut st = STATE.with(Cell::get);
    let Some((f, arg)) = st.check else { return Ok(()) };
    if !st.gone && st.last.is_some_and(|t| t.elapsed() < CHECK_AGAIN_AFTER) {
        return Ok(());
    }
    st.gone = st.gone || f(arg);
    st.last = Some(Instant::now());
    STATE.with(|c| c.set(st));
    match st.gone {
        true => Err(ClientError::new(ClientErrorKind::Interrupted, libc::EINTR, format!("{what}: given up, its caller is gone"))),
        false => Ok(()),
    }
}

/// Sleep `pause`, in slices of at most `CHECK_EVERY`, running the check
/// between them (`Interrupted` when it says to give up).
pub fn sleep(pause: Duration, what: &str) -> Result<(), ClientError> {
    let mut left = pause;
    loop {
        check(what)?;
        if left.is_zero() {
            return Ok(());
        }
        let slice = left.min(CHECK_EVERY);
        std::thread::sleep(slice);
        left -= slice;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Instant;

    static CALLS: AtomicU32 = AtomicU32::new(0);

    fn after_three(limit: u32) -> bool {
        CALLS.fetch_add(1, Ordering::Relaxed) + 1 >= limit
    }

    fn never(_: u32) -> bool {
        false
    }

    #[test]
    fn no_check_never_gives_up() {
        assert!(check("x").is_ok());
        assert!(sleep(Duration::from_millis(1), "x").is_ok());
    }

    #[test]
    fn a_sleep_is_cut_short_within_a_slice_of_the_check_saying_yes() {
        CALLS.store(0, Ordering::Relaxed);
        let _g = Abandon::when(after_three, 3);
        let t = Instant::now();
        let e = sleep(Duration::from_secs(10), "read").unwrap_err();
        assert_eq!((e.kind, e.errno), (ClientErrorKind::Interrupted, libc::EINTR));
        assert!(t.elapsed() < 3 * CHECK_EVERY + Duration::from_millis(500), "{:?}", t.elapsed());
    }

    static RUNS: AtomicU32 = AtomicU32::new(0);

    fn counted(gone: u32) -> bool {
        RUNS.fetch_add(1, Ordering::Relaxed);
        gone == 1
    }

    /// A no is not asked again within `CHECK_AGAIN_AFTER`; a yes stands
    /// for the rest of the guard without asking again.
    #[test]
    fn a_no_is_kept_a_while_and_a_yes_for_good() {
        RUNS.store(0, Ordering::Relaxed);
        {
            let _g = Abandon::when(counted, 0);
            assert!(check("x").is_ok() && check("x").is_ok());
            assert_eq!(RUNS.load(Ordering::Relaxed), 1, "asked once within the interval");
            std::thread::sleep(CHECK_AGAIN_AFTER + Duration::from_millis(10));
            assert!(check("x").is_ok());
            assert_eq!(RUNS.load(Ordering::Relaxed), 2, "asked again after it");
        }
        let _g = Abandon::when(counted, 1);
        assert!(check("x").is_err());
        assert!(check("x").is_err() && check("x").is_err());
        assert_eq!(RUNS.load(Ordering::Relaxed), 3, "a yes is not asked again");
    }

    #[test]
    fn guards_nest_and_restore() {
        {
            let _outer = Abandon::when(never, 0);
            {
                let _inner = Abandon::when(|_| true, 0);
                assert!(check("x").is_err());
            }
            assert!(check("x").is_ok());
        }
        assert!(!armed());
    }
}
