//! Where the CPU went during a timed run: the whole machine's busy time
//! (`/proc/stat`), this process's (`/proc/self/stat`: the started
//! server's threads live here; the workers are other processes) and the
//! started server's event-loop thread's (`sluice-loop`, from its
//! `schedstat`, in nanoseconds), and the time the hypervisor took from
//! the machine's CPUs while they had work (`steal`). On a
//! machine with few cores, a mode that keeps every core busy is limited
//! by what each request costs in CPU, not by the device: these figures
//! say which. On a virtual machine, a vCPU woken for a request waits for
//! the host to run it, and that wait is steal: the 2-core development
//! VM's I/O runs have lost from a few percent to more than half of their
//! busy time to it, from one hour to the next.

use serde::Serialize;

/// A reading of the clocks, taken at the start and the end of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuSample {
    /// Ticks spent busy by all CPUs (user, nice, system, irq, softirq, steal).
    busy: u64,
    /// Ticks of all CPUs, busy or idle.
    all: u64,
    /// Ticks the hypervisor ran something else while a CPU had work
    /// (`steal`; part of `busy`).
    steal: u64,
    /// Ticks this process spent (user and system).
    own: u64,
    /// Nanoseconds the threads named `LOOP_THREAD` of this process ran;
    /// None where there is none.
    loop_ns: Option<u64>,
    /// Requests the servers of this process had answered
    /// (`sluice_server::requests_answered`).
    requests: u64,
}

/// The name of a started server's event-loop thread.
const LOOP_THREAD: &str = "sluice-loop";

/// CPU used between two samples.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct CpuUse {
    /// CPU seconds the whole machine spent busy (every process), steal
    /// included.
    pub cpu_s: f64,
    /// Of those, the seconds the hypervisor took: the machine's CPUs had
    /// work and did not run (0 on bare metal).
    pub steal_s: f64,
    /// That as a share of every core's time (1.0: all cores busy throughout).
    pub cpu_share: f64,
    /// CPU seconds of the benchmark's own process, which holds the server
    /// it started; None in `direct` mode and with an external server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_cpu_s: Option<f64>,
    /// CPU seconds of that server's event-loop thread alone (the one
    /// thread every request passes; the executor threads' copies overlap
    /// the device). None where no started server's loop ran throughout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_loop_cpu_s: Option<f64>,
    /// `server_cpu_s` per request the started servers answered, in
    /// microseconds. None where no server of this process answered one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_us_per_request: Option<f64>,
    /// CPU seconds the workers (the applications' ranks) used, each one
    /// measured in its own process from the start to its last access:
    /// unlike `cpu_s` less the server's, no other activity on the machine
    /// counts. None until the runner adds it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers_cpu_s: Option<f64>,
}

impl CpuSample {
    /// Now; None where `/proc` cannot be read (not Linux).
    pub fn now() -> Option<CpuSample> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let own = std::fs::read_to_string("/proc/self/stat").ok()?;
        Some(CpuSample { loop_ns: loop_ns(), requests: sluice_server::requests_answered(), ..parse(&stat, &own)? })
    }

    /// What was used from `self` to `later`.
    pub fn until(&self, later: &CpuSample) -> CpuUse {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let busy = later.busy.saturating_sub(self.busy);
        let all = later.all.saturating_sub(self.all);
        let server_cpu_s = later.own.saturating_sub(self.own) as f64 / hz;
        let requests = later.requests.saturating_sub(self.requests);
        CpuUse {
            cpu_s: busy as f64 / hz,
            steal_s: later.steal.saturating_sub(self.steal) as f64 / hz,
            cpu_share: if all == 0 { 0.0 } else { busy as f64 / all as f64 },
            server_cpu_s: Some(server_cpu_s),
            server_loop_cpu_s: self.loop_ns.zip(later.loop_ns).filter(|(a, b)| b >= a).map(|(a, b)| (b - a) as f64 / 1e9),
            server_us_per_request: (requests > 0).then(|| server_cpu_s * 1e6 / requests as f64),
            workers_cpu_s: None,
        }
    }
}

/// Nanoseconds on CPU of this process's threads named `LOOP_THREAD`
/// (the first field of each one's `schedstat`); None where there is none.
fn loop_ns() -> Option<u64> {
    let mut total = None;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let path = task.path();
        if std::fs::read_to_string(path.join("comm")).is_ok_and(|c| c.trim_end() == LOOP_THREAD) {
            let ns = std::fs::read_to_string(path.join("schedstat")).ok().and_then(|s| first_field(&s));
            total = Some(total.unwrap_or(0) + ns?);
        }
    }
    total
}

/// The first number of a `schedstat` line (time on CPU, ns).
fn first_field(schedstat: &str) -> Option<u64> {
    schedstat.split_whitespace().next()?.parse().ok()
}

/// The aggregate `cpu` line of `/proc/stat` and fields 14-15 (utime,
/// stime) of `/proc/self/stat`.
fn parse(stat: &str, own: &str) -> Option<CpuSample> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line.split_whitespace().skip(1).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice]:
    // guest time is already counted in user.
    if f.len() < 8 {
        return None;
    }
    let busy = f[0] + f[1] + f[2] + f[5] + f[6] + f[7];
    let all = busy + f[3] + f[4];
    // The command name is in parentheses and may hold spaces: count from
    // the last ')'. After it come state (field 3) ... utime (14), stime (15).
    let rest = &own[own.rfind(')')? + 1..];
    let g: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = g.get(11)?.parse().ok()?;
    let stime: u64 = g.get(12)?.parse().ok()?;
    Some(CpuSample { busy, all, steal: f[7], own: utime + stime, loop_ns: None, requests: 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  100 5 50 1000 20 3 2 10 0 0\ncpu0 50 2 25 500 10 1 1 5 0 0\nintr 1\n";
    const OWN: &str = "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 37 11 0 0 20 0 9 0 100 0 0";

    #[test]
    fn reads_the_machine_and_the_process() {
        let s = parse(STAT, OWN).expect("parses");
        assert_eq!(s, CpuSample { busy: 100 + 5 + 50 + 3 + 2 + 10, all: 170 + 1000 + 20, steal: 10, own: 48, loop_ns: None, requests: 0 });
    }

    #[test]
    fn use_between_two_samples() {
        let a = CpuSample { busy: 100, all: 1000, steal: 7, own: 10, loop_ns: Some(1_000), requests: 5 };
        let b = CpuSample { busy: 400, all: 1400, steal: 47, own: 60, loop_ns: Some(2_501_000), requests: 25 };
        let u = a.until(&b);
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        assert!((u.cpu_s - 300.0 / hz).abs() < 1e-12);
        assert!((u.cpu_share - 0.75).abs() < 1e-12);
        assert!((u.steal_s - 40.0 / hz).abs() < 1e-12);
        assert!((u.server_cpu_s.expect("measured") - 50.0 / hz).abs() < 1e-12);
        assert!((u.server_loop_cpu_s.expect("measured") - 0.0025).abs() < 1e-12);
        assert!((u.server_us_per_request.expect("20 answered") - 50.0 / hz * 1e6 / 20.0).abs() < 1e-9);
        assert_eq!(a.until(&CpuSample { requests: 5, ..b }).server_us_per_request, None, "none answered");
        // A loop that appeared or went away during the run says nothing.
        let c = CpuSample { loop_ns: None, ..b };
        assert_eq!((a.until(&c).server_loop_cpu_s, c.until(&b).server_loop_cpu_s), (None, None));
    }

    #[test]
    fn the_loop_threads_time_is_read_from_its_schedstat() {
        assert_eq!(first_field("123456789 2000 17\n"), Some(123_456_789));
        assert_eq!(first_field(""), None);
        // A thread of that name that burns 30 ms of CPU (other tests of
        // this process may run servers of their own: at least that much).
        let (tx, rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name(LOOP_THREAD.into())
            .spawn(move || {
                // 30 ms of this thread's own CPU time, not of the wall
                // clock: on a loaded machine the thread is not running the
                // whole time (a wall-clock loop gave 13.9 ms once).
                let cpu_ns = crate::calibrate::thread_cpu_ns;
                let start = cpu_ns();
                let mut x = 0u64;
                while cpu_ns() - start < 30_000_000 {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
                tx.send(()).unwrap();
                let _ = go_rx.recv();
            })
            .unwrap();
        rx.recv().unwrap();
        let ns = loop_ns().expect("the thread is found");
        go_tx.send(()).unwrap();
        t.join().unwrap();
        assert!((25_000_000..2_000_000_000).contains(&ns), "{ns} ns");
    }

    #[test]
    fn a_truncated_line_is_no_sample() {
        assert!(parse("cpu  1 2 3\n", OWN).is_none());
        assert!(parse(STAT, "4242 (x) S 1").is_none());
        assert!(CpuSample::now().is_some(), "this test runs on Linux");
    }
}
