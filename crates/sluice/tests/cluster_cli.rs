//! `sluice cluster`, `setstripe` and `getstripe` end to end: a real
//! cluster process on a temporary directory, a striped file written through
//! the library, its objects shown spread over the servers, and a clean
//! stop on SIGTERM. Then unmodified programs (cp, cat, dd, tar, mv, rm,
//! Python) on striped files through a real FUSE mount and through
//! `sluice run`, and `sluice cp`/`ls` against the cluster.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{bytes, ok, preload_library, same, sh, Cluster, Mount, SLUICE};
use sluice_remote::StripedClient;

#[test]
fn cluster_setstripe_getstripe_and_clean_stop() {
    let dir = tempfile::tempdir().unwrap();
    let mut cl = Cluster::start(dir.path(), 3);
    let (ok, _, err) = cl.sluice(&["setstripe", "-S", "64K", "-c", "-1", "-i", "1", "big.dat"]);
    assert!(ok, "setstripe failed: {err}");
    let (ok, _, err) = cl.sluice(&["setstripe", "-S", "1000", "bad.dat"]);
    assert!(!ok && err.contains("multiple of 512"), "{err}");
    let (ok, _, err) = cl.sluice(&["setstripe", "-c", "2", "big.dat"]);
    assert!(!ok && err.contains("exists"), "{err}");
    let c = StripedClient::connect(&cl.addr).unwrap();
    let f = c.open("big.dat", libc::O_RDWR).unwrap();
    c.pwrite(&f, &vec![9u8; 3 * 65536 + 100], 0).unwrap();
    c.close(&f).unwrap();
    let (ok, out, err) = cl.sluice(&["getstripe", "big.dat"]);
    assert!(ok, "getstripe failed: {err}");
    assert!(out.contains("lmm_stripe_count:  3") && out.contains("lmm_stripe_size:   65536") && out.contains("lmm_stripe_offset: 1"), "{out}");
    // Objects 0, 1, 2 on servers 1, 2, 0; object 0 holds the last 100 bytes.
    let rows: Vec<Vec<&str>> = out.lines().filter(|l| l.starts_with('\t') && !l.contains("obdidx")).map(|l| l.trim().split('\t').collect()).collect();
    let got: Vec<(&str, &str, &str)> = rows.iter().map(|r| (r[0], r[1], r[2])).collect();
    assert_eq!(got, vec![("1", "0", "65636"), ("2", "1", "65536"), ("0", "2", "65536")], "{out}");
    // Directory defaults.
    assert!(cl.sluice(&["setstripe", "-c", "2", ""]).0);
    let (ok, out, _) = cl.sluice(&["getstripe", ""]);
    assert!(ok && out.contains("stripe_count:  2"), "{out}");
    // SIGTERM stops every role and removes the sockets.
    let mut child = cl.child.take().unwrap();
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("sluice cluster did not stop within 10 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success());
    for s in ["meta.sock", "data-0.sock", "data-1.sock", "data-2.sock"] {
        assert!(!dir.path().join(s).exists(), "{s} left behind");
    }
}

/// `getstripe PATH`'s object rows: (server index, object size).
fn objects(cl: &Cluster, path: &str) -> Vec<(u32, u64)> {
    let (ok, out, err) = cl.sluice(&["getstripe", path]);
    assert!(ok, "getstripe {path} failed: {err}");
    let rows = out.lines().filter(|l| l.starts_with('\t') && !l.contains("obdidx"));
    rows.map(|l| {
        let f: Vec<&str> = l.trim().split('\t').collect();
        (f[0].parse().unwrap(), f[2].parse().unwrap())
    })
    .collect()
}

#[test]
fn unmodified_programs_see_one_file_through_the_mount_and_sluice_run() {
    let dir = tempfile::tempdir().unwrap();
    let (d, work) = (dir.path(), dir.path().join("work"));
    std::fs::create_dir(&work).unwrap();
    let cl = Cluster::start(&d.join("cluster"), 3);
    assert!(cl.sluice(&["setstripe", "-S", "64K", "-c", "-1", ""]).0, "root default: 64 KiB over every server");
    let src = work.join("src.bin");
    std::fs::write(&src, bytes(5_000_000, 1)).unwrap();

    // The FUSE mount.
    let m = Mount::start(&cl.addr, &d.join("mnt"));
    let mnt = m.point.display().to_string();
    ok(&format!("cp {} {mnt}/a.bin", src.display()));
    let objs = objects(&cl, "a.bin");
    assert_eq!(objs.iter().map(|o| o.0).collect::<std::collections::BTreeSet<_>>().len(), 3, "objects on all three servers: {objs:?}");
    assert!(objs.iter().all(|o| o.1 > 1_500_000), "each server holds about a third: {objs:?}");
    assert_eq!(objs.iter().map(|o| o.1).sum::<u64>(), 5_000_000);
    ok(&format!("cat {mnt}/a.bin > {0}/back.bin && cmp {1} {0}/back.bin", work.display(), src.display()));
    ok(&format!("dd if={} of={mnt}/small.bin bs=4k status=none && cmp {0} {mnt}/small.bin", src.display()));
    let stat = sh(&format!("stat -c %s {mnt}/small.bin"));
    assert_eq!(String::from_utf8_lossy(&stat.stdout).trim(), "5000000");
    ok(&format!("mkdir -p {0}/tree/a/b && echo one > {0}/tree/a/f1 && cp {1} {0}/tree/a/b/f2", work.display(), src.display()));
    ok(&format!("tar -C {0}/tree -cf {mnt}/t.tar a && mkdir {mnt}/x && tar -C {mnt}/x -xf {mnt}/t.tar && diff -r {0}/tree/a {mnt}/x/a", work.display()));
    let py = format!("f = open('{mnt}/p.txt', 'w+b'); f.write(b'hello world'); f.seek(6); assert f.read() == b'world'; f.seek(0); f.write(b'HELLO'); f.close()");
    ok(&format!("python3 -c \"{py}\""));
    ok(&format!("test \"$(cat {mnt}/p.txt)\" = 'HELLO world'"));
    ok(&format!("mv {mnt}/a.bin {mnt}/x/moved.bin && cmp {} {mnt}/x/moved.bin && rm {mnt}/p.txt", src.display()));
    let ls = sh(&format!("ls {mnt} {mnt}/x"));
    assert_eq!(
        String::from_utf8_lossy(&ls.stdout).split_whitespace().collect::<Vec<_>>(),
        [format!("{mnt}:").as_str(), "small.bin", "t.tar", "x", &format!("{mnt}/x:"), "a", "moved.bin"]
    );

    // The interposer, on the same files.
    let run = |script: &str| {
        let o = Command::new("timeout")
            .args(["30", SLUICE, "run", "--server", &cl.addr, "--prefix", "/striped", "--", "sh", "-c", script])
            .env("SLUICE_PRELOAD", preload_library())
            .current_dir(&work)
            .output()
            .unwrap();
        assert!(o.status.success(), "`{script}` under sluice run failed: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    run("cat /striped/x/moved.bin > run-back.bin && cp src.bin /striped/run.bin && mv /striped/run.bin /striped/x/run.bin");
    same(&src, &work.join("run-back.bin"));
    ok(&format!("cmp {} {mnt}/x/run.bin", src.display()));
    let sums = run("sha256sum < /striped/x/run.bin; sha256sum < src.bin");
    let sums: Vec<&str> = sums.lines().collect();
    assert_eq!(sums[0], sums[1], "the interposer reads back what it wrote");
    let py = "import os; print(os.stat('/striped/x/run.bin').st_size, sorted(os.listdir('/striped/x')))";
    assert_eq!(run(&format!("python3 -c \"{py}\"")).trim(), "5000000 ['a', 'moved.bin', 'run.bin']");
    run("rm /striped/x/run.bin");

    // sluice cp and ls.
    let (ok1, _, err) = cl.sluice(&["cp", src.to_str().unwrap(), ":c.bin"]);
    assert!(ok1, "sluice cp in: {err}");
    let (ok2, _, err) = cl.sluice(&["cp", ":c.bin", work.join("c-back.bin").to_str().unwrap()]);
    assert!(ok2, "sluice cp out: {err}");
    same(&src, &work.join("c-back.bin"));
    let (ok3, out, err) = cl.sluice(&["ls", ":"]);
    assert!(ok3, "sluice ls: {err}");
    assert_eq!(out.split_whitespace().collect::<Vec<_>>(), ["c.bin", "small.bin", "t.tar", "x/"]);
    assert!(Path::new(&mnt).join("c.bin").exists(), "the mount sees what sluice cp wrote");
}

#[test]
fn bench_scaleout_prints_a_table_and_writes_json() {
    let (out, v) = common::bench_json(&["scaleout", "--servers", "1,2", "--clients", "2", "--file", "8M", "--request", "1M", "--stripe", "256K", "--device", "real"], "so.json");
    assert!(out.contains("speed-up"));
    assert_eq!(v["config"]["file_bytes"], 8 << 20);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.iter().map(|r| r["servers"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2]);
    assert!(runs.iter().all(|r| r["mib_per_s"].as_f64().unwrap() > 0.0 && r["seconds"].as_f64().unwrap() > 0.0));
    assert_eq!(runs[0]["speedup"], 1.0);
}
