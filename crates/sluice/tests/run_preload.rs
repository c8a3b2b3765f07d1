//! End-to-end tests of `sluice run`: real programs (cp, cat, sha256sum,
//! dd, tar, ls, stat, sh, python3) run with the interposer preloaded
//! against an in-process server on a temporary directory, and every
//! result is compared with the same operation done directly on the
//! backing directory.
//!
//! The interposer library must be built: `make test` builds the workspace
//! first, and `cargo test` builds it as a dev-dependency (into `deps/`).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use sluice_server::{Listen, Server, ServerConfig, ServerHandle};
use tempfile::TempDir;

use common::{bytes, preload_library, SLUICE};
/// Longest any one command may run before the test fails (it is killed).
const COMMAND_TIMEOUT_S: u32 = 30;

/// A server on a temporary root, and a local work directory; both go
/// away (server drained, files removed) when dropped, even on failure.
struct Fixture {
    server: ServerHandle,
    dir: TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::Builder::new().prefix("sluice-run-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        for d in ["root", "work"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
        }
        let cfg = ServerConfig::new(dir.path().join("root"), Listen::Unix(dir.path().join("s.sock")));
        let server = Server::start(cfg).unwrap();
        Fixture { server, dir }
    }

    /// The backing directory: the server's root.
    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// The prefix standing for the server root; it does not exist locally.
    fn prefix(&self) -> String {
        self.dir.path().join("svc").to_str().unwrap().to_string()
    }

    /// `PREFIX/rel`.
    fn svc(&self, rel: &str) -> String {
        format!("{}/{rel}", self.prefix())
    }

    /// `sluice run` of `args` against `addr`, in the work directory.
    fn run_at(&self, addr: &str, args: &[&str], stdin: &[u8]) -> Output {
        let mut c = Command::new("timeout");
        c.arg(COMMAND_TIMEOUT_S.to_string()).arg(SLUICE).args(["run", "--server", addr, "--prefix", &self.prefix(), "--app", "run-test", "--"]).args(args);
        c.env("SLUICE_PRELOAD", preload_library()).current_dir(self.work());
        let mut child = c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        let out = child.wait_with_output().unwrap();
        assert_ne!(out.status.code(), Some(124), "{args:?} timed out");
        out
    }

    fn run(&self, args: &[&str]) -> Output {
        let out = self.run_at(self.server.addr(), args, b"");
        assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        out
    }
}

/// The same command run directly, in the work directory.
fn direct(f: &Fixture, args: &[&str]) -> Output {
    let out = Command::new(args[0]).args(&args[1..]).current_dir(f.work()).output().unwrap();
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn read(p: impl AsRef<Path>) -> Vec<u8> {
    std::fs::read(p.as_ref()).unwrap_or_else(|e| panic!("{}: {e}", p.as_ref().display()))
}

/// Every file and directory under `dir`, with file contents, sorted.
fn tree(dir: &Path) -> Vec<(String, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(dir).unwrap().to_str().unwrap().to_string();
            if p.is_dir() {
                stack.push(p);
                out.push((rel, None));
            } else {
                out.push((rel, Some(read(&p))));
            }
        }
    }
    out.sort();
    out
}

fn make_tree(dir: &Path) {
    std::fs::create_dir_all(dir.join("sub/deeper")).unwrap();
    std::fs::write(dir.join("a.txt"), b"alpha\n").unwrap();
    std::fs::write(dir.join("sub/b.bin"), bytes(300_000, 2)).unwrap();
    std::fs::write(dir.join("sub/deeper/c"), bytes(10, 3)).unwrap();
    std::fs::write(dir.join("sub/empty"), b"").unwrap();
}

#[test]
fn cp_cat_and_sha256sum_move_a_file_byte_for_byte() {
    let f = Fixture::new();
    let data = bytes(4 << 20, 1);
    std::fs::write(f.work().join("in.bin"), &data).unwrap();
    f.run(&["cp", "in.bin", &f.svc("a.bin")]);
    assert!(read(f.root().join("a.bin")) == data, "cp into the service");
    f.run(&["cp", &f.svc("a.bin"), "out.bin"]);
    assert!(read(f.work().join("out.bin")) == data, "cp out of the service");
    assert!(f.run(&["cat", &f.svc("a.bin")]).stdout == data, "cat");
    let via = f.run(&["sha256sum", &f.svc("a.bin")]).stdout;
    let plain = direct(&f, &["sha256sum", f.root().join("a.bin").to_str().unwrap()]).stdout;
    assert_eq!(via[..64], plain[..64], "sha256sum (stdio fopen/fread)");
}

#[test]
fn dd_with_small_blocks_and_o_direct_matches_dd_on_the_backing_file() {
    let f = Fixture::new();
    std::fs::write(f.work().join("in.bin"), bytes((1 << 20) + 4096 + 100, 4)).unwrap();
    for (name, opts) in [("small", &["bs=512"][..]), ("blocks", &["bs=4k", "seek=3"][..]), ("direct", &["bs=64k", "oflag=direct"][..])] {
        let via = format!("of={}", f.svc(name));
        let plain = format!("of={}", f.root().join(format!("{name}.direct")).display());
        for of in [&via, &plain] {
            let mut args = vec!["dd", "if=in.bin", of.as_str(), "status=none"];
            args.extend_from_slice(opts);
            if of == &via {
                f.run(&args)
            } else {
                direct(&f, &args)
            };
        }
        assert!(read(f.root().join(name)) == read(f.root().join(format!("{name}.direct"))), "dd {opts:?}");
    }
    let back = f.run(&["dd", &format!("if={}", f.svc("direct")), "of=/dev/stdout", "bs=4k", "iflag=direct", "status=none"]).stdout;
    assert!(back == read(f.work().join("in.bin")), "dd iflag=direct back out");
}

#[test]
fn tar_creates_and_extracts_trees_on_the_service() {
    let f = Fixture::new();
    make_tree(&f.work().join("src"));
    f.run(&["tar", "-cf", &f.svc("t.tar"), "-C", "src", "."]);
    let listed = |o: Output| -> Vec<String> {
        let mut v: Vec<String> = String::from_utf8(o.stdout).unwrap().lines().map(str::to_string).collect();
        v.sort();
        v
    };
    let via = listed(f.run(&["tar", "-tf", &f.svc("t.tar")]));
    assert_eq!(via, listed(direct(&f, &["tar", "-tf", f.root().join("t.tar").to_str().unwrap()])), "tar -tf");
    assert_eq!(via, listed(direct(&f, &["sh", "-c", "tar -cf - -C src . | tar -tf -"])), "the same members as tar run directly");
    std::fs::create_dir(f.work().join("x1")).unwrap();
    f.run(&["tar", "-xf", &f.svc("t.tar"), "-C", "x1"]);
    assert_eq!(tree(&f.work().join("x1")), tree(&f.work().join("src")), "extract from a service archive");
    f.run(&["mkdir", &f.svc("x2")]);
    f.run(&["tar", "-xf", &f.svc("t.tar"), "-C", &f.svc("x2")]);
    assert_eq!(tree(&f.root().join("x2")), tree(&f.work().join("src")), "extract into the service");
    f.run(&["tar", "-cf", "back.tar", "-C", &f.svc("x2"), "."]);
    std::fs::create_dir(f.work().join("x3")).unwrap();
    direct(&f, &["tar", "-xf", "back.tar", "-C", "x3"]);
    assert_eq!(tree(&f.work().join("x3")), tree(&f.work().join("src")), "archive a service tree");
}

#[test]
fn ls_and_stat_of_service_paths_match_the_backing_directory() {
    let f = Fixture::new();
    make_tree(&f.root().join("t"));
    let via = f.run(&["ls", "-lR", "--time-style=full-iso", &f.svc("t")]).stdout;
    let plain = direct(&f, &["ls", "-lR", "--time-style=full-iso", f.root().join("t").to_str().unwrap()]).stdout;
    let norm = |o: Vec<u8>, base: &str| String::from_utf8(o).unwrap().replace(base, "BASE");
    assert_eq!(norm(via, &f.svc("t")), norm(plain, f.root().join("t").to_str().unwrap()), "ls -lR");
    let fmt = "%n %s %a %F %h %i %u %g %Y %y";
    for rel in ["t", "t/a.txt", "t/sub/b.bin", "t/sub/empty"] {
        let via = f.run(&["stat", "-c", fmt, &f.svc(rel)]).stdout;
        let plain = direct(&f, &["stat", "-c", fmt, f.root().join(rel).to_str().unwrap()]).stdout;
        assert_eq!(norm(via, &f.prefix()), norm(plain, f.root().to_str().unwrap()), "stat {rel}");
    }
    let missing = f.run_at(f.server.addr(), &["stat", &f.svc("nope")], b"");
    assert!(!missing.status.success() && String::from_utf8_lossy(&missing.stderr).contains("No such file"), "stat of a missing file");
}

/// open/seek/read/write, os-level and stdio (through ctypes), threads.
const PY_SCRIPT: &str = r#"
import ctypes, os, sys, threading
d = sys.argv[1]
with open(d + "/py.bin", "wb") as f:
    f.write(bytes(range(256)) * 64); f.seek(1000); f.write(b"hello"); print(f.tell())
with open(d + "/py.bin", "r+b") as f:
    f.seek(998); print(f.read(9)); f.seek(0, 2); print(f.tell()); f.write(b"END"); f.flush(); os.fsync(f.fileno())
fd = os.open(d + "/py.bin", os.O_RDONLY)
res = [None] * 8
def worker(i): res[i] = os.pread(fd, 512, i * 1001)
ts = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
print([r[:4].hex() for r in res], os.fstat(fd).st_size)
os.close(fd)
libc = ctypes.CDLL(None, use_errno=True)
libc.fopen.restype = ctypes.c_void_p; libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
for n in ["fwrite", "fread"]:
    getattr(libc, n).argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
for n in ["fclose", "fflush", "ftell", "fileno"]:
    getattr(libc, n).argtypes = [ctypes.c_void_p]
libc.ftell.restype = ctypes.c_long
libc.fseek.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_int]
fp = libc.fopen((d + "/stdio.txt").encode(), b"w+")
libc.fwrite(b"0123456789" * 100, 10, 100, fp); libc.fflush(fp)
libc.fseek(fp, 500, 0); buf = ctypes.create_string_buffer(10); libc.fread(buf, 1, 10, fp)
print(buf.raw, libc.ftell(fp), libc.fileno(fp) > 2)
libc.fclose(fp)
print(libc.fopen((d + "/absent").encode(), b"r") is None, ctypes.get_errno() == 2)
print(sorted(os.listdir(d)), os.path.isdir(d), os.path.exists(d + "/nope"))
os.rename(d + "/py.bin", d + "/py2.bin"); os.mkdir(d + "/dd"); os.rmdir(d + "/dd"); os.unlink(d + "/stdio.txt")
print(sorted(os.listdir(d)))
fd = os.open(d + "/alloc.bin", os.O_CREAT | os.O_RDWR, 0o644)
os.posix_fallocate(fd, 0, 20000); os.pwrite(fd, b"abc", 100)
print(os.fstat(fd).st_size, os.preadv(fd, [bytearray(2), bytearray(3)], 99))
os.close(fd); os.unlink(d + "/alloc.bin")
"#;

#[test]
fn a_python_script_sees_the_same_files_as_when_run_directly() {
    let f = Fixture::new();
    std::fs::write(f.work().join("t.py"), PY_SCRIPT).unwrap();
    std::fs::create_dir(f.work().join("plain")).unwrap();
    let via = f.run(&["python3", "t.py", &f.prefix()]).stdout;
    let plain = direct(&f, &["python3", "t.py", "plain"]).stdout;
    assert_eq!(String::from_utf8_lossy(&via), String::from_utf8_lossy(&plain));
    assert!(read(f.root().join("py2.bin")) == read(f.work().join("plain/py2.bin")), "file contents");
}

const FORK_SCRIPT: &str = r#"
import os, sys
d = sys.argv[1]
fd = os.open(d + "/fork.bin", os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
os.write(fd, b"parent;")
pid = os.fork()
if pid == 0:
    os.write(fd, b"child;")
    with open(d + "/child.txt", "w") as f: f.write("from the child")
    os._exit(0)
os.waitpid(pid, 0)
os.write(fd, b"parent again;")
os.lseek(fd, 0, 0)
print(os.read(fd, 100))
"#;

#[test]
fn forked_children_and_exec_after_a_shell_redirect_keep_working() {
    let f = Fixture::new();
    let data = bytes(1 << 20, 5);
    std::fs::write(f.root().join("a"), &data).unwrap();
    let script = format!("cat {0}/a > {0}/b && echo tail >> {0}/b && wc -c < {0}/b", f.prefix());
    let via = f.run(&["sh", "-c", &script]).stdout;
    assert_eq!(String::from_utf8_lossy(&via).trim(), (data.len() + 5).to_string());
    let mut expected = data.clone();
    expected.extend_from_slice(b"tail\n");
    assert!(read(f.root().join("b")) == expected, "sh redirect, then exec of cat");
    std::fs::write(f.work().join("f.py"), FORK_SCRIPT).unwrap();
    std::fs::create_dir(f.work().join("plain")).unwrap();
    let via = f.run(&["python3", "f.py", &f.prefix()]).stdout;
    let plain = direct(&f, &["python3", "f.py", "plain"]).stdout;
    assert_eq!(via, plain);
    assert_eq!(read(f.root().join("child.txt")), read(f.work().join("plain/child.txt")));
}

/// Python's `subprocess` starts its child with `vfork` and closes every
/// descriptor it does not pass on, in the parent's memory: that emptied
/// the parent's tables, and its next writes were acknowledged and lost.
const SUBPROCESS_SCRIPT: &str = r#"
import os, subprocess, sys
d = sys.argv[1]
fd = os.open(d + "/sub.bin", os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
os.pwrite(fd, b"before the child;", 0)
subprocess.run("true", shell=True, check=True)
subprocess.run(["sh", "-c", "exit 0"], close_fds=True, check=True)
print(os.pread(fd, 17, 0))
os.pwrite(fd, b"x" * 300000, 17)
os.fsync(fd)
print(os.fstat(fd).st_size)
os.close(fd)
"#;

#[test]
fn a_service_fd_survives_a_subprocess_started_with_vfork() {
    let f = Fixture::new();
    std::fs::write(f.work().join("s.py"), SUBPROCESS_SCRIPT).unwrap();
    std::fs::create_dir(f.work().join("plain")).unwrap();
    let via = f.run(&["python3", "s.py", &f.prefix()]).stdout;
    let plain = direct(&f, &["python3", "s.py", "plain"]).stdout;
    assert_eq!(String::from_utf8_lossy(&via), String::from_utf8_lossy(&plain));
    assert_eq!(String::from_utf8_lossy(&plain), "b'before the child;'\n300017\n");
    assert!(read(f.root().join("sub.bin")) == read(f.work().join("plain/sub.bin")), "what was written after the child is on the server");
}

/// A shell's own descriptor numbers: `exec 3>` and `exec 4>` used to
/// take over the client's socket (on fds 3 and 4), and every service call
/// after failed; a reconnect then closed the shell's fd 3.
#[test]
fn a_shell_can_use_descriptors_3_and_4_for_service_files() {
    let f = Fixture::new();
    let script = format!("read x < {0}/in; exec 3>{0}/log; echo a >&3; exec 4>{0}/log2; echo b >&4; read y < {0}/in; echo \"$x $y\" >&3; cat {0}/log {0}/log2", f.prefix());
    std::fs::write(f.root().join("in"), b"line\n").unwrap();
    let out = f.run(&["sh", "-c", &script]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "a\nline line\nb\n", "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(read(f.root().join("log")), b"a\nline line\n");
}

/// bash prints its builtins' output through glibc's `stdout`, whose
/// writes are internal calls: with fd 1 redirected to a service file they
/// reached the placeholder, and `echo hello > /sluice/f` left the file
/// empty. A C program's `fgets(stdin)` after `dup2` onto fd 0 likewise.
#[test]
fn bash_builtins_redirected_to_service_files_write_them() {
    let f = Fixture::new();
    std::fs::create_dir(f.work().join("plain")).unwrap();
    let script = "d=$1; echo hello > $d/e1; printf '%s\\n' two >> $d/e1; { echo a; echo b; } > $d/e2; exec 5>$d/e3; echo five >&5; exec 5>&-; read x < $d/e1; echo \"after $x\"; cat $d/e1 $d/e2 $d/e3";
    let via = f.run(&["bash", "-c", script, "bash", &f.prefix()]);
    let plain = direct(&f, &["bash", "-c", script, "bash", "plain"]);
    assert_eq!(String::from_utf8_lossy(&plain.stdout), "after hello\nhello\ntwo\na\nb\nfive\n");
    assert_eq!(String::from_utf8_lossy(&via.stdout), String::from_utf8_lossy(&plain.stdout), "{}", String::from_utf8_lossy(&via.stderr));
    for name in ["e1", "e2", "e3"] {
        assert!(read(f.root().join(name)) == read(f.work().join("plain").join(name)), "{name}");
    }
}

/// Appends from several processes at once lose nothing: each `>>` of the
/// four shells lands whole, once (the server hands out the end; the
/// interposer used to take the size and write there, and 640 of 1,200
/// lines survived). An `O_APPEND` fd's position is the end after its
/// write, and `pwrite` on it appends, as on Linux.
const APPEND_SCRIPT: &str = r#"
d=$1
for i in 1 2 3 4; do
  ( for j in $(seq 1 300); do echo "line-$i-$(printf %05d $j)" >> $d/log; done ) &
done
wait
python3 - "$d" <<'PY'
import os, sys
d = sys.argv[1]
lines = open(d + "/log", "rb").read().splitlines()
print(len(lines), len(set(lines)), all(len(l) == 12 for l in lines))
fd = os.open(d + "/p", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
os.write(fd, b"abc")
os.pwrite(fd, b"def", 0)
print(os.lseek(fd, 0, os.SEEK_CUR), open(d + "/p").read())
PY
"#;

#[test]
fn appends_from_several_processes_lose_nothing() {
    let f = Fixture::new();
    let out = f.run(&["bash", "-c", APPEND_SCRIPT, "bash", &f.prefix()]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1200 1200 True\n3 abcdef\n", "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::metadata(f.root().join("log")).unwrap().len(), 1200 * 13);
}

/// Processes that share one open file (subshells writing to the standard
/// output they inherited) lose nothing, as locally, where the kernel
/// holds the one file position while each writes: a record lock on the
/// placeholder does that between processes (1,024 of 1,200 lines were
/// left without it).
#[test]
fn subshells_writing_to_an_inherited_fd_lose_nothing() {
    let f = Fixture::new();
    std::fs::create_dir(f.work().join("plain")).unwrap();
    let script = "for i in 1 2 3 4; do ( for j in $(seq 1 300); do echo \"line-$i-$(printf %05d $j)\"; done ) & done > $1/out; wait; sort $1/out | uniq | wc -l";
    let via = f.run(&["bash", "-c", script, "bash", &f.prefix()]);
    let plain = direct(&f, &["bash", "-c", script, "bash", "plain"]);
    assert_eq!(String::from_utf8_lossy(&plain.stdout).trim(), "1200");
    assert_eq!(String::from_utf8_lossy(&via.stdout).trim(), "1200", "{}", String::from_utf8_lossy(&via.stderr));
    assert_eq!(std::fs::metadata(f.root().join("out")).unwrap().len(), 1200 * 13);
}

/// `sort` checks its inputs with `euidaccess`, and `uniq` reopens `stdin`
/// on its input with `freopen`: glibc's own versions reach the kernel
/// with internal calls, so `sort PREFIX/f` failed with "cannot read" and
/// `uniq PREFIX/f` with ENOENT. Both, and a shell's `[ -r ]`, match the
/// same commands on local files.
#[test]
fn sort_and_uniq_read_and_write_service_files() {
    let f = Fixture::new();
    std::fs::create_dir(f.work().join("plain")).unwrap();
    for dir in [f.root(), f.work().join("plain")] {
        std::fs::write(dir.join("in"), "b\nb\na\nc\nc\n").unwrap();
    }
    let script = "d=$1; sort $d/in; sort -u -o $d/sorted $d/in; uniq $d/in; uniq -c $d/in $d/counted; uniq < $d/in; [ -r $d/in ] && echo readable; cat $d/sorted $d/counted";
    let via = f.run(&["bash", "-c", script, "bash", &f.prefix()]);
    let plain = direct(&f, &["bash", "-c", script, "bash", "plain"]);
    assert!(plain.stdout.ends_with(b"readable\na\nb\nc\n      2 b\n      1 a\n      2 c\n"), "{}", String::from_utf8_lossy(&plain.stdout));
    assert_eq!(String::from_utf8_lossy(&via.stdout), String::from_utf8_lossy(&plain.stdout), "{}", String::from_utf8_lossy(&via.stderr));
}

/// `lstat`, `readlink` and `shutil.rmtree` see a symbolic link as one, as
/// locally. Before, `lstat` followed it: `os.path.islink` was false, and
/// `shutil.rmtree` of a link to a directory emptied the directory.
const LINK_SCRIPT: &str = r#"
import os, shutil, sys
d = sys.argv[1]
print(os.path.islink(d + "/d/link"), os.readlink(d + "/d/link"), open(d + "/d/link/keep").read())
try:
    shutil.rmtree(d + "/d/link")
    print("rmtree of a link: removed")
except OSError as e:
    print("rmtree of a link: refused")
shutil.rmtree(d + "/d")
print(os.path.exists(d + "/d"), open(d + "/real/keep").read())
"#;

#[test]
fn symbolic_links_are_links_to_lstat_readlink_and_rmtree() {
    let f = Fixture::new();
    for base in [f.root(), f.work().join("plain")] {
        std::fs::create_dir_all(base.join("real")).unwrap();
        std::fs::write(base.join("real/keep"), b"kept").unwrap();
        std::fs::create_dir_all(base.join("d")).unwrap();
        std::os::unix::fs::symlink("../real", base.join("d/link")).unwrap();
    }
    std::fs::write(f.work().join("l.py"), LINK_SCRIPT).unwrap();
    let via = f.run(&["python3", "l.py", &f.prefix()]);
    let plain = direct(&f, &["python3", "l.py", "plain"]);
    assert_eq!(String::from_utf8_lossy(&plain.stdout), "True ../real kept\nrmtree of a link: refused\nFalse kept\n");
    assert_eq!(String::from_utf8_lossy(&via.stdout), String::from_utf8_lossy(&plain.stdout), "{}", String::from_utf8_lossy(&via.stderr));
    assert_eq!(read(f.root().join("real/keep")), b"kept");
}

/// `ln -s` and `os.symlink` make links on the server (before, `symlink`
/// was not interposed and failed with ENOENT): a relative target is kept
/// as given, an absolute one under the prefix is stored relative to the
/// link's directory so the server follows it, and one elsewhere as given.
#[test]
fn ln_s_makes_links_on_the_server() {
    let f = Fixture::new();
    std::fs::create_dir(f.root().join("d")).unwrap();
    std::fs::write(f.root().join("a"), b"data\n").unwrap();
    let script = "d=$1; ln -s a $d/l1 && ln -s $d/a $d/d/l2 && ln -s /etc/hostname $d/l3 && cat $d/l1 $d/d/l2 && readlink $d/l1 $d/d/l2 $d/l3; \
                  ln -s a $d/l1 2>/dev/null || echo exists; python3 -c \"import os, sys; os.symlink('d', sys.argv[1] + '/l4'); print(os.path.islink(sys.argv[1] + '/l4'), open(sys.argv[1] + '/l4/l2').read().strip())\" $d";
    let out = f.run(&["bash", "-c", script, "bash", &f.prefix()]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "data\ndata\na\n../a\n/etc/hostname\nexists\nTrue data\n", "{}", String::from_utf8_lossy(&out.stderr));
    for (link, target) in [("l1", "a"), ("d/l2", "../a"), ("l3", "/etc/hostname"), ("l4", "d")] {
        assert_eq!(std::fs::read_link(f.root().join(link)).unwrap().to_str(), Some(target), "{link}");
    }
}

/// A cwd on the service: `mkdir -p` (which walks down with `chdir`) and
/// a shell's `cd PREFIX/dir` work, relative paths resolve there, `pwd`,
/// a program the shell runs and Python's `os.getcwd` all see it, and `cd`
/// back to a local directory is local again. Before, `chdir` into the
/// prefix failed with ENOENT and `mkdir -p PREFIX/d/e` with "cannot create
/// directory". A relative path that climbs out of the prefix fails with
/// ENOENT rather than reaching the directory the shell was in.
#[test]
fn mkdir_p_and_cd_into_the_service() {
    let f = Fixture::new();
    let script = "d=$1; mkdir -p $d/a/b/c && mkdir -p $d/a/b && cd $d/a && pwd && /bin/pwd && echo hi > x && cat x && ls && cd b && ls .. && \
                  python3 -c 'import os; print(os.getcwd() == os.environ[\"D\"] + \"/a/b\", os.listdir(\".\"))'; \
                  cat ../../../work-file 2>/dev/null || echo climbed-out; cd \"$W\" && cat work-file";
    std::fs::write(f.work().join("work-file"), b"local\n").unwrap();
    let mut c = Command::new("timeout");
    c.arg(COMMAND_TIMEOUT_S.to_string()).arg(SLUICE).args(["run", "--server", f.server.addr(), "--prefix", &f.prefix(), "--"]);
    c.args(["bash", "-c", script, "bash", &f.prefix()]).env("SLUICE_PRELOAD", preload_library()).env("D", f.prefix()).env("W", f.work()).current_dir(f.work());
    let out = c.output().unwrap();
    let a = format!("{}/a", f.prefix());
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{a}\n{a}\nhi\nb\nx\nb\nx\nTrue ['c']\nclimbed-out\nlocal\n"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(read(f.root().join("a/x")), b"hi\n");
    assert!(f.root().join("a/b/c").is_dir());
}

/// A child reopens an inherited fd by path: if another file took the
/// path meanwhile (a rename over it), its calls fail with ESTALE instead
/// of reading the new file or writing over it. Before, `exec 3<f; mv n f;
/// cat <&3` printed the new file, and a forked child's write through the
/// old fd overwrote the file now at the path.
#[test]
fn an_inherited_fd_whose_path_names_another_file_is_stale() {
    let f = Fixture::new();
    std::fs::write(f.root().join("f"), b"old\n").unwrap();
    std::fs::write(f.root().join("n"), b"new\n").unwrap();
    let script = "d=$1; exec 3<$d/f; mv $d/n $d/f; cat <&3 2>/dev/null || echo stale; \
                  python3 -c 'import os, sys; fd = os.open(sys.argv[1] + \"/w\", os.O_WRONLY | os.O_CREAT, 0o644); os.replace(sys.argv[1] + \"/victim\", sys.argv[1] + \"/w\")\nif os.fork() == 0:\n    try: os.write(fd, b\"from-child\"); print(\"written\")\n    except OSError as e: print(e.errno == 116)\n    os._exit(0)\nos.wait()' $d";
    std::fs::write(f.root().join("victim"), b"victim").unwrap();
    let out = f.run(&["bash", "-c", script, "bash", &f.prefix()]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "stale\nTrue\n", "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(read(f.root().join("f")), b"new\n");
    assert_eq!(read(f.root().join("w")), b"victim", "the file now at the path is untouched");
}

/// In-place editors, modes, times and temporary files on the service
/// match the same commands on local files: `sed -i` and `perl -i` make
/// their new file with `mkstemp` (glibc's own failed, ENOENT) and give it
/// the old mode with `fchmod` (ignored before, so edited scripts lost
/// their execute bits through the mount); `chmod`, `install -m`, `touch
/// -d`, `cp -p` (whose ACL copy with `fsetxattr` "succeeded" on the
/// placeholder, so it never set the mode), `mktemp`, `remove` and `bzip2`
/// (which sets times with `utime` and removes its input with `remove`).
const EDIT_SCRIPT: &str = r#"
d=$1
printf '#!/bin/sh
echo hi
' > $d/s.sh; chmod 755 $d/s.sh
sed -i s/hi/ho/ $d/s.sh; tail -1 $d/s.sh; stat -c %a $d/s.sh
perl -pi -e s/ho/hu/ $d/s.sh; tail -1 $d/s.sh; stat -c %a $d/s.sh
install -m 750 $d/s.sh $d/i.sh; stat -c %a $d/i.sh
touch -d '2020-01-02 03:04:05' $d/s.sh; cp -p $d/s.sh $d/c.sh; stat -c '%a %Y' $d/s.sh $d/c.sh
chmod 600 $d/c.sh; stat -c %a $d/c.sh
t=$(mktemp -d $d/tmpd.XXXXXX); stat -c %a $t; f=$(mktemp $d/tf.XXXXXX.txt); stat -c %a $f; basename $f | grep -c '^tf\.......\.txt$'
echo x > $d/b; bzip2 $d/b; ls $d | grep '^b'; stat -c %a $d/b.bz2
python3 -c 'import ctypes, os, sys; p = sys.argv[1] + "/r"; open(p, "w").close(); print(ctypes.CDLL(None).remove(p.encode()), os.path.exists(p))' $d
"#;

#[test]
fn in_place_editors_modes_times_and_temp_files() {
    let f = Fixture::new();
    std::fs::create_dir(f.work().join("plain")).unwrap();
    let via = f.run(&["bash", "-c", EDIT_SCRIPT, "bash", &f.prefix()]);
    let plain = direct(&f, &["bash", "-c", EDIT_SCRIPT, "bash", "plain"]);
    assert_eq!(String::from_utf8_lossy(&plain.stdout), "echo ho\n755\nechu ho\n755\n750\n755 1577934245\n755 1577934245\n600\n700\n600\n1\nb.bz2\n644\n0 False\n");
    assert_eq!(String::from_utf8_lossy(&via.stdout), String::from_utf8_lossy(&plain.stdout), "{}", String::from_utf8_lossy(&via.stderr));
}

/// A trailing slash names a directory, as locally: `cat PREFIX/file/` is
/// ENOTDIR (it read the file: the slash was dropped), `rm PREFIX/file/`
/// too (it removed the file), and a link cannot be made at `x/`; `cp -a`
/// of a dangling link keeps it (its `lchown` followed the link: ENOENT).
#[test]
fn trailing_slashes_and_dangling_links_as_locally() {
    let f = Fixture::new();
    std::fs::create_dir(f.work().join("plain")).unwrap();
    let script = "d=$1; echo x > $d/f; mkdir $d/dd; cat $d/f/ 2>&1 | sed 's|.*: ||'; stat -c %F $d/dd/; rm $d/f/ 2>&1 | sed 's|.*: ||'; ls $d; \
                  ln -s nothing $d/dang; cp -a $d/dang $d/dang2 && readlink $d/dang2; \
                  python3 -c 'import os, sys; os.symlink(\"a\", sys.argv[1] + \"/x/\")' $d 2>&1 | tail -1 | sed 's|:.*||'";
    let via = f.run(&["bash", "-c", script, "bash", &f.prefix()]);
    let plain = direct(&f, &["bash", "-c", script, "bash", "plain"]);
    assert_eq!(String::from_utf8_lossy(&plain.stdout), "Not a directory\ndirectory\nNot a directory\ndd\nf\nnothing\nFileNotFoundError\n");
    assert_eq!(String::from_utf8_lossy(&via.stdout), String::from_utf8_lossy(&plain.stdout), "{}", String::from_utf8_lossy(&via.stderr));
}

/// A program that drops root under the interposer loses root's rights on
/// the server, as locally: the server takes a connection's identity when
/// it connects, and the connection was kept (a root-only file stayed
/// readable). Files opened before the drop stay usable, as kernel fds do.
/// Also: a forked child that closes every descriptor and then uses the
/// service (as `mpirun`'s daemon does) works; the parent's connection,
/// dropped in the child, closed the child's new socket (EIO for good).
const DROP_SCRIPT: &str = r#"
import os, sys
d = sys.argv[1]
os.stat(d + "/secret")
keep = open(d + "/pub/mine", "w")
if os.fork() == 0:
    os.closerange(3, 4096)
    open(d + "/pub/child", "w").write("child\n")
    os._exit(0)
os.wait()
print(open(d + "/pub/child").read().strip())
os.setgroups([]); os.setgid(65534); os.setuid(65534)
for what, f in [("read", lambda: open(d + "/secret").read()), ("create", lambda: open(d + "/pub/new", "w").close())]:
    try:
        f()
        print(what, "ok")
    except OSError as e:
        print(what, e.errno)
keep.write("still mine\n")
keep.close()
print(os.stat(d + "/pub/new").st_uid)
"#;

#[test]
fn a_program_that_drops_root_loses_roots_rights_on_the_server() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: nothing to drop");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let f = Fixture::new();
    std::fs::write(f.root().join("secret"), b"secret").unwrap();
    std::fs::set_permissions(f.root().join("secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::create_dir(f.root().join("pub")).unwrap();
    std::fs::set_permissions(f.root().join("pub"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::write(f.work().join("drop.py"), DROP_SCRIPT).unwrap();
    let out = f.run(&["python3", "drop.py", &f.prefix()]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "child\nread 13\ncreate ok\n65534\n", "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(read(f.root().join("pub/mine")), b"still mine\n");
}

/// Open files under a descriptor limit, as locally: the descriptors the
/// server lends for cache leases are a bounded share and given back when
/// the process runs out, so 200 service files and 40 local ones open
/// under `ulimit -n 256` (each service file held a lent descriptor too,
/// and the process ran out at about half the limit, a write then failing
/// with EMFILE); and an open that fails with EMFILE makes nothing on the
/// server (it created the file, then failed).
const LIMIT_SCRIPT: &str = r#"
import os, sys
d, w = sys.argv[1], sys.argv[2]
fs = [open("%s/many/f%04d" % (d, i), "w+") for i in range(200)]
for f in fs:
    f.write("x" * 100)
    f.flush()
ok = 0
for f in fs:
    f.seek(0)
    ok += f.read() == "x" * 100
local = [open("%s/l%d" % (w, i), "w") for i in range(40)]
print(len(fs), ok, len(local))
for f in fs + local:
    f.close()
held = []
try:
    while True:
        held.append(os.open("%s/few/g%04d" % (d, len(held)), os.O_CREAT | os.O_WRONLY))
except OSError as e:
    for fd in held:
        os.close(fd)
    print(e.errno == 24, len(os.listdir(d + "/few")) == len(held))
"#;

#[test]
fn open_files_under_a_descriptor_limit_as_locally() {
    let f = Fixture::new();
    for d in ["many", "few"] {
        std::fs::create_dir(f.root().join(d)).unwrap();
    }
    std::fs::write(f.work().join("limit.py"), LIMIT_SCRIPT).unwrap();
    let w = f.work();
    let script = format!("ulimit -n 256; python3 limit.py {} {}", f.prefix(), w.display());
    let out = f.run(&["bash", "-c", &script]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200 200 40\nTrue True\n", "{}", String::from_utf8_lossy(&out.stderr));
}

/// Found by a review of the interposer's new code: a child forked while
/// another thread changed the cwd hung in `execve` (the cwd's lock was not
/// held across `fork`); a writer sharing an fd with a stopped process
/// waited for as long as it stayed stopped (a lock held across the round
/// trip; writes now take their range with one `lseek` of the shared
/// offset); `chdir("..")` from the prefix's root stayed at the root
/// (and `open("../x")` made `x` there); `freopen` of a stream of ours
/// onto a local path crashed in glibc.
const REVIEW_SCRIPT: &str = r#"
import ctypes, os, signal, sys, threading
d, w = sys.argv[1], sys.argv[2]
os.mkdir(d + "/c")
stop = False
def mover():
    while not stop:
        os.chdir(d + "/c")
        os.chdir(w)
t = threading.Thread(target=mover)
t.start()
for _ in range(40):
    pid = os.fork()
    if pid == 0:
        os.execv("/bin/true", ["true"])
    os.waitpid(pid, 0)
stop = True
t.join()
print("forks done")
fd = os.open(d + "/shared.log", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
r, wp = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    os.write(fd, b"child 0\n")
    os.write(wp, b"x")
    i = 1
    while True:
        os.write(fd, b"child %d\n" % i)
        i += 1
os.close(wp)
os.read(r, 1)
os.kill(pid, signal.SIGSTOP)
os.write(fd, b"parent\n")
print("written while the other is stopped")
os.kill(pid, signal.SIGKILL)
os.waitpid(pid, 0)
os.chdir(d)
os.chdir("..")
print(os.getcwd() == os.path.dirname(d))
os.chdir(d)
try:
    open("../outside-" + str(os.getpid()), "w")
    print("made")
except OSError as e:
    print(e.errno)
os.chdir(w)
libc = ctypes.CDLL(None, use_errno=True)
libc.fopen.restype = libc.freopen.restype = ctypes.c_void_p
f = libc.fopen((d + "/shared.log").encode(), b"r")
g = libc.freopen((w + "/local.txt").encode(), b"w", ctypes.c_void_p(f))
print(g is None, ctypes.get_errno() == 95)
"#;

#[test]
fn review_fixes_fork_exec_stopped_writers_dotdot_and_freopen() {
    let f = Fixture::new();
    std::fs::write(f.work().join("review.py"), REVIEW_SCRIPT).unwrap();
    let w = f.work();
    let out = f.run(&["python3", "review.py", &f.prefix(), w.to_str().unwrap()]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "forks done\nwritten while the other is stopped\nTrue\n2\nTrue True\n", "{}", String::from_utf8_lossy(&out.stderr));
    let log = std::fs::read_to_string(f.root().join("shared.log")).unwrap();
    assert!(log.contains("parent\n") && log.starts_with("child 0\n"), "{log}");
    assert!(std::fs::read_dir(f.root()).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().starts_with("outside-")));
}

/// Threads sharing one fd: each `write` takes the position, writes there
/// and moves it, as one step (four threads landed 14,464 of 19,200 bytes,
/// two writes at one position, before).
const THREADS_SCRIPT: &str = r#"
import os, sys, threading
d = sys.argv[1]
fd = os.open(d + "/threads.log", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
def writer(k):
    for i in range(300):
        os.write(fd, b"%d:%011d\n" % (k, i))
ts = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
os.close(fd)
lines = open(d + "/threads.log", "rb").read().splitlines()
print(len(lines), len(set(lines)), all(len(l) == 13 for l in lines))
"#;

#[test]
fn threads_writing_through_one_fd_lose_nothing() {
    let f = Fixture::new();
    std::fs::write(f.work().join("th.py"), THREADS_SCRIPT).unwrap();
    let out = f.run(&["python3", "th.py", &f.prefix()]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1200 1200 True\n", "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::metadata(f.root().join("threads.log")).unwrap().len(), 1200 * 14);
}

/// What a process creates on the server gets its umask, as a local file
/// does (0644 and 0755 came out world-readable under `umask 077`).
#[test]
fn files_and_directories_made_on_the_server_get_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let f = Fixture::new();
    let script = format!("umask 077; echo x > {0}/private; mkdir {0}/pdir; umask 002; echo y > {0}/shared; mkdir {0}/sdir", f.prefix());
    f.run(&["sh", "-c", &script]);
    let mode = |name: &str| std::fs::metadata(f.root().join(name)).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode("private"), mode("pdir")), (0o600, 0o700));
    assert_eq!((mode("shared"), mode("sdir")), (0o664, 0o775));
}

/// A program built with `_FORTIFY_SOURCE`: where the buffer's size is
/// known, `read` and `pread` are glibc's `__read_chk` and `__pread_chk`.
const FORTIFIED_C: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {
    char buf[64];
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) { perror("open"); return 1; }
    size_t n = (size_t)atoi(argv[2]);
    ssize_t r = read(fd, buf, n);
    ssize_t p = pread(fd, buf + 32, n / 2, 0);
    printf("%zd %.*s|%zd %.*s\n", r, (int)(r > 0 ? r : 0), buf, p, (int)(p > 0 ? p : 0), buf + 32);
    return 0;
}
"#;

#[test]
fn a_fortified_program_reads_service_files() {
    let f = Fixture::new();
    std::fs::write(f.work().join("fort.c"), FORTIFIED_C).unwrap();
    let cc = Command::new("cc").args(["-O2", "-D_FORTIFY_SOURCE=2", "-o", "fort", "fort.c"]).current_dir(f.work()).output().unwrap();
    assert!(cc.status.success(), "{}", String::from_utf8_lossy(&cc.stderr));
    let nm = Command::new("nm").args(["-D", "fort"]).current_dir(f.work()).output().unwrap();
    let symbols = String::from_utf8_lossy(&nm.stdout);
    assert!(symbols.contains("__read_chk") && symbols.contains("__pread_chk"), "the build is fortified: {symbols}");
    std::fs::write(f.root().join("fort.txt"), b"hello world").unwrap();
    std::fs::write(f.work().join("fort.txt"), b"hello world").unwrap();
    let via = f.run(&["./fort", &f.svc("fort.txt"), "20"]).stdout;
    let plain = direct(&f, &["./fort", "fort.txt", "20"]).stdout;
    assert_eq!(String::from_utf8_lossy(&plain), "11 hello world|10 hello worl\n");
    assert_eq!(String::from_utf8_lossy(&via), String::from_utf8_lossy(&plain));
}

/// `mv` (which calls `renameat2` with `RENAME_NOREPLACE` first) on service
/// paths: into a directory, to a new name, `-n` over an existing file, and
/// to `name/` where no such directory exists (ENOTDIR, nothing moved).
#[test]
fn mv_moves_service_files_like_local_ones() {
    let f = Fixture::new();
    std::fs::create_dir(f.root().join("d")).unwrap();
    for (name, body) in [("a", "A"), ("b", "B"), ("c", "C")] {
        std::fs::write(f.root().join(name), body).unwrap();
    }
    let p = f.prefix();
    f.run(&["sh", "-c", &format!("mv {p}/a {p}/d/ && mv {p}/b {p}/d/b2 && mv -n {p}/c {p}/d/b2")]);
    assert_eq!(std::fs::read_to_string(f.root().join("d/a")).unwrap(), "A");
    assert_eq!(std::fs::read_to_string(f.root().join("d/b2")).unwrap(), "B", "mv -n keeps the target");
    assert_eq!(std::fs::read_to_string(f.root().join("c")).unwrap(), "C");
    let out = f.run_at(f.server.addr(), &["mv", &format!("{p}/c"), &format!("{p}/nodir/")], b"");
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Not a directory"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(f.root().join("c").exists() && !f.root().join("nodir").exists());
}

/// Programs that read stdin and write stdout/stderr through stdio (not
/// plain read/write) with those streams redirected to service files by
/// the shell: the streams they inherit must reach the server.
#[test]
fn stdio_programs_with_standard_streams_redirected_to_service_files() {
    let f = Fixture::new();
    let data = bytes(3 << 20, 9);
    std::fs::write(f.root().join("a"), &data).unwrap();
    std::fs::write(f.root().join("words"), b"pear\napple\nfig\n").unwrap();
    let p = f.prefix();
    let script = format!("sha256sum < {p}/a > {p}/sum && sort < {p}/words > {p}/sorted && ls {p}/missing 2> {p}/err; cat {p}/sum {p}/sorted");
    let out = f.run_at(f.server.addr(), &["sh", "-c", &script], b"");
    let plain = direct(&f, &["sha256sum", f.root().join("a").to_str().unwrap()]).stdout;
    let sum = String::from_utf8_lossy(&plain).split_whitespace().next().unwrap().to_string();
    assert_eq!(String::from_utf8_lossy(&read(f.root().join("sum"))).trim(), format!("{sum}  -"), "stdin read with fread, stdout written with printf");
    assert_eq!(read(f.root().join("sorted")), b"apple\nfig\npear\n");
    assert!(String::from_utf8_lossy(&read(f.root().join("err"))).contains("missing"), "stderr reaches the server");
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{sum}  -\napple\nfig\npear\n"));
}

#[test]
fn paths_outside_the_prefix_never_reach_the_server() {
    let f = Fixture::new();
    let data = bytes(100_000, 6);
    std::fs::write(f.work().join("l.bin"), &data).unwrap();
    f.run(&["cp", "l.bin", "l2.bin"]);
    f.run(&["sh", "-c", "cat l2.bin > l3.bin; ls -l > /dev/null; stat l3.bin > /dev/null"]);
    assert!(read(f.work().join("l3.bin")) == data);
    assert_eq!(f.server.connections(), 0);
    assert!(f.server.stats().iter().all(|a| a.requests == 0), "{:?}", f.server.stats());
    assert!(std::fs::read_dir(f.root()).unwrap().next().is_none(), "nothing was created on the server");
}

#[test]
fn a_missing_server_fails_fast_with_one_clear_line() {
    let f = Fixture::new();
    let addr = format!("unix:{}", f.dir.path().join("nobody.sock").display());
    let t = Instant::now();
    let out = f.run_at(&addr, &["cat", &f.svc("a")], b"");
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("sluice: cannot reach server at {addr}")), "{err}");
    assert!(err.contains("Connection refused"), "{err}");
}

const KILLED_SCRIPT: &str = r#"
import os, sys
fd = os.open(sys.argv[1] + "/a", os.O_RDONLY)
os.lseek(fd, 1, os.SEEK_SET)
print("ready", flush=True)
sys.stdin.readline()
try:
    print("read", os.read(fd, 4096).decode(), flush=True)
except OSError as e:
    print("error", e.errno, flush=True)
"#;

/// Start `python3 k.py PREFIX` under `sluice run` with `flags`, wait for
/// its "ready", let `between` act on the server, then release it: its
/// one line of verdict, and how long that took.
fn held_fd_across(f: &mut Fixture, flags: &[&str], between: impl FnOnce(&mut Fixture)) -> (String, Duration) {
    std::fs::write(f.root().join("a"), b"data").unwrap();
    std::fs::write(f.work().join("k.py"), KILLED_SCRIPT).unwrap();
    let mut c = Command::new("timeout");
    c.arg(COMMAND_TIMEOUT_S.to_string()).arg(SLUICE).args(["run", "--server", f.server.addr(), "--prefix", &f.prefix()]).args(flags).args(["--", "python3", "k.py", &f.prefix()]);
    let mut child = c.env("SLUICE_PRELOAD", preload_library()).current_dir(f.work()).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    between(f);
    let t = Instant::now();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert!(child.wait().unwrap().success());
    (line, t.elapsed())
}

#[test]
fn a_server_that_goes_away_gives_a_soft_client_etimedout_not_a_hang() {
    let mut f = Fixture::new();
    let (line, took) = held_fd_across(&mut f, &["--soft", "--timeout", "1"], |f| drop(f.server.shutdown().unwrap()));
    assert_eq!(line, format!("error {}\n", libc::ETIMEDOUT));
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

/// Regression: a process running when the server restarted got EIO forever.
#[test]
fn a_held_fd_survives_a_server_restart() {
    let mut f = Fixture::new();
    let (line, _) = held_fd_across(&mut f, &[], |f| {
        f.server.shutdown().unwrap();
        f.server = Server::start(ServerConfig::new(f.root(), Listen::Unix(f.dir.path().join("s.sock")))).unwrap();
    });
    assert_eq!(line, "read ata\n", "reopened by path, at the same offset");
}

/// fio's verdict on one terse line: (errors, KiB read, KiB written).
fn fio_terse(out: &Output) -> (u64, u64, u64) {
    let text = String::from_utf8_lossy(&out.stdout);
    let f: Vec<&str> = text.lines().find(|l| l.starts_with("3;")).expect("a terse fio line").split(';').collect();
    (f[4].parse().unwrap(), f[5].parse().unwrap(), f[46].parse().unwrap())
}

/// fio, 4 psync jobs, write then read back with crc32c verification,
/// buffered and O_DIRECT, through `sluice run` (the interposer's fio acceptance test). Its
/// `mkdir -p` of the directory also checks that the prefix itself answers
/// EEXIST like an existing directory.
#[test]
fn fio_psync_four_jobs_verify_through_sluice_run() {
    assert!(Command::new("fio").arg("--version").output().is_ok_and(|o| o.status.success()), "fio is missing: `make test` installs it");
    let f = Fixture::new();
    for direct in ["0", "1"] {
        for rw in ["write", "read"] {
            let dir = format!("--directory={}", f.prefix());
            let args = ["fio", "--name=v", &dir, "--ioengine=psync", "--numjobs=4", &format!("--rw={rw}"), "--bs=64k", "--size=4M"];
            let tail = ["--verify=crc32c", "--do_verify=1", "--verify_state_save=0", &format!("--direct={direct}"), "--group_reporting", "--output-format=terse"];
            let out = f.run(&[&args[..], &tail[..]].concat());
            let (errors, read_kib, write_kib) = fio_terse(&out);
            assert_eq!(errors, 0, "fio {rw} direct={direct} reported errors");
            assert_eq!(read_kib, 16 * 1024, "fio {rw} direct={direct} read (verification included)");
            assert_eq!(write_kib, if rw == "write" { 16 * 1024 } else { 0 }, "fio {rw} direct={direct} wrote");
        }
    }
    for j in 0..4 {
        assert_eq!(std::fs::metadata(f.root().join(format!("v.{j}.0"))).unwrap().len(), 4 << 20, "job {j}'s file on the backing directory");
    }
}

/// A 4-rank MPI-IO program (mpi4py, OpenMPI's default I/O component):
/// strided file view, collective write and read, through `sluice run`; the
/// backing file must equal the same program's output on a local file.
#[test]
fn mpi_io_collective_four_ranks_through_sluice_run() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/mpi/collective.py");
    let f = Fixture::new();
    let mpi = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4", "/usr/bin/python3", script];
    let local = f.work().join("local.dat");
    let out = direct(&f, &[&mpi[..], &[local.to_str().unwrap()]].concat());
    assert!(String::from_utf8_lossy(&out.stdout).contains("OK 1048576"));
    let out = f.run(&[&mpi[..], &[f.svc("m.dat").as_str()]].concat());
    assert!(String::from_utf8_lossy(&out.stdout).contains("OK 1048576"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(read(f.root().join("m.dat")), read(&local));
}

/// `statvfs`, `fstatvfs` and `df` of service paths give the served file
/// system's figures (the interposer answered EINVAL, and an MPI program
/// warned at every start). Free counts move while other tests write, so
/// they are compared within 1%; sizes and limits exactly.
#[test]
fn statfs_of_service_paths_gives_the_served_file_systems_figures() {
    let f = Fixture::new();
    std::fs::write(f.root().join("a"), b"x").unwrap();
    let py =
        "import os, sys\nfor s in (os.statvfs(sys.argv[1]), os.fstatvfs(os.open(sys.argv[2], os.O_RDONLY))):\n    print(s.f_frsize, s.f_blocks, s.f_bfree, s.f_files, s.f_namemax)";
    let via = String::from_utf8(f.run(&["python3", "-c", py, &f.prefix(), &f.svc("a")]).stdout).unwrap();
    let plain = String::from_utf8(direct(&f, &["python3", "-c", py, f.root().to_str().unwrap(), f.root().join("a").to_str().unwrap()]).stdout).unwrap();
    common::same_statfs(&via, &plain);
    let df = f.run(&["df", "-k", &f.prefix()]);
    assert!(String::from_utf8_lossy(&df.stdout).lines().count() == 2, "df of the prefix: {}", String::from_utf8_lossy(&df.stdout));
}
