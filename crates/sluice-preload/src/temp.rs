//! `mkstemp`, `mkostemp`, `mkstemps`, `mkostemps` and `mkdtemp` on
//! service paths. glibc's own make the file with an internal `open`, so
//! `sed -i`, `perl -i` and `zip` failed with "couldn't open temporary
//! file" (ENOENT) under the prefix. The name is made as glibc makes it:
//! the six `X`s before the suffix replaced with random letters and
//! digits, tried again while the name exists.

use libc::{c_char, c_int};

use crate::io::svc_open;
use crate::real::real;
use crate::route::service_path;
use crate::state::{client, finish, masked, Errno};

/// Names tried before giving up (EEXIST), as glibc's `TMP_MAX`-bounded loop.
const TRIES_MAX: u32 = 238_328;
const LETTERS: &[u8; 62] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

/// Six random characters from `LETTERS`.
fn six() -> [u8; 6] {
    let mut r = [0u8; 6];
    // SAFETY: getrandom into a buffer of its length.
    let n = unsafe { libc::getrandom(r.as_mut_ptr().cast(), r.len(), 0) };
    if n != r.len() as isize {
        // A clock-and-address fallback: unpredictability is not needed,
        // the O_EXCL create decides.
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64) ^ (r.as_ptr() as u64);
        r.iter_mut().enumerate().for_each(|(i, b)| *b = (t >> (i * 8)) as u8);
    }
    r.map(|b| LETTERS[b as usize % LETTERS.len()])
}

/// Where the six `X`s are in `template` (`suffix` bytes from the end),
/// both in the caller's string and in its server path.
fn x_at(len: usize, suffix: usize) -> Option<usize> {
    len.checked_sub(suffix)?.checked_sub(6)
}

/// Run `make` on server paths with the `X`s filled in until it does not
/// answer EEXIST; the caller's template gets the name that was made.
///
/// # Safety
/// `template` is a writable NUL-terminated string.
unsafe fn made<T>(template: *mut c_char, server: &str, suffix: c_int, mut make: impl FnMut(&str) -> Result<T, Errno>) -> Result<T, Errno> {
    // SAFETY: as required of the caller.
    let len = unsafe { libc::strlen(template) };
    let suffix = usize::try_from(suffix).map_err(|_| Errno(libc::EINVAL))?;
    let (at, sat) = (x_at(len, suffix).ok_or(Errno(libc::EINVAL))?, x_at(server.len(), suffix).ok_or(Errno(libc::EINVAL))?);
    // SAFETY: `at + 6 <= len` bytes of the caller's string.
    let xs = unsafe { std::slice::from_raw_parts_mut(template.add(at).cast::<u8>(), 6) };
    if xs != b"XXXXXX" || server.as_bytes()[sat..sat + 6] != *b"XXXXXX" {
        return Err(Errno(libc::EINVAL));
    }
    let mut name = server.as_bytes().to_vec();
    for _ in 0..TRIES_MAX {
        let x = six();
        name[sat..sat + 6].copy_from_slice(&x);
        let path = std::str::from_utf8(&name).map_err(|_| Errno(libc::EINVAL))?;
        match make(path) {
            Err(Errno(libc::EEXIST)) => continue,
            Err(e) => return Err(e),
            Ok(v) => {
                xs.copy_from_slice(&x);
                return Ok(v);
            }
        }
    }
    Err(Errno(libc::EEXIST))
}

/// # Safety
/// As `mkostemps`.
unsafe fn temp_file(template: *mut c_char, suffix: c_int, flags: c_int) -> Option<c_int> {
    // SAFETY: the caller's template string.
    let (_g, p) = unsafe { service_path(libc::AT_FDCWD, template) }?;
    let flags = (flags & (libc::O_APPEND | libc::O_CLOEXEC | libc::O_DIRECT | libc::O_NOATIME | libc::O_SYNC | libc::O_DSYNC)) | libc::O_RDWR | libc::O_CREAT | libc::O_EXCL;
    // SAFETY: as above.
    Some(finish(unsafe { made(template, &p, suffix, |path| svc_open(path, flags, 0o600)) }, -1))
}

macro_rules! mkstemp_exports {
    ($($name:ident($($a:ident: $t:ty),*) => ($suffix:expr, $flags:expr);)*) => {$(
        /// Interposed: on a service path the file is made on the server.
        #[no_mangle]
        pub unsafe extern "C" fn $name(template: *mut c_char $(, $a: $t)*) -> c_int {
            // SAFETY: the caller's template.
            if let Some(fd) = unsafe { temp_file(template, $suffix, $flags) } {
                return fd;
            }
            // SAFETY: forwarding the caller's arguments.
            unsafe { real!($name, fn(*mut c_char $(, $t)*) -> c_int)(template $(, $a)*) }
        }
    )*};
}
mkstemp_exports! {
    mkstemp() => (0, 0);
    mkstemp64() => (0, 0);
    mkostemp(flags: c_int) => (0, flags);
    mkostemp64(flags: c_int) => (0, flags);
    mkstemps(suffix: c_int) => (suffix, 0);
    mkstemps64(suffix: c_int) => (suffix, 0);
    mkostemps(suffix: c_int, flags: c_int) => (suffix, flags);
    mkostemps64(suffix: c_int, flags: c_int) => (suffix, flags);
}

/// Interposed `mkdtemp`: on a service path the directory (0700) is made
/// on the server.
#[no_mangle]
pub unsafe extern "C" fn mkdtemp(template: *mut c_char) -> *mut c_char {
    // SAFETY: the caller's template string.
    if let Some((_g, p)) = unsafe { service_path(libc::AT_FDCWD, template) } {
        let mkdir = |path: &str| -> Result<(), Errno> { Ok(client()?.mkdir(path, masked(0o700))?) };
        // SAFETY: the caller's writable template.
        return finish(unsafe { made(template, &p, 0, mkdir) }.map(|()| template), std::ptr::null_mut());
    }
    // SAFETY: forwarding the caller's argument.
    unsafe { real!(mkdtemp, fn(*mut c_char) -> *mut c_char)(template) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_xs_sit_before_the_suffix() {
        assert_eq!(x_at(10, 0), Some(4));
        assert_eq!(x_at(10, 4), Some(0));
        assert_eq!(x_at(10, 5), None);
        assert!(six().iter().all(|b| LETTERS.contains(b)));
    }
}
