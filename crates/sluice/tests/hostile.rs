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
/// for its `HELPER-OK` and return it with the line before.
fn helper_running_as(v: &Victim, uid: u32, what: &str, env: &[(&str, &str)]) -> (Child, String) {
    let mut c = Command::new("setpriv");
    c.args([format!("--reuid={uid}"), format!("--regid={uid}"), "--clear-groups".into(), "--".into()]);
    c.arg(v.bin("hostile-helper")).args(["--exact", "helper", "--nocapture", "--test-threads=1"]);
    c.env(HELPER_ENV, what).env("SLUICE_SERVER", &v.addr).envs(env.iter().copied()).stdout(Stdio::piped()).stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
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

/// Kills a background helper even when the test fails.
struct Killed(Child);

impl Drop for Killed {
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
    let (hog, held) = helper_running_as(&v, NOBODY, "hold-slots", &[("HOSTILE_CONNS", "1100")]);
    let _hog = Killed(hog);
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
    let (hog, held) = helper_running_as(&v, NOBODY, "hold-slots", &[("HOSTILE_CONNS", "7")]);
    let _hog = Killed(hog);
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
    let (hog, n) = helper_running_as(&v, NOBODY, "unread-replies", &[]);
    let _hog = Killed(hog);
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
