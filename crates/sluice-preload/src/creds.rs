//! The calls that change a process's credentials. The server takes a
//! connection's identity from the socket's peer credentials when it
//! connects (`SO_PEERCRED`), so after any of these succeeds the process
//! connects anew (`state::credentials_changed`); files it opened before
//! stay open as the identity that opened them, as the kernel's do. A
//! program that dropped root (a job launcher, a daemon) kept root's
//! rights on the server before.

use libc::{c_int, gid_t, size_t, uid_t};

use crate::real::real;
use crate::state::{config, credentials_changed};

/// After a real credential call: `r` as it was, the connection renewed
/// when it succeeded.
fn renewed(r: c_int) -> c_int {
    if r == 0 && config().is_some() {
        credentials_changed();
    }
    r
}

macro_rules! cred_exports {
    ($($name:ident($($a:ident: $t:ty),*);)*) => {$(
        /// Interposed: libc's, then a new connection as the new identity.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            // SAFETY: forwarding the caller's arguments.
            renewed(unsafe { real!($name, fn($($t),*) -> c_int)($($a),*) })
        }
    )*};
}
cred_exports! {
    setuid(uid: uid_t);
    setgid(gid: gid_t);
    seteuid(uid: uid_t);
    setegid(gid: gid_t);
    setreuid(r: uid_t, e: uid_t);
    setregid(r: gid_t, e: gid_t);
    setresuid(r: uid_t, e: uid_t, s: uid_t);
    setresgid(r: gid_t, e: gid_t, s: gid_t);
    setgroups(n: size_t, list: *const gid_t);
}
