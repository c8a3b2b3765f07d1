//! The multi-host test on one machine: three server hosts and two
//! client hosts, each its own network namespace with its own address on a
//! bridge (in a sixth, switch namespace). Data servers are `sluice serve`
//! over TCP, the metadata role `sluice meta` on server host 0. Two clients
//! write one striped file, read it back, `getstripe` shows the objects on
//! all three servers; one data server is killed while a client is reading
//! (that client gets a clear error within seconds while a file on another
//! server stays readable) and restarted (everything acknowledged reads
//! back). Each client link is shaped with `tc`: `netem` delay and rate
//! where the kernel has netem, else a `tbf` rate limit (this development
//! VM's kernel has no netem), else unshaped, as the test's stderr says.
//! Namespaces and processes are removed even on failure; without the
//! rights to create namespaces the test says so and skips.

use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_remote::{ErrorKind, LayoutRequest, StripedClient};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");
const SERVERS: usize = 3;
const CLIENTS: usize = 2;
const DATA_PORT: u16 = 7000;
const META_PORT: u16 = 7100;
/// Shaping of each client host's link: rate, and delay where netem exists.
const CLIENT_RATE: &str = "1gbit";
const CLIENT_DELAY: &str = "2ms";

/// The namespaces this test made; deleted when dropped.
struct Netns {
    names: Vec<String>,
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let o = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim()))
    }
}

fn host_addr(i: usize) -> String {
    format!("10.77.0.{}", i + 1)
}

/// Hosts 0..SERVERS are servers, then the clients; all on one bridge.
fn make_network(net: &mut Netns, prefix: &str) -> Result<(), String> {
    let sw = format!("{prefix}sw");
    ip(&["netns", "add", &sw])?;
    net.names.push(sw.clone());
    ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
    ip(&["-n", &sw, "link", "set", "br0", "up"])?;
    for i in 0..SERVERS + CLIENTS {
        let h = format!("{prefix}h{i}");
        ip(&["netns", "add", &h])?;
        net.names.push(h.clone());
        let port = format!("p{i}");
        ip(&["-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &h])?;
        ip(&["-n", &sw, "link", "set", &port, "master", "br0", "up"])?;
        ip(&["-n", &h, "addr", "add", &format!("{}/24", host_addr(i)), "dev", "eth0"])?;
        ip(&["-n", &h, "link", "set", "eth0", "up"])?;
        ip(&["-n", &h, "link", "set", "lo", "up"])?;
    }
    Ok(())
}

/// Shape client host `h`'s link with `tc`: netem (delay and rate), else
/// tbf (rate only); returns which, or `None` when neither qdisc exists.
fn shape(h: &str) -> Option<&'static str> {
    let tc = |args: &[&str]| Command::new("tc").args(["-n", h, "qdisc", "replace", "dev", "eth0", "root"]).args(args).output().is_ok_and(|o| o.status.success());
    if tc(&["netem", "delay", CLIENT_DELAY, "rate", CLIENT_RATE]) {
        return Some("netem");
    }
    tc(&["tbf", "rate", CLIENT_RATE, "burst", "256kb", "latency", "50ms"]).then_some("tbf")
}

/// A process in a namespace, killed when dropped; stdout kept open.
struct Proc {
    child: Child,
    _out: Option<BufReader<ChildStdout>>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run `sluice ARGS` in namespace `ns`; wait for a stdout line starting with `ready`.
fn spawn_in(ns: &str, args: &[String], ready: &str) -> Proc {
    let child = Command::new("ip").args(["netns", "exec", ns, SLUICE]).args(args).stdout(Stdio::piped()).spawn().unwrap();
    let mut p = Proc { child, _out: None };
    let mut out = BufReader::new(p.child.stdout.take().unwrap());
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 && !line.starts_with(ready) {
        line.clear();
    }
    assert!(line.starts_with(ready), "sluice {args:?} in {ns} exited before {ready:?}");
    p._out = Some(out);
    p
}

/// Run `f` on a thread that has entered network namespace `ns`.
fn in_ns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
            // SAFETY: setns on a namespace file we opened; it affects only
            // this thread.
            assert_eq!(unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) }, 0, "setns {ns}");
            f()
        })
        .join()
        .unwrap()
    })
}

fn pattern(offset: u64, len: u64) -> Vec<u8> {
    (offset..offset + len).map(|a| (a.wrapping_mul(2654435761) >> 13) as u8).collect()
}

fn serve_args(root: &std::path::Path, i: usize) -> Vec<String> {
    let root = root.join(format!("data-{i}"));
    std::fs::create_dir_all(root.join("objects")).unwrap();
    // Root on the client hosts stays root (--squash none): this test is
    // about striping over hosts; tests/hostile.rs covers squash.
    vec!["serve".into(), "--root".into(), root.display().to_string(), "--listen".into(), format!("tcp:{}:{DATA_PORT}", host_addr(i)), "--squash".into(), "none".into()]
}

#[test]
fn striped_files_over_three_server_hosts_and_two_client_hosts() {
    let prefix = format!("sl{}", std::process::id());
    let mut net = Netns { names: Vec::new() };
    // SAFETY: geteuid only reads the caller's credentials.
    let root_user = unsafe { libc::geteuid() } == 0;
    if let Err(e) = root_user.then_some(()).ok_or_else(|| "not root".to_string()).and_then(|()| make_network(&mut net, &prefix)) {
        eprintln!("skipping the multi-host test: cannot create network namespaces ({e})");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let host = |i: usize| format!("{prefix}h{i}");
    for k in SERVERS..SERVERS + CLIENTS {
        match shape(&host(k)) {
            Some("netem") => eprintln!("client host {k}: netem delay {CLIENT_DELAY}, rate {CLIENT_RATE}"),
            Some(q) => eprintln!("client host {k}: {q} rate {CLIENT_RATE} (no netem in this kernel: no added delay)"),
            None => eprintln!("client host {k}: unshaped (tc has neither netem nor tbf here)"),
        }
    }
    let mut servers: Vec<Option<Proc>> = (0..SERVERS).map(|i| Some(spawn_in(&host(i), &serve_args(dir.path(), i), "sluice: serving"))).collect();
    let mut meta_args: Vec<String> =
        vec!["meta".into(), "--db".into(), dir.path().join("meta.redb").display().to_string(), "--listen".into(), format!("tcp:{}:{META_PORT}", host_addr(0))];
    for i in 0..SERVERS {
        meta_args.extend(["--data".into(), format!("tcp:{}:{DATA_PORT}", host_addr(i))]);
    }
    let _meta = spawn_in(&host(0), &meta_args, "export SLUICE_SERVER=");
    let addr = format!("tcp:{}:{META_PORT}", host_addr(0));
    let client_host = |k: usize| host(SERVERS + k);
    let (block, blocks) = (48_000u64, 30u64);
    in_ns(&client_host(0), || {
        let c = StripedClient::connect(&addr).unwrap();
        c.create("shared.dat", LayoutRequest { stripe_bytes: 16 << 10, count: -1, start: 0 }).unwrap();
        let f = c.create("on0.dat", LayoutRequest { stripe_bytes: 0, count: 1, start: 0 }).unwrap();
        c.pwrite(&f, &pattern(0, 100_000), 0).unwrap();
    });
    // Both client hosts write alternate blocks at once.
    std::thread::scope(|s| {
        for k in 0..CLIENTS {
            let (ns, addr) = (client_host(k), addr.clone());
            s.spawn(move || {
                in_ns(&ns, || {
                    let c = StripedClient::connect(&addr).unwrap();
                    let f = c.open("shared.dat", libc::O_RDWR).unwrap();
                    for b in (k as u64..blocks).step_by(CLIENTS) {
                        c.pwrite(&f, &pattern(b * block, block), b * block).unwrap();
                    }
                })
            });
        }
    });
    let total = block * blocks;
    in_ns(&client_host(1), || {
        let c = StripedClient::connect(&addr).unwrap();
        let f = c.open("shared.dat", libc::O_RDONLY).unwrap();
        let mut buf = vec![0u8; total as usize];
        assert_eq!(c.pread(&f, &mut buf, 0).unwrap(), total as usize);
        assert!(buf == pattern(0, total), "read back differs from what the two client hosts wrote");
    });
    let o = Command::new("ip").args(["netns", "exec", &client_host(0), SLUICE, "getstripe", "--server", &addr, "shared.dat"]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "getstripe: {}", String::from_utf8_lossy(&o.stderr));
    for i in 0..SERVERS {
        assert!(out.contains(&format!("tcp:{}:{DATA_PORT}", host_addr(i))), "no object on server {i}:\n{out}");
    }
    // Kill data server 2 while client host 0 reads the striped file in a
    // loop: that reader gets a clear error within seconds.
    let reading = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            in_ns(&client_host(0), || {
                let c = StripedClient::connect(&addr).unwrap();
                let f = c.open("shared.dat", libc::O_RDONLY).unwrap();
                let mut buf = vec![0u8; total as usize];
                for _ in 0..100_000 {
                    match c.pread(&f, &mut buf, 0) {
                        Ok(n) => assert!(n == total as usize && buf == pattern(0, total), "a read before the kill is wrong"),
                        Err(e) => return (e, Instant::now()),
                    }
                    reading.store(true, std::sync::atomic::Ordering::Release);
                }
                panic!("100,000 reads succeeded with data server 2 killed");
            })
        });
        while !reading.load(std::sync::atomic::Ordering::Acquire) {
            assert!(!reader.is_finished(), "the reader stopped before the kill");
            std::thread::sleep(Duration::from_millis(5));
        }
        let killed = Instant::now();
        drop(servers[2].take());
        let (e, failed) = reader.join().unwrap();
        assert_eq!(e.kind, ErrorKind::DataServer, "{e}");
        assert!(e.message.contains("data server 2"), "{e}");
        assert!(failed - killed < Duration::from_secs(5), "the error took {:?}", failed - killed);
    });
    // A file on another server stays readable; opening the striped file
    // fails at once, naming the dead server.
    in_ns(&client_host(0), || {
        let c = StripedClient::connect(&addr).unwrap();
        let t = Instant::now();
        let e = c.open("shared.dat", libc::O_RDONLY).err().expect("a file with an object on a dead server opened");
        assert_eq!(e.kind, ErrorKind::DataServer);
        assert!(e.message.contains("data server 2"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5), "the error took {:?}", t.elapsed());
        let f = c.open("on0.dat", libc::O_RDONLY).unwrap();
        let mut buf = vec![0u8; 100_000];
        assert_eq!(c.pread(&f, &mut buf, 0).unwrap(), 100_000);
        assert!(buf == pattern(0, 100_000));
    });
    // Restart it: everything acknowledged reads back.
    servers[2] = Some(spawn_in(&host(2), &serve_args(dir.path(), 2), "sluice: serving"));
    in_ns(&client_host(1), || {
        let c = StripedClient::connect(&addr).unwrap();
        let f = c.open("shared.dat", libc::O_RDONLY).unwrap();
        let mut buf = vec![0u8; total as usize];
        assert_eq!(c.pread(&f, &mut buf, 0).unwrap(), total as usize);
        assert!(buf == pattern(0, total), "bytes lost across the restart of data server 2");
    });
    drop(servers);
}
