//! The shared key a client proves to a server before the server believes
//! the identity it states (TCP clients, and mounts that forward their
//! callers' identities).
//!
//! A key file holds 32 random bytes as 64 hex digits and a newline. It must
//! not be readable by group or others (mode 0600, as ssh demands of its
//! keys): a key anyone can read proves nothing. It must belong to the user
//! the process runs as (its effective uid) or to root, as sshd demands of
//! host keys: a key another user owns may have been planted by that user,
//! who then knows it. `sluice serve` creates one
//! when it needs one and none exists; clients read the same default path,
//! so one user's server and clients agree without configuration.
//!
//! Rotation: write a new key file (`sluice serve` makes one when the old is
//! removed), copy it to the clients' hosts, restart the server. Connections
//! already authenticated stay up; every new connection needs the new key.

use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Environment variable naming the key file.
pub const KEY_ENV: &str = "SLUICE_KEY_FILE";
/// Bytes of a key.
pub const KEY_BYTES: usize = 32;
/// Largest key file read, in bytes (64 hex digits and a newline, with
/// room); a larger one is refused, not read in part.
pub const KEY_FILE_BYTES_MAX: u64 = 4096;

/// `SLUICE_KEY_FILE`, else `$XDG_CONFIG_HOME/sluice/key`, else
/// `$HOME/.config/sluice/key`; `None` when none of these is set.
pub fn default_path() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(p) = var(KEY_ENV) {
        return Some(p);
    }
    var("XDG_CONFIG_HOME").or_else(|| var("HOME").map(|h| h.join(".config"))).map(|d| d.join("sluice").join("key"))
}

fn bad(path: &Path, why: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("key file {}: {why}", path.display()))
}

/// Read a key file; refused when group or others may read it, when
/// another user than this process's effective uid or root owns it
/// (`PermissionDenied`), when it is larger than `KEY_FILE_BYTES_MAX`, or
/// when it does not hold exactly 64 hex digits (blank space around them
/// allowed). Every reader of a key (servers, metadata role, clients) comes
/// through here, so the checks hold for all of them.
pub fn load(path: &Path) -> io::Result<[u8; KEY_BYTES]> {
    let f = std::fs::File::open(path).map_err(|e| io::Error::new(e.kind(), format!("key file {}: {e}", path.display())))?;
    let meta = f.metadata().map_err(|e| bad(path, e))?;
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    check_owner(path, meta.uid(), euid)?;
    let mode = meta.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(bad(path, format_args!("mode {:04o} lets others read it; chmod 600 it", mode & 0o7777)));
    }
    let mut text = String::new();
    f.take(KEY_FILE_BYTES_MAX + 1).read_to_string(&mut text).map_err(|e| bad(path, e))?;
    if text.len() as u64 > KEY_FILE_BYTES_MAX {
        return Err(bad(path, format_args!("larger than {KEY_FILE_BYTES_MAX} bytes (KEY_FILE_BYTES_MAX)")));
    }
    let hex = text.trim();
    if hex.len() != KEY_BYTES * 2 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad(path, format_args!("expected {} hex digits", KEY_BYTES * 2)));
    }
    let mut key = [0u8; KEY_BYTES];
    for (i, k) in key.iter_mut().enumerate() {
        *k = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|e| bad(path, e))?;
    }
    Ok(key)
}

/// A key file owned by `owner` is trusted by a process of effective uid
/// `euid` when one of them owns it or root does; otherwise the error names
/// the file, its owner and the owner expected.
fn check_owner(path: &Path, owner: u32, euid: u32) -> io::Result<()> {
    if owner == euid || owner == 0 {
        return Ok(());
    }
    let expected = if euid == 0 { "root (uid 0)".to_string() } else { format!("uid {euid} (this process's user) or root") };
    let msg = format!("key file {}: owned by uid {owner}, expected {expected}; another user could have planted it (chown it, or make a new key)", path.display());
    Err(io::Error::new(io::ErrorKind::PermissionDenied, msg))
}

/// `N` bytes from the kernel's random source.
pub fn random<const N: usize>() -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    let mut at = 0;
    while at < N {
        // SAFETY: b[at..] is valid for N - at bytes.
        let r = unsafe { libc::getrandom(b[at..].as_mut_ptr().cast(), N - at, 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        at += r as usize;
    }
    Ok(b)
}

/// Load the key at `path`, or create it (mode 0600, its directory 0700
/// when made) when the file does not exist. Returns the key and whether it
/// was created.
pub fn load_or_create(path: &Path) -> io::Result<([u8; KEY_BYTES], bool)> {
    match load(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        other => return other.map(|k| (k, false)),
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| bad(path, format_args!("cannot create its directory: {e}")))?;
    }
    // Written whole under a private name, then linked into place: a
    // concurrent creator either wins the link or loads the winner's key,
    // and nobody ever reads a half-written file.
    let key = random::<KEY_BYTES>()?;
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let tmp = path.with_extension(format!("tmp-{}-{:016x}", std::process::id(), u64::from_le_bytes(random::<8>()?)));
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(|e| bad(&tmp, e))?;
    let written = f.write_all(format!("{hex}\n").as_bytes()).and_then(|()| f.sync_all()).and_then(|()| std::fs::hard_link(&tmp, path));
    let _ = std::fs::remove_file(&tmp);
    match written {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return load(path).map(|k| (k, false)),
        other => other.map_err(|e| bad(path, e))?,
    }
    Ok((key, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_created_key_loads_back_and_a_readable_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("sluice-key-test-{}", std::process::id()));
        let path = dir.join("sub").join("key");
        let (k, created) = load_or_create(&path).unwrap();
        assert!(created);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(load_or_create(&path).unwrap(), (k, false));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = load(&path).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "abc\n").unwrap();
        assert!(load(&path).unwrap_err().to_string().contains("hex digits"));
        // The size bound at N (the key, then blank space) and N + 1.
        let hex: String = k.iter().map(|b| format!("{b:02x}")).collect();
        let pad = KEY_FILE_BYTES_MAX as usize - hex.len();
        std::fs::write(&path, format!("{hex}{}", " ".repeat(pad))).unwrap();
        assert_eq!(load(&path).unwrap(), k, "a key file of exactly KEY_FILE_BYTES_MAX bytes");
        std::fs::write(&path, format!("{hex}{}", " ".repeat(pad + 1))).unwrap();
        assert!(load(&path).unwrap_err().to_string().contains("KEY_FILE_BYTES_MAX"), "one byte more is refused, not cut");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_key_is_trusted_only_from_its_user_or_root() {
        let p = Path::new("/k");
        assert!(check_owner(p, 1000, 1000).is_ok(), "the process's own user");
        assert!(check_owner(p, 0, 1000).is_ok(), "root");
        assert!(check_owner(p, 0, 0).is_ok());
        let e = check_owner(p, 65_534, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        let m = e.to_string();
        assert!(m.contains("/k") && m.contains("owned by uid 65534") && m.contains("expected root (uid 0)"), "{m}");
        let m = check_owner(p, 1001, 1000).unwrap_err().to_string();
        assert!(m.contains("expected uid 1000 (this process's user) or root"), "{m}");
    }

    #[test]
    fn a_key_file_another_user_owns_is_refused_by_load() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return; // chown needs root; check_owner's test covers the rule.
        }
        let dir = std::env::temp_dir().join(format!("sluice-key-owner-test-{}", std::process::id()));
        let path = dir.join("key");
        let (k, _) = load_or_create(&path).unwrap();
        std::os::unix::fs::chown(&path, Some(65_534), Some(65_534)).unwrap();
        let e = load(&path).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert!(e.to_string().contains("owned by uid 65534"), "{e}");
        assert!(load_or_create(&path).is_err(), "nor replaced silently");
        std::os::unix::fs::chown(&path, Some(0), Some(0)).unwrap();
        assert_eq!(load(&path).unwrap(), k);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
