//! What the mount did, for `sluice mount --metrics HOST:PORT`: counters the
//! file system's handlers bump (one mount per process, so they are
//! process-wide statics), rendered as Prometheus text on demand.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use sluice_metrics::{AtomicHistogram, Expo};

/// The mount's counters.
pub(crate) struct Stats {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub read_bytes: AtomicU64,
    pub written_bytes: AtomicU64,
    /// Reads answered inside a cache lease, without a message.
    pub leased_reads: AtomicU64,
    /// Opens the kernel reads by itself (passthrough).
    pub passthrough_opens: AtomicU64,
    /// Opens that named a passthrough open's backing file but send their
    /// I/O to the mount (the kernel's rule: module `fs`).
    pub shared_opens: AtomicU64,
    /// Client calls carried out (data and metadata).
    pub calls: AtomicU64,
    /// Calls answered with an errno.
    pub errors: AtomicU64,
    pub handles_open: AtomicU64,
    /// Connections to the server now (`conns.rs`).
    pub connections: AtomicU64,
    read_latency: AtomicHistogram,
    write_latency: AtomicHistogram,
}

pub(crate) static STATS: Stats = Stats {
    reads: AtomicU64::new(0),
    writes: AtomicU64::new(0),
    read_bytes: AtomicU64::new(0),
    written_bytes: AtomicU64::new(0),
    leased_reads: AtomicU64::new(0),
    passthrough_opens: AtomicU64::new(0),
    shared_opens: AtomicU64::new(0),
    calls: AtomicU64::new(0),
    errors: AtomicU64::new(0),
    handles_open: AtomicU64::new(0),
    connections: AtomicU64::new(0),
    read_latency: AtomicHistogram::new(),
    write_latency: AtomicHistogram::new(),
};

impl Stats {
    /// A read or write of `bytes` answered, begun at `since`.
    pub fn data(&self, write: bool, bytes: usize, since: Instant) {
        let ns = since.elapsed().as_nanos() as u64;
        let (n, b, h) = if write { (&self.writes, &self.written_bytes, &self.write_latency) } else { (&self.reads, &self.read_bytes, &self.read_latency) };
        n.fetch_add(1, Ordering::Relaxed);
        b.fetch_add(bytes as u64, Ordering::Relaxed);
        h.record(ns);
    }

    /// The exposition.
    pub fn render(&self) -> String {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let mut e = Expo::default();
        e.family("sluice_mount_requests_total", "counter", "Reads and writes the mount answered with data");
        e.sample("sluice_mount_requests_total", &[("op", "read")], get(&self.reads));
        e.sample("sluice_mount_requests_total", &[("op", "write")], get(&self.writes));
        e.family("sluice_mount_bytes_total", "counter", "Bytes read and written through the mount");
        e.sample("sluice_mount_bytes_total", &[("op", "read")], get(&self.read_bytes));
        e.sample("sluice_mount_bytes_total", &[("op", "write")], get(&self.written_bytes));
        let simple: [(&str, &str, &str, f64); 7] = [
            ("sluice_mount_leased_reads_total", "counter", "Reads answered inside a cache lease, without a message to the server", get(&self.leased_reads)),
            ("sluice_mount_passthrough_opens_total", "counter", "Read-only opens of files wholly in the page cache that the kernel then read itself (FUSE passthrough)", get(&self.passthrough_opens)),
            ("sluice_mount_shared_opens_total", "counter", "Opens of a file that passthrough opens held (writers, O_DIRECT, not all cached): they name its backing file, as the kernel requires, and their I/O still goes through the mount", get(&self.shared_opens)),
            ("sluice_mount_calls_total", "counter", "Client calls carried out, data and metadata", get(&self.calls)),
            ("sluice_mount_errors_total", "counter", "Client calls answered with an errno", get(&self.errors)),
            ("sluice_mount_handles_open", "gauge", "Files open through the mount now", get(&self.handles_open)),
            ("sluice_mount_connections", "gauge", "Entries of the connection table now (one per calling process, bounded)", get(&self.connections)),
        ];
        for (name, kind, help, v) in simple {
            e.family(name, kind, help);
            e.sample(name, &[], v);
        }
        e.family("sluice_mount_request_seconds", "histogram", "A read or write from the kernel's request to the mount's answer");
        self.read_latency.render(&mut e, "sluice_mount_request_seconds", ("op", "read"));
        self.write_latency.render(&mut e, "sluice_mount_request_seconds", ("op", "write"));
        e.out
    }
}
