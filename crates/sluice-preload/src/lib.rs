//! # sluice-preload: run unmodified programs against a sluice server
//!
//! Built as `libsluice_preload.so` and loaded with `LD_PRELOAD` by
//! `sluice run [--server ADDR] [--prefix PATH] -- CMD ARGS…`. Every POSIX
//! file call of the program whose path lies under `SLUICE_PREFIX` (or whose
//! fd was opened there) goes to the server at `SLUICE_SERVER`: `PREFIX/x`
//! is the server's `x`. Every other call goes straight to libc.
//!
//! ```sh
//! sluice run --server unix:/tmp/s.sock --prefix /sluice -- cp big.dat /sluice/big.dat
//! ```
//!
//! How: each interposed symbol (see `docs/preload.md` for the list)
//! decides with [`route`] whether the call is ours; if not, it calls libc's
//! definition, found once with `dlsym(RTLD_NEXT, …)` ([`real`]). A service
//! file gets a real local placeholder fd ([`placeholder`]) whose offset is
//! the file position, and an entry in a bounded table ([`state`]).
//!
//! Invariants: a call the interposer makes itself (the client library and
//! std call libc too) never comes back into it (a thread-local guard); a
//! path outside the prefix or an fd that is not a placeholder reaches libc
//! with its arguments and errno untouched; client errors become errno in
//! one place (`From<ClientError> for Errno`); a forked child never uses
//! its parent's connection or server handles.

pub mod cwd;
pub mod mode;
pub mod path;
pub mod placeholder;
pub mod real;
pub mod route;
pub mod state;

// The interposed symbols stay out of unit-test binaries, which would
// otherwise route their own I/O through them.
#[cfg(not(test))]
mod creds;
#[cfg(not(test))]
mod dir;
#[cfg(not(test))]
mod io;
#[cfg(not(test))]
mod meta;
#[cfg(not(test))]
mod stdio;
#[cfg(not(test))]
mod temp;

/// The library constructor: with a prefix configured, install the fork
/// handlers and adopt the service fds inherited across `exec`, standard
/// streams included.
#[cfg(not(test))]
extern "C" fn init() {
    let Some(_g) = state::Guard::enter() else {
        return;
    };
    if state::config().is_none() {
        return;
    }
    state::install_fork_handlers();
    state::read_umask();
    placeholder::adopt_inherited();
    cwd::adopt_inherited();
    stdio::adopt_std_streams();
}

#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;
