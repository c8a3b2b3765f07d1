//! The FUSE path with real programs: a real `sluice serve`, a real
//! `sluice mount`, and `cp`, `cat`, `dd`, `tar`, `ls` and Python working
//! through the mount point, each result compared with the backing
//! directory. Mounts are undone and processes killed even when a test
//! fails.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{is_mounted, ok, same, sh, wait_for, Mount, SLUICE};

/// A served directory, a mount of it, and their processes.
struct Mounted {
    dir: PathBuf,
    server: Child,
    mount: Option<Mount>,
}

impl Mounted {
    fn root(&self) -> PathBuf {
        self.dir.join("root")
    }

    fn mnt(&self) -> PathBuf {
        self.dir.join("mnt")
    }

    fn start(name: &str) -> Mounted {
        Mounted::start_with(name, &[])
    }

    /// Serve a fresh root and mount it with `mount_args` added.
    fn start_with(name: &str, mount_args: &[&str]) -> Mounted {
        let dir = std::env::temp_dir().join(format!("sluice-fuse-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("root")).unwrap();
        let server = spawn_server(&dir);
        let mut m = Mounted { dir, server, mount: None };
        let (sock, point) = (m.sock(), m.mnt());
        std::fs::create_dir_all(&point).unwrap();
        let child = Command::new(SLUICE).args(["mount", "--server", &sock]).args(mount_args).arg(&point).stderr(Stdio::null()).spawn().unwrap();
        m.mount = Some(Mount { point: point.clone(), child: Some(child) });
        wait_for(|| is_mounted(&point), "the mount");
        m
    }

    fn sock(&self) -> String {
        format!("unix:{}", self.dir.join("s.sock").display())
    }

    fn spawn_server(&self) -> Child {
        spawn_server(&self.dir)
    }
}

/// Start `sluice serve` on `dir/root` at `dir/s.sock`; wait for the socket.
fn spawn_server(dir: &std::path::Path) -> Child {
    let _ = std::fs::remove_file(dir.join("s.sock"));
    let sock = format!("unix:{}", dir.join("s.sock").display());
    let server = Command::new(SLUICE).args(["serve", "--root"]).arg(dir.join("root")).args(["--listen", &sock]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    // The socket file appears at bind(2), before listen(2): wait until a
    // connection is accepted, or a mount started in between finds the
    // server refusing (and gives up).
    wait_for(|| std::os::unix::net::UnixStream::connect(dir.join("s.sock")).is_ok(), "the server to accept");
    server
}

impl Drop for Mounted {
    fn drop(&mut self) {
        drop(self.mount.take());
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn coreutils_python_and_tar_through_the_mount() {
    let m = Mounted::start("progs");
    let (root, mnt, d) = (m.root(), m.mnt(), m.dir.clone());
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(d.join("src.bin"), &data).unwrap();
    ok(&format!("cp {0}/src.bin {1}/a.bin", d.display(), mnt.display()));
    same(&d.join("src.bin"), &root.join("a.bin"));
    ok(&format!("cat {0}/a.bin > {1}/back.bin", mnt.display(), d.display()));
    same(&d.join("src.bin"), &d.join("back.bin"));
    ok(&format!("dd if={0}/src.bin of={1}/small.bin bs=512 status=none", d.display(), mnt.display()));
    same(&d.join("src.bin"), &root.join("small.bin"));
    ok(&format!("dd if={0}/src.bin of={1}/direct.bin bs=64k oflag=direct status=none", d.display(), mnt.display()));
    same(&d.join("src.bin"), &root.join("direct.bin"));
    ok(&format!("mkdir -p {0}/tree/a/b && echo one > {0}/tree/a/f1 && echo two > {0}/tree/a/b/f2", d.display()));
    ok(&format!("tar -C {0}/tree -cf {1}/t.tar a && mkdir {1}/x && tar -C {1}/x -xf {1}/t.tar", d.display(), mnt.display()));
    ok(&format!("diff -r {0}/tree/a {1}/x/a", d.display(), root.display()));
    let ls = sh(&format!("ls {}", mnt.display()));
    assert_eq!(String::from_utf8_lossy(&ls.stdout).split_whitespace().collect::<Vec<_>>(), ["a.bin", "direct.bin", "small.bin", "t.tar", "x"]);
    let py = format!("f = open('{0}/p.txt', 'w+b'); f.write(b'hello world'); f.seek(6); assert f.read() == b'world'; f.seek(0); f.write(b'HELLO'); f.close()", mnt.display());
    ok(&format!("python3 -c \"{py}\""));
    assert_eq!(std::fs::read(root.join("p.txt")).unwrap(), b"HELLO world");
    ok(&format!("mv {0}/p.txt {0}/q.txt && rm {0}/q.txt && rm -r {0}/x", mnt.display()));
    assert!(!root.join("q.txt").exists() && !root.join("x").exists());
}

/// A symbolic link is a link through the mount: `lstat` says so, the
/// kernel follows it with `readlink`, and removing a tree removes the
/// link, not what it names. Before, the mount showed the target:
/// `shutil.rmtree` of a link to a directory emptied the directory.
#[test]
fn symbolic_links_are_links_through_the_mount() {
    let m = Mounted::start("links");
    let (root, mnt) = (m.root(), m.mnt());
    std::fs::create_dir_all(root.join("real")).unwrap();
    std::fs::write(root.join("real/keep"), b"kept").unwrap();
    std::fs::create_dir_all(root.join("d")).unwrap();
    std::os::unix::fs::symlink("../real", root.join("d/link")).unwrap();
    let py = format!(
        "import os, shutil; m = '{0}'; assert os.path.islink(m + '/d/link'); assert os.readlink(m + '/d/link') == '../real'; \
         assert open(m + '/d/link/keep').read() == 'kept'; \
         raised = False\ntry: shutil.rmtree(m + '/d/link')\nexcept OSError: raised = True\nassert raised, 'rmtree of a link refuses'\n\
shutil.rmtree(m + '/d'); assert not os.path.exists(m + '/d')",
        mnt.display()
    );
    ok(&format!("python3 -c \"{py}\""));
    assert_eq!(std::fs::read(root.join("real/keep")).unwrap(), b"kept", "what the link named is untouched");
    assert!(!root.join("d").exists());
}

/// `chmod`, `touch -d`, `cp -p`, `install -m` and `sed -i` through the
/// mount keep modes and times as on a local directory (the mount
/// accepted and ignored them: `sed -i` left a 755 script 0600).
#[test]
fn modes_and_times_through_the_mount() {
    let m = Mounted::start("chattr");
    let local = m.dir.join("local");
    std::fs::create_dir(&local).unwrap();
    let script = "d=$1; printf '#!/bin/sh\\necho hi\\n' > $d/s.sh; chmod 755 $d/s.sh; sed -i s/hi/ho/ $d/s.sh; $d/s.sh; stat -c %a $d/s.sh; \
                  install -m 750 $d/s.sh $d/i.sh; stat -c %a $d/i.sh; touch -d '2020-01-02 03:04:05' $d/s.sh; cp -p $d/s.sh $d/c.sh; stat -c '%a %Y' $d/c.sh";
    let run = |d: &std::path::Path| Command::new("bash").args(["-c", script, "bash"]).arg(d).output().unwrap();
    let (plain, via) = (run(&local), run(&m.mnt()));
    assert_eq!(String::from_utf8_lossy(&plain.stdout), "ho\n755\n750\n755 1577934245\n", "{}", String::from_utf8_lossy(&plain.stderr));
    assert_eq!(String::from_utf8_lossy(&via.stdout), String::from_utf8_lossy(&plain.stdout), "{}", String::from_utf8_lossy(&via.stderr));
    assert_eq!(std::fs::metadata(m.root().join("c.sh")).unwrap().permissions().mode() & 0o7777, 0o755);
}

/// `statvfs` and `fstatvfs` through the mount give the served file
/// system's figures (the mount answered zeros, and `df` hid it).
#[test]
fn statfs_through_the_mount_gives_the_served_file_systems_figures() {
    let m = Mounted::start("statfs");
    let (root, mnt) = (m.root(), m.mnt());
    std::fs::write(root.join("a"), b"x").unwrap();
    let py =
        "import os, sys\nfor s in (os.statvfs(sys.argv[1]), os.fstatvfs(os.open(sys.argv[2], os.O_RDONLY))):\n    print(s.f_frsize, s.f_blocks, s.f_bfree, s.f_files, s.f_namemax)";
    let run = |d: &std::path::Path| {
        let out = Command::new("python3").args(["-c", py]).arg(d).arg(d.join("a")).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    common::same_statfs(&run(&mnt), &run(&root));
}

/// `ln -s` through the mount makes a link on the server, its target as
/// given (the mount answered ENOSYS before).
#[test]
fn ln_s_through_the_mount() {
    let m = Mounted::start("ln-s");
    let (root, mnt) = (m.root(), m.mnt());
    std::fs::create_dir(root.join("d")).unwrap();
    std::fs::write(root.join("a"), b"data").unwrap();
    std::os::unix::fs::symlink("a", mnt.join("l")).unwrap();
    std::os::unix::fs::symlink("../a", mnt.join("d/l")).unwrap();
    assert_eq!(std::fs::read(mnt.join("d/l")).unwrap(), b"data");
    assert!(std::fs::symlink_metadata(mnt.join("l")).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read_link(root.join("l")).unwrap().to_str(), Some("a"));
    assert_eq!(std::os::unix::fs::symlink("a", mnt.join("l")).unwrap_err().raw_os_error(), Some(libc::EEXIST));
}

/// A program that removes entries as it reads its directory sees each
/// once: each open directory reads one listing. Before, every `readdir`
/// listed anew and resumed by index, and such a loop over 1,000 files
/// left 183 behind.
#[test]
fn unlinking_while_reading_a_directory_sees_every_entry_once() {
    let m = Mounted::start("readdir");
    std::fs::create_dir(m.root().join("many")).unwrap();
    for i in 0..3000 {
        std::fs::write(m.root().join("many").join(format!("file-{i:05}")), b"").unwrap();
    }
    let py = format!("import os; n = 0\nfor e in os.scandir('{0}/many'):\n    os.unlink(e.path); n += 1\nprint(n)", m.mnt().display());
    let out = sh(&format!("python3 -c \"{py}\""));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "3000", "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_dir(m.root().join("many")).unwrap().count(), 0);
}

/// `fstat` of a file unlinked while open: the kernel asks without a
/// handle, and the path is gone (`tempfile.TemporaryFile`, then
/// `os.fstat`, failed with ENOENT).
#[test]
fn fstat_of_an_open_unlinked_file_through_the_mount() {
    let m = Mounted::start("unlinked");
    let py = format!(
        "import os, tempfile; f = tempfile.TemporaryFile(dir='{0}'); f.write(b'abc'); f.flush(); assert os.fstat(f.fileno()).st_size == 3; \
         fd = os.open('{0}/gone', os.O_CREAT | os.O_RDWR); os.write(fd, b'12345'); os.unlink('{0}/gone'); \
         assert os.fstat(fd).st_size == 5; os.lseek(fd, 0, 0); assert os.read(fd, 9) == b'12345'",
        m.mnt().display()
    );
    ok(&format!("python3 -c \"{py}\""));
}

/// Appends through two mounts of one server at once lose nothing: a FUSE
/// write's offset is the kernel's idea of the size, stale once the other
/// mount appended, so the mount asks the server for the end (606 of 1,200
/// lines survived before).
#[test]
fn appends_through_two_mounts_lose_nothing() {
    let m = Mounted::start("append");
    let other = Mount::start(&m.sock(), &m.dir.join("mnt2"));
    std::fs::write(m.root().join("log"), b"").unwrap();
    let mnts = [m.mnt(), other.point.clone()];
    let shells: Vec<Child> = (0..4)
        .map(|i| {
            let script = format!("for j in $(seq 1 300); do echo \"line-{i}-$(printf %05d $j)\" >> {}/log; done", mnts[i % 2].display());
            Command::new("bash").args(["-c", &script]).spawn().unwrap()
        })
        .collect();
    for mut c in shells {
        assert!(c.wait().unwrap().success());
    }
    let log = std::fs::read(m.root().join("log")).unwrap();
    let mut lines: Vec<&[u8]> = log.split(|&b| b == b'\n').filter(|l| !l.is_empty()).collect();
    assert!(lines.iter().all(|l| l.len() == 12), "every line whole");
    lines.sort_unstable();
    lines.dedup();
    assert_eq!(lines.len(), 1200, "every line once");
    assert_eq!(log.len(), 1200 * 13);
}

#[test]
fn sigterm_and_fusermount_unmount_cleanly() {
    let mut m = Mounted::start("umount");
    let child = m.mount.as_mut().unwrap().child.as_mut().unwrap();
    ok(&format!("kill -TERM {}", child.id()));
    let status = child.wait().unwrap();
    assert!(status.success(), "sluice mount exits 0 on SIGTERM: {status}");
    assert!(!is_mounted(&m.mnt()));
    assert!(sh("command -v fusermount3").status.success(), "fusermount3 is missing: `make test` installs the fuse3 package");
    let sock = format!("unix:{}", m.dir.join("s.sock").display());
    let mut again = Command::new(SLUICE).args(["mount", "--server", &sock]).arg(m.mnt()).spawn().unwrap();
    let mnt = m.mnt();
    wait_for(|| is_mounted(&mnt), "the second mount");
    ok(&format!("fusermount3 -u {}", mnt.display()));
    assert!(again.wait().unwrap().success(), "sluice mount exits 0 after fusermount3 -u");
}

#[test]
fn a_killed_server_gives_a_soft_mount_an_error_not_a_hang() {
    let mut m = Mounted::start_with("dead", &["--soft", "--timeout", "1"]);
    std::fs::write(m.root().join("f"), vec![7u8; 1 << 20]).unwrap();
    ok(&format!("cat {}/f > /dev/null", m.mnt().display()));
    m.server.kill().unwrap();
    m.server.wait().unwrap();
    let t = Instant::now();
    let out = sh(&format!("timeout 20 cat {}/f > /dev/null", m.mnt().display()));
    assert!(!out.status.success(), "reading through a mount whose server died must fail");
    assert_ne!(out.status.code(), Some(124), "cat hung until the timeout");
    assert!(String::from_utf8_lossy(&out.stderr).contains("timed out"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(t.elapsed() < Duration::from_secs(8), "the error took {:?}", t.elapsed());
}

/// Start `python3 -c script file`, piped, and wait for its `ready` line;
/// the process and its output.
fn python_ready(script: &str, file: &std::path::Path) -> (Child, std::io::BufReader<std::process::ChildStdout>) {
    let mut py = Command::new("python3").args(["-c", script]).arg(file).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut out = std::io::BufReader::new(py.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line, "ready\n");
    (py, out)
}

/// Regression: a process holding a file through the mount when the server
/// restarted got EIO forever; now its fd is reopened by path.
#[test]
fn a_held_file_survives_a_server_restart_through_the_mount() {
    let mut m = Mounted::start("restart");
    std::fs::write(m.root().join("f"), b"0123456789").unwrap();
    let script = "import sys, os\nf = open(sys.argv[1], 'rb')\nf.read(3)\nprint('ready', flush=True)\nsys.stdin.readline()\nprint(f.read(4).decode(), flush=True)\n";
    let (mut py, mut out) = python_ready(script, &m.mnt().join("f"));
    let mut line = String::new();
    m.server.kill().unwrap();
    m.server.wait().unwrap();
    m.server = m.spawn_server();
    std::io::Write::write_all(&mut py.stdin.take().unwrap(), b"go\n").unwrap();
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line, "3456\n");
    assert!(py.wait().unwrap().success());
}

/// Whether every thread of process `pid` is stopped (state `T`).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.flatten().all(|t| {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // The state follows the command name, which is in parentheses.
        stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T'))
    })
}

/// Whether process `pid` sleeps in the kernel waiting for a FUSE answer.
fn waits_for_fuse(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/wchan")).is_ok_and(|w| w == "request_wait_answer")
}

/// Tell a `python_ready` caller to go on, see it wait in the kernel for
/// the mount's answer (and still wait a while later: the mount is hard),
/// SIGKILL it, and check that it died of that within 1 s. `after` runs
/// once it is dead or found alive past 5 s (the test then fails): polled,
/// not waited, so that an unkillable caller fails the test, not hangs it
/// (dropping the mount then ends the caller).
fn go_wait_and_kill(mut py: Child, after: impl FnOnce()) {
    std::io::Write::write_all(&mut py.stdin.take().unwrap(), b"go\n").unwrap();
    let t = Instant::now();
    while !waits_for_fuse(py.id()) {
        if t.elapsed() > Duration::from_secs(10) {
            // Where it is instead, for the report.
            let proc = |f: &str| std::fs::read_to_string(format!("/proc/{}/{f}", py.id())).unwrap_or_default();
            let (wchan, stat, stack, exit) = (proc("wchan"), proc("stat"), proc("stack"), py.try_wait());
            let _ = py.kill();
            panic!("the caller never waited for the server in the kernel: exit {exit:?}, wchan {wchan:?}, stat {stat:?}, stack {stack}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(waits_for_fuse(py.id()), "a hard mount waits for its server");
    let t = Instant::now();
    py.kill().unwrap();
    let st = loop {
        match py.try_wait().unwrap() {
            Some(st) => break Some(st),
            None if t.elapsed() > Duration::from_secs(5) => break None,
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    let took = t.elapsed();
    after();
    let st = st.unwrap_or_else(|| panic!("the killed caller still lives after {took:?}"));
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&st), Some(libc::SIGKILL), "{st:?}");
    assert!(took < Duration::from_secs(1), "the killed caller took {took:?} to exit");
}

/// A reader through a hard mount waits for a dead server, as an NFS hard
/// mount does, in the kernel's wait for the mount's answer, which only
/// the answer ends once the mount has read the request. SIGKILL must still end it: the mount notices its caller dying
/// and answers EINTR. Before, it stayed in state D until the server came
/// back or the mount was killed. The mount itself keeps waiting for the
/// server for everyone else: a read after the restart succeeds.
#[test]
fn a_reader_of_a_dead_server_through_a_hard_mount_dies_at_sigkill() {
    let mut m = Mounted::start("killable");
    // Read-write: neither passthrough nor a cache lease answers its reads
    // without the server.
    std::fs::write(m.root().join("f"), vec![3u8; 1 << 16]).unwrap();
    let script = "import sys, os\nfd = os.open(sys.argv[1], os.O_RDWR)\nos.pread(fd, 4096, 0)\nprint('ready', flush=True)\nsys.stdin.readline()\nos.pread(fd, 4096, 8192)\n";
    let (py, _out) = python_ready(script, &m.mnt().join("f"));
    m.server.kill().unwrap();
    m.server.wait().unwrap();
    go_wait_and_kill(py, || {});
    assert!(is_mounted(&m.mnt()), "the mount outlives its killed caller");
    m.server = m.spawn_server();
    assert_eq!(std::fs::read(m.mnt().join("f")).unwrap().len(), 1 << 16, "the mount serves again once the server is back");
}

/// A server that stops answering without closing its socket (SIGSTOP):
/// a caller of the hard mount waits for it in the kernel, and SIGKILL
/// still ends that wait, since the mount polls the socket in slices and
/// looks at its caller between them. Before, only a server gone (not one
/// silent) let a killed caller go. The mount goes on once the server does.
#[test]
fn a_caller_of_a_stopped_server_through_a_hard_mount_dies_at_sigkill() {
    let m = Mounted::start("stopped");
    std::fs::write(m.root().join("f"), vec![5u8; 4096]).unwrap();
    // A name not looked up before: the kernel must ask the mount, which
    // asks the server.
    let script = "import sys, os\nos.stat(sys.argv[1])\nprint('ready', flush=True)\nsys.stdin.readline()\nos.stat(sys.argv[1] + '.new')\n";
    let (py, _out) = python_ready(script, &m.mnt().join("f"));
    ok(&format!("kill -STOP {}", m.server.id()));
    let server = m.server.id();
    // kill(2) returns before the server has stopped: on a busy VM it
    // could still answer the lookup below, and the caller would never wait.
    wait_for(|| all_threads_stopped(server), "the server to stop");
    go_wait_and_kill(py, || ok(&format!("kill -CONT {server}")));
    assert_eq!(std::fs::read(m.mnt().join("f")).unwrap(), vec![5u8; 4096], "the mount serves once the server goes on");
    assert!(!m.mnt().join("f.new").exists());
}

#[test]
fn a_missing_server_is_refused_before_mounting() {
    let dir = std::env::temp_dir().join(format!("sluice-fuse-none-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(SLUICE).args(["mount", "--server", "unix:/nonexistent/sluice.sock"]).arg(&dir).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("sluice"), "one clear line: {}", String::from_utf8_lossy(&out.stderr));
}

/// fio, 4 psync jobs, write then read back with crc32c verification,
/// buffered and O_DIRECT, through the mount (the FUSE mount's fio acceptance test).
#[test]
fn fio_psync_four_jobs_verify_through_the_mount() {
    assert!(sh("fio --version").status.success(), "fio is missing: `make test` installs it");
    let m = Mounted::start("fio");
    for direct in [0, 1] {
        for rw in ["write", "read"] {
            let out = sh(&format!(
                "fio --name=v --directory={} --ioengine=psync --numjobs=4 --rw={rw} --bs=64k --size=4M --verify=crc32c --do_verify=1 --verify_state_save=0 --direct={direct} --group_reporting --output-format=terse",
                m.mnt().display()
            ));
            assert!(out.status.success(), "fio {rw} direct={direct}: {}", String::from_utf8_lossy(&out.stderr));
            let text = String::from_utf8_lossy(&out.stdout);
            let f: Vec<&str> = text.lines().find(|l| l.starts_with("3;")).expect("a terse fio line").split(';').collect();
            assert_eq!(f[4], "0", "fio {rw} direct={direct} reported errors");
            assert_eq!(f[5], (16 * 1024).to_string(), "fio {rw} direct={direct} read (verification included)");
        }
    }
    for j in 0..4 {
        assert_eq!(std::fs::metadata(m.root().join(format!("v.{j}.0"))).unwrap().len(), 4 << 20);
    }
}

/// A 4-rank MPI-IO program (mpi4py, OpenMPI's default I/O component):
/// strided file view, collective write and read, through the mount; the
/// backing file must equal the same program's output on a local file.
#[test]
fn mpi_io_collective_four_ranks_through_the_mount() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/mpi/collective.py");
    let m = Mounted::start("mpi");
    let mpi = format!("mpirun --allow-run-as-root --oversubscribe -np 4 /usr/bin/python3 {script}");
    let local = m.dir.join("local.dat");
    let out = sh(&format!("timeout 60 {mpi} {}", local.display()));
    assert!(String::from_utf8_lossy(&out.stdout).contains("OK 1048576"), "direct run: {}", String::from_utf8_lossy(&out.stderr));
    let out = sh(&format!("timeout 60 {mpi} {}/m.dat", m.mnt().display()));
    assert!(String::from_utf8_lossy(&out.stdout).contains("OK 1048576"), "through the mount: {}", String::from_utf8_lossy(&out.stderr));
    same(&local, &m.root().join("m.dat"));
}

#[test]
fn the_mount_serves_its_own_metrics() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let m = Mounted::start_with("metrics", &["--metrics", &port.to_string(), "--no-passthrough"]);
    let f = m.mnt().join("f");
    ok(&format!("dd if=/dev/urandom of={} bs=1M count=3 status=none", f.display()));
    ok(&format!("cat {} > /dev/null", f.display()));
    wait_for(|| std::net::TcpStream::connect(port).is_ok(), "the mount's metrics endpoint");
    let scrape = || sluice_server::metrics::parse(&sluice_server::metrics::get(&port.to_string(), "/metrics", Duration::from_secs(10)).unwrap()).unwrap();
    // The kernel sends FUSE's RELEASE after `close` has returned: the
    // last handle may still be open for a moment after `cat` exits.
    let closed = |s: &[sluice_server::metrics::Sample]| sluice_server::metrics::value(s, "sluice_mount_handles_open", &[]) == Some(0.0);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut samples = scrape();
    while !closed(&samples) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        samples = scrape();
    }
    let v = |name: &str, labels: &[(&str, &str)]| sluice_server::metrics::value(&samples, name, labels).unwrap_or_else(|| panic!("{name} missing"));
    assert_eq!(v("sluice_mount_bytes_total", &[("op", "write")]), (3 << 20) as f64, "every byte dd wrote");
    assert_eq!(v("sluice_mount_bytes_total", &[("op", "read")]), (3 << 20) as f64, "every byte cat read");
    assert!(v("sluice_mount_requests_total", &[("op", "write")]) >= 3.0);
    assert_eq!(v("sluice_mount_request_seconds_count", &[("op", "write")]), v("sluice_mount_requests_total", &[("op", "write")]));
    assert_eq!(v("sluice_mount_handles_open", &[]), 0.0, "dd and cat closed their files");
    assert!(v("sluice_mount_connections", &[]) >= 1.0);
    assert_eq!(v("sluice_mount_passthrough_opens_total", &[]), 0.0, "--no-passthrough: cat's read came through the mount");
}

/// Whether this kernel and user can hand FUSE a backing file: Linux 6.9
/// or later, as root (`FUSE_DEV_IOC_BACKING_OPEN` needs CAP_SYS_ADMIN).
fn passthrough_possible() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut v = release.split(|c: char| !c.is_ascii_digit()).filter_map(|x| x.parse::<u32>().ok());
    let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
    // SAFETY: geteuid has no preconditions.
    (major, minor) >= (6, 9) && unsafe { libc::geteuid() } == 0
}

/// By default, a read-only open of a file wholly in the page cache is
/// handed the file itself: its reads never reach the mount (no bytes
/// counted there), and return the file's bytes; two such opens share the
/// inode's backing file. A write open meanwhile names that backing file
/// too (the kernel refuses it otherwise) but its writes still go through
/// the mount, and the passthrough readers see them. A read open while a
/// plain open lasts, a file not all cached, and a write open alone take
/// the mount's path.
#[test]
fn passthrough_reads_cached_files_without_the_mount() {
    if !passthrough_possible() {
        eprintln!("this kernel or user cannot hand FUSE a backing file: passthrough not tested");
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let m = Mounted::start_with("passthrough", &["--metrics", &port.to_string()]);
    let (f, backing) = (m.mnt().join("f"), m.root().join("f"));
    ok(&format!("dd if=/dev/urandom of={} bs=1M count=8 status=none", f.display()));
    wait_for(|| std::net::TcpStream::connect(port).is_ok(), "the mount's metrics endpoint");
    let metric = |name: &str, labels: &[(&str, &str)]| {
        let text = sluice_server::metrics::get(&port.to_string(), "/metrics", Duration::from_secs(10)).unwrap();
        sluice_server::metrics::value(&sluice_server::metrics::parse(&text).unwrap(), name, labels).unwrap_or_else(|| panic!("{name} missing"))
    };
    // Just written through the server: all in the page cache.
    let copy = m.dir.join("copy");
    ok(&format!("dd if={} of={} bs=1M status=none", f.display(), copy.display()));
    same(&backing, &copy);
    assert_eq!(metric("sluice_mount_passthrough_opens_total", &[]), 1.0);
    assert_eq!(metric("sluice_mount_bytes_total", &[("op", "read")]), 0.0, "the kernel read the file itself");
    let written = metric("sluice_mount_bytes_total", &[("op", "write")]);
    // Two opens of the cached file at once share the inode's backing file;
    // a write open meanwhile is a shared one: its write reaches the mount
    // and both readers see it.
    let both = format!(
        "python3 -c 'import os; a = os.open(\"{f}\", os.O_RDONLY); b = os.open(\"{f}\", os.O_RDONLY); \
         x = os.pread(a, 1 << 20, 0); y = os.pread(b, 1 << 20, 1 << 20); \
         assert x == open(\"{g}\", \"rb\").read(1 << 20) and len(y) == 1 << 20; \
         w = os.open(\"{f}\", os.O_WRONLY); assert os.pwrite(w, b\"x\" * 4096, 4096) == 4096; \
         assert os.pread(a, 8192, 0) == x[:4096] + b\"x\" * 4096 and os.pread(b, 4096, 4096) == b\"x\" * 4096; \
         [os.close(d) for d in (a, b, w)]; print(\"ok\")'",
        f = f.display(),
        g = backing.display()
    );
    let out = sh(&both);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok", "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(metric("sluice_mount_passthrough_opens_total", &[]), 3.0, "both read opens passed through");
    assert_eq!(metric("sluice_mount_shared_opens_total", &[]), 1.0, "the write open shared the backing file");
    assert_eq!(metric("sluice_mount_bytes_total", &[("op", "write")]), written + 4096.0, "the shared open's write went through the mount");
    assert_eq!(metric("sluice_mount_bytes_total", &[("op", "read")]), 0.0);
    // A plain open first (a writer): a cached read open meanwhile takes
    // the mount's path, since the kernel would refuse a backing file now.
    let plain_first = format!(
        "python3 -c 'import os; w = os.open(\"{f}\", os.O_WRONLY); r = os.open(\"{f}\", os.O_RDONLY); \
         assert os.pread(r, 4096, 4096) == b\"x\" * 4096; [os.close(d) for d in (r, w)]; print(\"ok\")'",
        f = f.display()
    );
    let out = sh(&plain_first);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok", "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(metric("sluice_mount_passthrough_opens_total", &[]), 3.0, "a plain open was live: no passthrough");
    assert_eq!(metric("sluice_mount_bytes_total", &[("op", "read")]), 4096.0);
    // O_DIRECT asked for the device: the mount's path, cached or not.
    ok(&format!("dd if={} of=/dev/null bs=4k count=1 iflag=direct status=none", f.display()));
    assert_eq!(metric("sluice_mount_passthrough_opens_total", &[]), 3.0, "O_DIRECT: no passthrough");
    assert_eq!(metric("sluice_mount_bytes_total", &[("op", "read")]), 8192.0);
    // Out of the page cache (the backing file written back, its pages
    // dropped): the mount's path.
    ok(&format!("python3 -c 'import os; fd = os.open(\"{}\", os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)'", backing.display()));
    ok(&format!("dd if={} of={} bs=1M status=none", f.display(), copy.display()));
    same(&backing, &copy);
    assert_eq!(metric("sluice_mount_passthrough_opens_total", &[]), 3.0, "not all cached: no passthrough");
    assert_eq!(metric("sluice_mount_bytes_total", &[("op", "read")]), (8192 + (8 << 20)) as f64);
    // A write open alone is never handed the file, cached or not.
    ok(&format!("dd if=/dev/zero of={} bs=4k count=1 conv=notrunc status=none", f.display()));
    assert_eq!(metric("sluice_mount_passthrough_opens_total", &[]), 3.0);
    assert_eq!(metric("sluice_mount_shared_opens_total", &[]), 1.0);
    assert_eq!(metric("sluice_mount_bytes_total", &[("op", "write")]), written + 8192.0);
    ok(&format!("cmp -n 4096 {} /dev/zero", f.display()));
}
