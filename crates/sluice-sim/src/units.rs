//! Units for people: byte sizes as the reports and traces print them. A
//! leaf module, so that `report` and `trace` need nothing of each other.

/// `8 KiB`, `4 MiB`, or bytes.
pub fn size(b: u64) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!((size(8192), size(4 << 20), size(5120), size(100)), ("8 KiB".into(), "4 MiB".into(), "5 KiB".into(), "100 B".into()));
    }
}
