//! `fopen` mode strings as `open(2)` flags.

use libc::c_int;

/// `open(2)` flags of an `fopen` mode string; `None`: invalid mode.
pub fn mode_flags(mode: &[u8]) -> Option<c_int> {
    let (first, rest) = mode.split_first()?;
    let plus = rest.contains(&b'+');
    let mut f = match (first, plus) {
        (b'r', false) => libc::O_RDONLY,
        (b'r', true) => libc::O_RDWR,
        (b'w', false) => libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        (b'w', true) => libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC,
        (b'a', false) => libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        (b'a', true) => libc::O_RDWR | libc::O_CREAT | libc::O_APPEND,
        _ => return None,
    };
    for c in rest.iter().take_while(|&&c| c != b',') {
        match c {
            b'x' => f |= libc::O_EXCL,
            b'e' => f |= libc::O_CLOEXEC,
            _ => {}
        }
    }
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::mode_flags;

    #[test]
    fn fopen_modes_map_to_open_flags() {
        assert_eq!(mode_flags(b"r"), Some(libc::O_RDONLY));
        assert_eq!(mode_flags(b"rb+"), Some(libc::O_RDWR));
        assert_eq!(mode_flags(b"w"), Some(libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC));
        assert_eq!(mode_flags(b"a+"), Some(libc::O_RDWR | libc::O_CREAT | libc::O_APPEND));
        assert_eq!(mode_flags(b"wxe"), Some(libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL | libc::O_CLOEXEC));
        assert_eq!(mode_flags(b"q"), None);
        assert_eq!(mode_flags(b""), None);
    }
}
