//! Hostile local users against a `sluice serve` run as root:
//! each test reproduces one finding of the security probe as the attacker
//! would, as `nobody` through `setpriv`, over Unix and TCP, through the
//! CLI, the interposer, the FUSE mount and the client library.
//!
//! Raw library calls as `nobody` run in this test binary itself, re-executed
//! under `setpriv` with `HOSTILE_HELPER` naming what to do (see `helper`).

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Mount, SLUICE};
use sluice_client::{Client, ConnectOptions, Cred};
use tempfile::TempDir;

const NOBODY: u32 = 65_534;
const HELPER_ENV: &str = "HOSTILE_HELPER";

/// A `sluice serve` run as root over a root directory holding a 0600
/// secret, a 0700 directory, a public file and a world-writable directory.
struct Victim {
    child: Option<Child>,
    dir: TempDir,
    addr: String,
}

impl Victim {
    fn start(listen_tcp: bool, extra: &[&str]) -> Victim {
        // Under /tmp, not the build tree: the checkout may lie where nobody
        // cannot go (CI's clone under /root, say). nobody must reach the
        // socket, the served root and the binaries copied here, nothing more.
        let dir = tempfile::Builder::new().prefix("sluice-hostile-").tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        // `sluice run` finds the interposer next to its executable.
        for (from, name) in [(PathBuf::from(SLUICE), "sluice"), (common::preload_library(), "libsluice_preload.so"), (std::env::current_exe().unwrap(), "hostile-helper")] {
            std::fs::copy(&from, bin.join(name)).unwrap();
            std::fs::set_permissions(bin.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        let put = |name: &str, data: &[u8], mode: u32| {
            std::fs::write(root.join(name), data).unwrap();
            std::fs::set_permissions(root.join(name), std::fs::Permissions::from_mode(mode)).unwrap();
        };
        put("secret", b"root's secret\n", 0o600);
        put("public.txt", b"for everyone\n", 0o644);
        for (d, mode) in [("private", 0o700), ("pub", 0o1777)] {
            std::fs::create_dir(root.join(d)).unwrap();
            std::fs::set_permissions(root.join(d), std::fs::Permissions::from_mode(mode)).unwrap();
        }
        let listen = if listen_tcp { "tcp:127.0.0.1:0".to_string() } else { format!("unix:{}", dir.path().join("s.sock").display()) };
        let key = dir.path().join("server.key");
        let mut cmd = Command::new(bin.join("sluice"));
        cmd.args(["serve", "--root", root.to_str().unwrap(), "--listen", &listen, "--key-file", key.to_str().unwrap()]).args(extra);
        cmd.stdout(Stdio::piped()).stderr(Stdio::null());
        // ETXTBSY: another test thread forked while this copy was open for
        // writing, and its child holds the descriptor until it execs.
        let mut tries = 0;
        let mut child = loop {
            match cmd.spawn() {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 100 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                other => break other.unwrap(),
            }
        };
        // The first line names the bound address: "... on ADDR (policy ...".
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line.split(" on ").nth(1).and_then(|r| r.split(' ').next()).unwrap_or_else(|| panic!("no address in {line:?}")).to_string();
        Victim { child: Some(child), dir, addr }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }

    /// A binary copied where nobody can run it: `sluice`, `hostile-helper`.
    fn bin(&self, name: &str) -> String {
        self.dir.path().join("bin").join(name).to_str().unwrap().to_string()
    }

    /// Run `sluice ARGS` as nobody, with `env` added.
    fn as_nobody(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        nobody(&self.bin("sluice"), args).env("SLUICE_SERVER", &self.addr).envs(env.iter().copied()).current_dir(self.dir.path()).output().unwrap()
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `setpriv` into nobody:nogroup with no supplementary groups, HOME /tmp.
fn nobody(program: &str, args: &[&str]) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]).arg(program).args(args).env("HOME", "/nonexistent").env_remove("SLUICE_KEY_FILE");
    c
}

fn text(o: &Output) -> String {
    format!("status {:?}\nstdout: {}\nstderr: {}", o.status.code(), String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Run this test binary's `helper` test as nobody, doing `what`.
fn helper_as_nobody(v: &Victim, what: &str) -> Output {
    nobody(&v.bin("hostile-helper"), &["--exact", "helper", "--nocapture", "--test-threads=1"]).env(HELPER_ENV, what).env("SLUICE_SERVER", &v.addr).output().unwrap()
}

/// Not a test of its own: the body `helper_as_nobody` runs in a child
/// process as nobody. Prints `HELPER-OK` when the action was refused as
/// expected; panics otherwise.
#[test]
fn helper() {
    let Ok(what) = std::env::var(HELPER_ENV) else { return };
    let addr = std::env::var("SLUICE_SERVER").unwrap();
    match what.as_str() {
        // A non-root Unix peer states root's identity without the key.
        "claim-root" => {
            let opts = ConnectOptions { cred: Some(Cred { uid: 0, gid: 0, groups: vec![0] }), ..ConnectOptions::default() };
            let e = Client::connect_with(&addr, opts).err().expect("a claimed identity without the key is refused");
            assert_eq!(e.errno, libc::EACCES, "{e}");
        }
        // The original exploit's first step: a setuid file, as nobody.
        "create-setuid" => {
            let c = Client::connect(&addr).unwrap();
            let fd = c.open("pub/id", libc::O_CREAT | libc::O_WRONLY | libc::O_EXCL, 0o4755).unwrap();
            c.pwrite(fd, &std::fs::read("/usr/bin/id").unwrap(), 0).unwrap();
            c.close(fd).unwrap();
            c.mkdir("pub/sgid-dir", 0o2777).unwrap();
        }
        // Write into a setuid program that nobody may write (a careless
        // mode): through the server the bits must go as they do for a
        // write of nobody's own.
        "write-setuid" => {
            let c = Client::connect(&addr).unwrap();
            let fd = c.open("pub/suid-tool", libc::O_WRONLY, 0).unwrap();
            c.pwrite(fd, b"#!/bin/sh\nid\n", 0).unwrap();
            c.close(fd).unwrap();
        }
        // Change the mode and times of root's files (SetAttr, protocol
        // 11): refused as a local chmod and touch are.
        "chattr-others" => {
            use sluice_client::{SETATTR_MODE_KEEP, SETATTR_TIME_OMIT};
            let c = Client::connect(&addr).unwrap();
            for path in ["secret", "public.txt"] {
                assert_eq!(c.set_attr(path, 0o4777, SETATTR_TIME_OMIT, SETATTR_TIME_OMIT, false).unwrap_err().errno, libc::EPERM, "chmod {path}");
                assert_eq!(c.set_attr(path, SETATTR_MODE_KEEP, 1, 1, false).unwrap_err().errno, libc::EPERM, "utimens {path}");
            }
            let fd = c.open("public.txt", libc::O_RDONLY, 0).unwrap();
            assert_eq!(c.fset_attr(fd, 0o777, SETATTR_TIME_OMIT, SETATTR_TIME_OMIT).unwrap_err().errno, libc::EPERM, "fchmod");
        }
        // Hold as many connections as the server grants, each past its
        // Hello and then silent; print how many, and wait to be killed.
        "hold-slots" => {
            let want: usize = std::env::var("HOSTILE_CONNS").unwrap().parse().unwrap();
            let mut held = Vec::new();
            for _ in 0..want {
                match raw_hello(&addr) {
                    Ok(s) => held.push(s),
                    Err(_) => continue,
                }
            }
            println!("HELD {}", held.len());
            println!("HELPER-OK");
            std::thread::sleep(Duration::from_secs(600));
        }
        // Pipeline 8 MiB reads of a large file on many connections and
        // never read an answer; wait to be killed.
        "unread-replies" => {
            let mut held = Vec::new();
            for _ in 0..24 {
                let Ok(mut s) = raw_hello(&addr) else { continue };
                let fd = raw_open(&mut s, "big.bin");
                let mut frames = Vec::new();
                for k in 0..32u64 {
                    sluice_proto::encode_request(100 + k, &sluice_proto::Request::Read { fd, offset: (k % 8) << 23, len: 8 << 20 }, &mut frames).unwrap();
                }
                s.set_nonblocking(true).unwrap();
                let _ = std::io::Write::write(&mut s, &frames);
                held.push(s);
            }
            println!("PIPELINED {}", held.len());
            println!("HELPER-OK");
            std::thread::sleep(Duration::from_secs(600));
        }
        // An impostor: bind the socket path the clients use (SLUICE_SERVER),
        // say READY, take one connection and report every byte it sends
        // until it closes (or 10 s pass).
        "impostor-unix" => {
            use std::io::{Read, Write};
            let path = addr.strip_prefix("unix:").unwrap();
            let l = std::os::unix::net::UnixListener::bind(path).unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).unwrap();
            println!("READY");
            std::io::stdout().flush().unwrap();
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let (mut got, mut buf) = (0, [0u8; 4096]);
            while let Ok(n @ 1..) = s.read(&mut buf) {
                got += n;
            }
            println!("GOT {got}");
        }
        other => panic!("unknown helper action {other}"),
    }
    println!("HELPER-OK");
}

fn assert_helper_ok(o: &Output) {
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("HELPER-OK"), "{}", text(o));
}

#[test]
fn nobody_cannot_read_a_0600_root_file_or_write_into_a_0700_directory_over_unix() {
    let v = Victim::start(false, &[]);
    let out = v.as_nobody(&["cp", ":secret", "/tmp/stolen-by-nobody"], &[]);
    assert!(!out.status.success() && text(&out).contains("Permission denied"), "{}", text(&out));
    let out = v.as_nobody(&["cp", "/etc/hostname", ":private/planted"], &[]);
    assert!(!out.status.success() && text(&out).contains("Permission denied"), "{}", text(&out));
    assert!(!v.root().join("private/planted").exists());
    // The control: what nobody may do still works.
    let copy = format!("/tmp/sluice-hostile-{}-public", std::process::id());
    let out = v.as_nobody(&["cp", ":public.txt", &copy], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read(&copy).unwrap(), b"for everyone\n");
    let _ = std::fs::remove_file(&copy);
    let _ = std::fs::remove_file("/tmp/stolen-by-nobody");
}

#[test]
fn nobody_cannot_change_the_mode_or_times_of_roots_files() {
    let v = Victim::start(false, &[]);
    assert_helper_ok(&helper_as_nobody(&v, "chattr-others"));
    for (name, mode) in [("secret", 0o600), ("public.txt", 0o644)] {
        let m = std::fs::metadata(v.root().join(name)).unwrap();
        assert_eq!(m.mode() & 0o7777, mode, "{name}");
        assert!(m.mtime() > 1, "{name}");
    }
}

#[test]
fn a_file_nobody_creates_belongs_to_nobody_and_is_never_setuid() {
    let v = Victim::start(false, &[]);
    assert_helper_ok(&helper_as_nobody(&v, "create-setuid"));
    let m = std::fs::metadata(v.root().join("pub/id")).unwrap();
    assert_eq!((m.uid(), m.gid()), (NOBODY, NOBODY), "owned by its creator, not by the server");
    assert_eq!(m.mode() & 0o7777, 0o755, "setuid dropped");
    let d = std::fs::metadata(v.root().join("pub/sgid-dir")).unwrap();
    assert_eq!((d.uid(), d.mode() & 0o7000), (NOBODY, 0), "setgid dropped on directories too");
    // The probe's last step: running it gives nobody's euid, not root's.
    let out = nobody(v.root().join("pub/id").to_str().unwrap(), &["-u"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), NOBODY.to_string(), "{}", text(&out));
}

#[test]
fn a_write_by_nobody_through_the_server_clears_setuid_and_setgid() {
    // Without write leases every write goes through the server's threads
    // (with them the client writes itself, and the kernel sees nobody).
    let v = Victim::start(false, &["--no-write-leases"]);
    let tool = v.root().join("pub/suid-tool");
    std::fs::write(&tool, b"root's tool").unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o6777)).unwrap();
    assert_helper_ok(&helper_as_nobody(&v, "write-setuid"));
    let m = std::fs::metadata(&tool).unwrap();
    assert_eq!(std::fs::read(&tool).unwrap(), b"#!/bin/sh\nid\n", "the write went through");
    assert_eq!(m.mode() & 0o7777, 0o777, "setuid and setgid cleared, as the kernel does for nobody's own write");
    // The server's data threads hold no CAP_FSETID for anyone: root's
    // write through it clears the bit too (root sets it again after).
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let c = Client::connect(&v.addr).unwrap();
    let fd = c.open("pub/suid-tool", libc::O_WRONLY, 0).unwrap();
    c.pwrite(fd, b"x", 0).unwrap();
    c.close(fd).unwrap();
    assert_eq!(std::fs::metadata(&tool).unwrap().mode() & 0o7777, 0o755);
}

#[test]
fn root_keeps_setuid_on_what_it_creates() {
    let v = Victim::start(false, &[]);
    let c = Client::connect(&v.addr).unwrap();
    let fd = c.open("pub/tool", libc::O_CREAT | libc::O_WRONLY, 0o4755).unwrap();
    c.close(fd).unwrap();
    let m = std::fs::metadata(v.root().join("pub/tool")).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o4755));
}

#[test]
fn a_unix_peer_cannot_claim_another_identity_without_the_key() {
    let v = Victim::start(false, &[]);
    assert_helper_ok(&helper_as_nobody(&v, "claim-root"));
}

#[test]
fn tcp_refuses_clients_without_the_key_and_squashes_root() {
    let v = Victim::start(true, &[]);
    assert!(v.addr.starts_with("tcp:127.0.0.1:"), "{}", v.addr);
    // nobody cannot read the server's key: refused before any request.
    let out = v.as_nobody(&["ls", ":"], &[]);
    assert!(!out.status.success() && text(&out).contains("wants its key proven"), "{}", text(&out));
    // A key of nobody's own making is the wrong key.
    let wrong = v.dir.path().join("nobody.key");
    std::fs::write(&wrong, format!("{}\n", "ab".repeat(32))).unwrap();
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&wrong, Some(NOBODY), Some(NOBODY)).unwrap();
    let out = v.as_nobody(&["ls", ":"], &[("SLUICE_KEY_FILE", wrong.to_str().unwrap())]);
    assert!(!out.status.success() && text(&out).contains("authentication failed"), "{}", text(&out));
    // With the key, root over TCP is squashed to nobody (the default).
    let opts = ConnectOptions { key_file: Some(v.key()), ..ConnectOptions::default() };
    let c = Client::connect_with(&v.addr, opts.clone()).unwrap();
    assert!(c.open("public.txt", libc::O_RDONLY, 0).is_ok());
    assert_eq!(c.open("secret", libc::O_RDONLY, 0).unwrap_err().errno, libc::EACCES, "root over TCP is squashed");
    let fd = c.open("pub/made-over-tcp", libc::O_CREAT | libc::O_WRONLY, 0o4755).unwrap();
    c.close(fd).unwrap();
    let m = std::fs::metadata(v.root().join("pub/made-over-tcp")).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (NOBODY, 0o755));
}

#[test]
fn squash_none_trusts_root_over_tcp_and_squash_all_trusts_nobody_locally() {
    let v = Victim::start(true, &["--squash", "none"]);
    let c = Client::connect_with(&v.addr, ConnectOptions { key_file: Some(v.key()), ..ConnectOptions::default() }).unwrap();
    assert!(c.open("secret", libc::O_RDONLY, 0).is_ok(), "--squash none: root stays root");
    let v = Victim::start(false, &["--squash", "all"]);
    let c = Client::connect(&v.addr).unwrap();
    assert_eq!(c.open("secret", libc::O_RDONLY, 0).unwrap_err().errno, libc::EACCES, "--squash all: local root is nobody too");
}

#[test]
fn allow_other_mount_checks_each_caller_as_themselves() {
    let v = Victim::start(false, &[]);
    let point = v.dir.path().join("mnt");
    std::fs::create_dir(&point).unwrap();
    let mut m = Mount { point: point.clone(), child: None };
    m.child = Some(Command::new(v.bin("sluice")).args(["mount", "--allow-other", "--server", &v.addr]).arg(&point).stderr(Stdio::null()).spawn().unwrap());
    common::wait_for(|| common::is_mounted(&point), "the mount");
    let cat = |name: &str| nobody("cat", &[point.join(name).to_str().unwrap()]).output().unwrap();
    let out = cat("secret");
    assert!(!out.status.success() && text(&out).contains("Permission denied"), "{}", text(&out));
    let out = cat("public.txt");
    assert!(out.status.success() && out.stdout == b"for everyone\n", "{}", text(&out));
    let out = nobody("sh", &["-c", &format!("echo mine > {}", point.join("pub/by-nobody").display())]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::metadata(v.root().join("pub/by-nobody")).unwrap().uid(), NOBODY, "the mount forwards the caller's identity");
    // Root through the mount is still root (a local, kernel-vouched caller).
    assert_eq!(std::fs::read(point.join("secret")).unwrap(), b"root's secret\n");
}

#[test]
fn the_interposer_runs_as_its_process() {
    let v = Victim::start(false, &[]);
    let out = v.as_nobody(&["run", "--prefix", "/sluice", "--", "cat", "/sluice/secret"], &[]);
    assert!(!out.status.success() && text(&out).contains("Permission denied"), "{}", text(&out));
    let out = v.as_nobody(&["run", "--prefix", "/sluice", "--", "cat", "/sluice/public.txt"], &[]);
    assert!(out.status.success() && out.stdout == b"for everyone\n", "{}", text(&out));
}

/// A root program under `sluice run` that drops to nobody with raw
/// `setgroups`, `setresgid` and `setresuid` system calls (as Go programs
/// and static helpers do, past libc's wrappers) is served as nobody from
/// then on: it read root's 0600 file and created files owned by root.
/// A file it opened as root stays readable, as a kernel fd does.
#[test]
fn a_privilege_drop_by_raw_system_calls_is_followed() {
    let v = Victim::start(false, &[]);
    let py = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
held = open("/sluice/secret", "rb")
assert open("/sluice/public.txt").read() == "for everyone\n"
for nr, args in ((116, (0, None)), (119, (65534, 65534, 65534)), (117, (65534, 65534, 65534))):
    assert libc.syscall(nr, *args) == 0, ctypes.get_errno()
try:
    open("/sluice/secret", "rb").read(); print("READ-AS-ROOT")
except PermissionError:
    print("REFUSED")
with open("/sluice/pub/after-drop", "w") as f:
    f.write("x")
print(held.read().decode().strip())
"#;
    let out = Command::new(v.bin("sluice")).args(["run", "--prefix", "/sluice", "--", "python3", "-c", py]).env("SLUICE_SERVER", &v.addr).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "REFUSED\nroot's secret\n", "{}", text(&out));
    assert_eq!(std::fs::metadata(v.root().join("pub/after-drop")).unwrap().uid(), NOBODY, "created as nobody");
}

/// The served socket is connectable by everyone (mode 0666, whatever the
/// umask): identity, not the socket's mode, is the guard now.
#[test]
fn the_socket_is_0666_and_the_key_file_0600() {
    let v = Victim::start(false, &[]);
    let sock = v.addr.strip_prefix("unix:").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !Path::new(sock).exists() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(std::fs::metadata(sock).unwrap().mode() & 0o777, 0o666);
    assert_eq!(std::fs::metadata(v.key()).unwrap().mode() & 0o777, 0o600, "--key-file is created 0600");
}

/// The cluster's metadata role on TCP: no namespace request is answered
/// before the shared key is proven (the data server's model, on the MDS too).
#[test]
fn a_tcp_metadata_role_refuses_clients_without_the_key() {
    let v = Victim::start(false, &[]);
    std::fs::create_dir(v.root().join("objects")).unwrap();
    let (db, key) = (v.dir.path().join("meta.redb"), v.key());
    let args = ["meta", "--db", db.to_str().unwrap(), "--listen", "tcp:127.0.0.1:0", "--data", &v.addr, "--key-file", key.to_str().unwrap()];
    let mut meta = Command::new(v.bin("sluice")).args(args).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(meta.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.split(" on ").nth(1).unwrap().trim().to_string();
    let ls = |env: &[(&str, &str)]| nobody(&v.bin("sluice"), &["ls", ":"]).env("SLUICE_SERVER", &addr).envs(env.iter().copied()).output().unwrap();
    let out = ls(&[]);
    assert!(!out.status.success() && text(&out).contains("wants its key proven"), "{}", text(&out));
    let wrong = v.dir.path().join("nobody-meta.key");
    std::fs::write(&wrong, format!("{}\n", "cd".repeat(32))).unwrap();
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&wrong, Some(NOBODY), Some(NOBODY)).unwrap();
    let out = ls(&[("SLUICE_KEY_FILE", wrong.to_str().unwrap())]);
    assert!(!out.status.success() && text(&out).contains("authentication failed"), "{}", text(&out));
    // The key's owner (root) is served.
    let out = Command::new(v.bin("sluice")).args(["setstripe", "-S", "64K", "-c", "1", "striped"]).env("SLUICE_SERVER", &addr).env("SLUICE_KEY_FILE", v.key()).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let _ = meta.kill();
    let _ = meta.wait();
}

/// A raw Unix connection past its `Hello`, as a client that will say
/// nothing more would hold it.
fn raw_hello(addr: &str) -> std::io::Result<std::os::unix::net::UnixStream> {
    let path = addr.strip_prefix("unix:").expect("a Unix server");
    let mut s = std::os::unix::net::UnixStream::connect(path)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let hello = sluice_proto::Hello { version: sluice_proto::VERSION, app: "hog", weight: 1, client_id: std::process::id(), cred: None };
    let mut frame = Vec::new();
    sluice_proto::encode_request(1, &sluice_proto::Request::Hello(hello), &mut frame).unwrap();
    std::io::Write::write_all(&mut s, &frame)?;
    match raw_reply(&mut s)? {
        (sluice_proto::Opcode::HelloOk, _) => Ok(s),
        (op, body) => Err(std::io::Error::other(format!("{op:?}: {}", String::from_utf8_lossy(&body)))),
    }
}

/// One reply frame: its opcode and body.
fn raw_reply(s: &mut std::os::unix::net::UnixStream) -> std::io::Result<(sluice_proto::Opcode, Vec<u8>)> {
    let mut head = [0u8; sluice_proto::HEADER_BYTES];
    std::io::Read::read_exact(s, &mut head)?;
    let h = sluice_proto::check_header(&head, sluice_proto::FRAME_BYTES_MAX).map_err(std::io::Error::other)?.expect("a whole header");
    let mut body = vec![0u8; h.body_len as usize];
    std::io::Read::read_exact(s, &mut body)?;
    Ok((h.opcode, body))
}

/// `open(path, O_RDONLY)` on a raw connection: the server's handle.
fn raw_open(s: &mut std::os::unix::net::UnixStream, path: &str) -> u64 {
    let mut frame = Vec::new();
    sluice_proto::encode_request(2, &sluice_proto::Request::Open { path, flags: libc::O_RDONLY, mode: 0 }, &mut frame).unwrap();
    std::io::Write::write_all(s, &frame).unwrap();
    let (op, body) = raw_reply(s).unwrap();
    assert_eq!(op, sluice_proto::Opcode::Fd, "{}", String::from_utf8_lossy(&body));
    u64::from_le_bytes(body[..8].try_into().unwrap())
}

/// Start `hostile-helper` doing `what` as `uid` in the background; wait
/// for its `HELPER-OK` and return it (reaped when dropped, on a failed
/// assertion too) with the line before.
fn helper_running_as(v: &Victim, uid: u32, what: &str, env: &[(&str, &str)]) -> (Reaped, String) {
    let mut c = Command::new("setpriv");
    c.args([format!("--reuid={uid}"), format!("--regid={uid}"), "--clear-groups".into(), "--".into()]);
    c.arg(v.bin("hostile-helper")).args(["--exact", "helper", "--nocapture", "--test-threads=1"]);
    c.env(HELPER_ENV, what).env("SLUICE_SERVER", &v.addr).envs(env.iter().copied()).stdout(Stdio::piped()).stderr(Stdio::null());
    let mut child = Reaped(c.spawn().unwrap());
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let (mut line, mut last) = (String::new(), String::new());
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the helper ended before HELPER-OK; last line {last:?}");
        if line.trim() == "HELPER-OK" {
            return (child, last);
        }
        // libtest writes "test helper ... " before the first line.
        last = line.trim().rsplit("... ").next().unwrap_or_default().to_string();
    }
}

/// `sluice ls` of the root as `uid` (root: none): it succeeds, and how
/// long it took, the program's start included.
fn ls_as(v: &Victim, uid: Option<u32>) -> Duration {
    let since = Instant::now();
    let out = match uid {
        None => Command::new(v.bin("sluice")).args(["ls", ":"]).env("SLUICE_SERVER", &v.addr).output().unwrap(),
        Some(u) => Command::new("setpriv")
            .args([format!("--reuid={u}"), format!("--regid={u}"), "--clear-groups".into(), "--".into(), v.bin("sluice"), "ls".into(), ":".into()])
            .env("SLUICE_SERVER", &v.addr)
            .output()
            .unwrap(),
    };
    let took = since.elapsed();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("public.txt"), "ls as {uid:?}: {}", text(&out));
    took
}

/// A third user, besides root and the attacker nobody.
const THIRD: u32 = 65_533;

/// A child process killed and reaped however the test ends.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One user holding every slot it can, each silent after its Hello (the
/// table was 1,024 connections, and everyone, root included, was refused
/// EBUSY): root and a third user still list the root. Timed loosely
/// (the figure is printed; a loaded CI machine starts programs slowly).
#[test]
fn a_user_holding_every_slot_it_can_leaves_root_and_others_served() {
    let v = Victim::start(false, &[]);
    let (_hog, held) = helper_running_as(&v, NOBODY, "hold-slots", &[("HOSTILE_CONNS", "1100")]);
    let held: usize = held.strip_prefix("HELD ").unwrap().parse().unwrap();
    assert_eq!(held, 512, "conns_per_uid_max connections, not one more");
    let (root, third) = (ls_as(&v, None), ls_as(&v, Some(THIRD)));
    eprintln!("with nobody holding {held} connections: root's ls {root:?}, a third user's {third:?}");
    assert!(root < Duration::from_secs(2) && third < Duration::from_secs(2), "root {root:?}, third {third:?}");
}

/// The reserved slots at N and N+1: with 8 slots, 2 kept, a user holds 6
/// and the 7th is refused though its per-user limit allows 7; a third
/// user then finds the table full for users and takes the idle slot of
/// the user holding the most; root takes one of its own.
#[test]
fn a_full_table_keeps_root_s_slots_and_makes_room_for_another_user() {
    let v = Victim::start(false, &["--clients-max", "8", "--clients-reserved", "2", "--conns-per-uid-max", "7"]);
    let (_hog, held) = helper_running_as(&v, NOBODY, "hold-slots", &[("HOSTILE_CONNS", "7")]);
    assert_eq!(held, "HELD 6", "clients_max - clients_reserved for a user; the 7th refused");
    ls_as(&v, Some(THIRD));
    ls_as(&v, None);
}

/// Server RSS (`VmRSS`), in bytes.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap().trim().trim_end_matches(" kB").trim().parse().unwrap();
    kb << 10
}

/// 24 connections pipelining 8 MiB reads whose answers are never read
/// (the server grew from 112 MiB to 2,960 MiB): its RSS stays under the
/// 1 GiB budget, and root still lists the root meanwhile.
#[test]
fn replies_nobody_reads_stay_within_the_server_s_budget() {
    let v = Victim::start(false, &[]);
    let big = v.root().join("big.bin");
    std::fs::write(&big, vec![7u8; 64 << 20]).unwrap();
    std::fs::set_permissions(&big, std::fs::Permissions::from_mode(0o644)).unwrap();
    let pid = v.child.as_ref().unwrap().id();
    let (_hog, n) = helper_running_as(&v, NOBODY, "unread-replies", &[]);
    assert_eq!(n, "PIPELINED 24");
    let mut peak = 0;
    let since = Instant::now();
    while since.elapsed() < Duration::from_secs(4) {
        peak = peak.max(rss_bytes(pid));
        std::thread::sleep(Duration::from_millis(50));
    }
    let ls = ls_as(&v, None);
    eprintln!("server RSS peak {} MiB with 24 connections not reading; root's ls {ls:?}", peak >> 20);
    assert!(peak < 1 << 30, "server RSS {} MiB", peak >> 20);
}

/// Start `cmd` (a server) and read its first line: where it listens, or
/// "" when it exited without one. Its stdout, the rest unread, comes back
/// too: kept open while the caller holds it.
fn first_line(mut cmd: Command) -> (String, Reaped, BufReader<std::process::ChildStdout>) {
    let mut child = Reaped(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap());
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let mut line = String::new();
    let _ = out.read_line(&mut line);
    (line, child, out)
}

fn stderr_of(mut r: Reaped) -> String {
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(&mut r.0.stderr.take().unwrap(), &mut err);
    err
}

/// A key file nobody owns, 0600, where root will look for one: nobody
/// wrote it and so knows it.
fn planted_key(v: &Victim) -> PathBuf {
    let planted = v.dir.path().join("planted.key");
    std::fs::write(&planted, format!("{}\n", "5a".repeat(32))).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&planted, Some(NOBODY), Some(NOBODY)).unwrap();
    planted
}

/// A key file another user owns is refused by root's server, metadata
/// role and client alike (as sshd refuses such host keys): the planter
/// could authenticate as anyone.
#[test]
fn a_key_file_another_user_owns_is_refused_by_server_meta_and_client() {
    let v = Victim::start(true, &[]);
    let planted = planted_key(&v);
    let p = planted.to_str().unwrap();
    let root = v.root();
    let db = v.dir.path().join("meta.redb");
    let serve = ["serve", "--root", root.to_str().unwrap(), "--listen", "tcp:127.0.0.1:0", "--key-file", p];
    let meta = ["meta", "--db", db.to_str().unwrap(), "--listen", "tcp:127.0.0.1:0", "--data", &v.addr, "--key-file", p];
    for args in [&serve[..], &meta[..]] {
        let mut cmd = Command::new(v.bin("sluice"));
        cmd.args(args);
        let (line, child, _out) = first_line(cmd);
        assert!(line.is_empty(), "{}: started with a key nobody planted: {line}", args[0]);
        let err = stderr_of(child);
        assert!(err.contains(p) && err.contains("owned by uid 65534") && err.contains("expected root"), "{}: {err}", args[0]);
    }
    // Root's client will not prove (and so trust) such a key either.
    let out = Command::new(v.bin("sluice")).args(["ls", ":"]).env("SLUICE_SERVER", &v.addr).env("SLUICE_KEY_FILE", p).output().unwrap();
    assert!(!out.status.success() && text(&out).contains("owned by uid 65534"), "{}", text(&out));
}

/// A world-writable sticky directory, as /tmp, holding the socket path.
fn sticky_dir(v: &Victim) -> PathBuf {
    let tmp = v.dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
    tmp
}

/// nobody binds the socket path clients use: root's client checks the
/// listener's uid and sends it nothing but the connect.
#[test]
fn a_client_sends_nothing_to_a_unix_server_of_another_user() {
    let v = Victim::start(false, &[]);
    let addr = format!("unix:{}", sticky_dir(&v).join("s.sock").display());
    let mut cmd = nobody(&v.bin("hostile-helper"), &["--exact", "helper", "--nocapture", "--test-threads=1"]);
    cmd.env(HELPER_ENV, "impostor-unix").env("SLUICE_SERVER", &addr);
    let (mut ready, _imp, mut out) = first_line(cmd);
    // The test harness's own lines come first.
    while !ready.contains("READY") && out.read_line(&mut ready).unwrap_or(0) > 0 {}
    assert!(ready.contains("READY"), "the impostor did not start: {ready:?}");
    let opts = ConnectOptions { recovery: sluice_client::Recovery::Off, timeout: Duration::from_secs(30), ..ConnectOptions::default() };
    let e = Client::connect_with(&addr, opts).err().expect("root connected to nobody's server");
    assert_eq!(e.errno, libc::EACCES, "{e}");
    assert!(e.message.contains("uid 65534") && e.message.contains("--server-uid"), "{e}");
    // The impostor reports once root's client closed its connection.
    let mut got = String::new();
    let _ = std::io::Read::read_to_string(&mut out, &mut got);
    assert!(got.contains("GOT 0"), "the impostor received bytes from root's client: {got:?}");
}

/// nobody serves its own directory on the path root's programs use (the
/// real server stopped): root's `sluice ls` and `sluice run` refuse it,
/// unless told to trust uid 65534; nobody's own client trusts it.
#[test]
fn root_refuses_an_impostor_server_on_the_socket_path_unless_told_its_uid() {
    let v = Victim::start(false, &[]);
    let imp_root = v.dir.path().join("imp-root");
    std::fs::create_dir(&imp_root).unwrap();
    std::fs::write(imp_root.join("planted"), b"the impostor's content\n").unwrap();
    for p in [imp_root.clone(), imp_root.join("planted")] {
        std::os::unix::fs::chown(&p, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let listen = format!("unix:{}", sticky_dir(&v).join("s.sock").display());
    let (line, _imp, _out) = first_line(nobody(&v.bin("sluice"), &["serve", "--root", imp_root.to_str().unwrap(), "--listen", &listen]));
    assert!(line.contains(" on unix:"), "nobody's server did not start: {line:?}");
    let as_root = |args: &[&str]| Command::new(v.bin("sluice")).args(args).env("SLUICE_SERVER", &listen).env_remove("SLUICE_SERVER_UID").output().unwrap();
    let out = as_root(&["ls", ":"]);
    assert!(!out.status.success() && text(&out).contains("runs as uid 65534"), "{}", text(&out));
    assert!(!text(&out).contains("planted"), "{}", text(&out));
    let out = as_root(&["run", "--prefix", "/sluice", "--", "cat", "/sluice/planted"]);
    assert!(!out.status.success() && !text(&out).contains("impostor's content"), "{}", text(&out));
    // Told whom to trust, root's client goes on (and the server serves it).
    let out = as_root(&["ls", "--server-uid", "65534", ":"]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("planted"), "{}", text(&out));
    let out = as_root(&["run", "--server-uid", "65534", "--prefix", "/sluice", "--", "cat", "/sluice/planted"]);
    assert!(out.status.success() && out.stdout == b"the impostor's content\n", "{}", text(&out));
    // A user's own server is trusted by that user's client by default.
    let out = nobody(&v.bin("sluice"), &["ls", ":"]).env("SLUICE_SERVER", &listen).output().unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("planted"), "{}", text(&out));
}

/// How a fake TCP server answers the handshake.
#[derive(Clone, Copy, Debug)]
enum Fake {
    /// `HelloOk` to the `Hello`, no challenge.
    NoChallenge,
    /// A challenge, then `HelloOk` without the server's proof.
    NoProof,
    /// A challenge, then `HelloOk` with a proof made without the key.
    WrongProof,
}

/// One frame off `s`: its request id, or `None` at the end.
fn frame(s: &mut std::net::TcpStream) -> Option<u64> {
    use std::io::Read;
    let mut head = [0u8; sluice_proto::HEADER_BYTES];
    s.read_exact(&mut head).ok()?;
    let len = u32::from_le_bytes(head[..4].try_into().unwrap()) as usize;
    let mut body = vec![0u8; len.min(1 << 20)];
    s.read_exact(&mut body).ok()?;
    Some(u64::from_le_bytes(head[8..16].try_into().unwrap()))
}

/// A TCP listener that took the server's address without its key:
/// answers one client's handshake as `how` says, then counts the frames
/// the client sends it after its `HelloOk`.
fn fake_tcp_server(how: Fake) -> (String, std::thread::JoinHandle<usize>) {
    use sluice_proto::{encode_response, HelloOk, Response, AUTH_BYTES, VERSION};
    use std::io::Write;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("tcp:{}", l.local_addr().unwrap());
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let send = |s: &mut std::net::TcpStream, id: u64, r: &Response<'_>| {
            let mut out = Vec::new();
            encode_response(id, r, &mut out);
            s.write_all(&out).unwrap();
        };
        let ok = |proof| Response::HelloOk(HelloOk { version: VERSION, frame_bytes_max: 1 << 20, io_bytes_max: 1 << 20, inflight_per_connection_max: 8, proof });
        let id = frame(&mut s).expect("a Hello");
        match how {
            Fake::NoChallenge => send(&mut s, id, &ok(None)),
            Fake::NoProof | Fake::WrongProof => {
                send(&mut s, id, &Response::Challenge { nonce: [3; AUTH_BYTES] });
                let id = frame(&mut s).expect("an Auth");
                send(&mut s, id, &ok(matches!(how, Fake::WrongProof).then_some([9; AUTH_BYTES])));
            }
        }
        std::iter::from_fn(|| frame(&mut s)).count()
    });
    (addr, t)
}

/// Over TCP the client believes no server that did not prove the key:
/// one that skips the challenge, answers without a proof, or with a wrong
/// one, is refused, and is sent no request.
#[test]
fn a_tcp_client_refuses_a_server_that_does_not_prove_the_key() {
    let v = Victim::start(true, &[]);
    for how in [Fake::NoChallenge, Fake::NoProof, Fake::WrongProof] {
        let (addr, fake) = fake_tcp_server(how);
        let opts = ConnectOptions { key_file: Some(v.key()), recovery: sluice_client::Recovery::Off, ..ConnectOptions::default() };
        let r = Client::connect_with(&addr, opts).and_then(|c| c.stat("secret").map(|_| ()));
        let e = r.err().unwrap_or_else(|| panic!("{how:?}: the client trusted a server without the key"));
        assert_eq!(e.errno, libc::EACCES, "{how:?}: {e}");
        assert!(e.message.contains("not trusted"), "{how:?}: {e}");
        assert_eq!(fake.join().unwrap(), 0, "{how:?}: requests reached the impostor");
    }
    // The real server proves the key: the same client is served.
    let c = Client::connect_with(&v.addr, ConnectOptions { key_file: Some(v.key()), ..ConnectOptions::default() }).unwrap();
    assert!(c.stat("public.txt").is_ok());
}

/// Slow clients of the metrics endpoint (each sends part of a request and
/// waits) do not keep a scrape out, nor the data path.
#[test]
fn slow_metrics_clients_do_not_stall_a_scrape() {
    let s = common::MetricsServe::start();
    // Twice the endpoint's bound, and more than the 130 that stalled it
    // when it served one client at a time for up to 2 s each.
    let slow: Vec<std::net::TcpStream> = (0..2 * sluice_server::metrics::CONNS_MAX + 72)
        .map(|_| {
            let mut c = std::net::TcpStream::connect(&s.metrics).unwrap();
            std::io::Write::write_all(&mut c, b"GET /metrics HTTP/1.1\r\n").unwrap();
            c
        })
        .collect();
    // 10 s: thousands of times what a scrape takes; the slow clients held
    // the old endpoint 2 s each, 400 s in all.
    let page = sluice_server::metrics::get(&s.metrics, "/metrics", Duration::from_secs(10));
    assert!(page.is_ok_and(|p| p.contains("sluice_uptime_seconds")), "a scrape behind {} slow clients", slow.len());
    let (ok, _, err) = s.sluice(&["ls", ":"]);
    assert!(ok, "{err}");
}

/// Service classes are the operator's: nobody may not list or change
/// them, root on the server's host may.
#[test]
fn only_root_changes_the_service_classes() {
    let v = Victim::start(false, &[]);
    let out = v.as_nobody(&["qos", "list"], &[]);
    assert!(!out.status.success() && text(&out).contains("only root or the server's user"), "{}", text(&out));
    let rules = v.dir.path().join("qos.toml");
    std::fs::write(&rules, "[[class]]\nname = \"slow\"\nrate_bytes_per_s = 1000000\n[[rule]]\nclass = \"slow\"\nuid = 65534\n").unwrap();
    std::fs::set_permissions(&rules, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = v.as_nobody(&["qos", "set", rules.to_str().unwrap()], &[]);
    assert!(!out.status.success(), "{}", text(&out));
    let root = |args: &[&str]| Command::new(v.bin("sluice")).args(args).env("SLUICE_SERVER", &v.addr).output().unwrap();
    let out = root(&["qos", "set", rules.to_str().unwrap()]);
    assert!(out.status.success() && text(&out).contains("1 classes, 1 rules"), "{}", text(&out));
    let out = root(&["qos", "list"]);
    assert!(out.status.success() && text(&out).contains("rate_bytes_per_s = 1000000") && text(&out).contains("uid = 65534"), "{}", text(&out));
}
