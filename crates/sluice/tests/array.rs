//! `sluice array` end to end: distributed arrays written and
//! read collectively as Zarr v3 through a real server and a real
//! three-server cluster, every element checked, the fixed-offset layout
//! checked on disk, and bad input refused with a clear message.

mod common;

use common::{Cluster, MetricsServe};

fn ok(r: (bool, String, String)) -> String {
    assert!(r.0, "stdout: {}\nstderr: {}", r.1, r.2);
    r.1
}

fn fails(r: (bool, String, String), why: &str) {
    assert!(!r.0, "expected a failure ({why}), got: {}", r.1);
    assert!(r.2.contains(why), "stderr {:?} does not say {why:?}", r.2);
}

#[test]
fn array_round_trips_on_one_server_for_every_distribution() {
    let s = MetricsServe::start();
    let out = ok(s.sluice(&["array", "write", ":run/t0/temp", "--shape", "12,10,6", "--chunks", "4,5,6", "--grid", "2,2,1", "--dims", "z,y,x"]));
    assert!(out.contains("4 ranks, grid [2, 2, 1], (BLOCK, BLOCK, *); 6 files"), "{out}");
    // CYCLIC(2) x BLOCK into shards by aggregators.
    ok(s.sluice(&[
        "array",
        "write",
        ":run/t0/dens",
        "--shape",
        "12,10,6",
        "--chunks",
        "2,5,3",
        "--shards",
        "4,10,6",
        "--grid",
        "2,1,3",
        "--dist",
        "cyclic(2),*,block",
        "--strategy",
        "two-phase",
    ]));
    // Edge chunks and shards: 10 is not a multiple of 4 or 8.
    ok(s.sluice(&["array", "write", ":run/t0/edge", "--shape", "10,3", "--chunks", "4,2", "--shards", "8,2", "--ranks", "3", "--dtype", "int16"]));
    for (a, dist) in [(":run/t0/temp", "cyclic,*,*"), (":run/t0/dens", "cyclic,*,*"), (":run/t0/edge", "cyclic,*")] {
        let v = ok(s.sluice(&["array", "verify", a]));
        assert!(v.contains("every element matches"), "{v}");
        // Read back with another distribution, by both strategies.
        for strategy in ["independent", "two-phase", "server-directed"] {
            let r = ok(s.sluice(&["array", "read", a, "--ranks", "3", "--dist", dist, "--strategy", strategy]));
            assert!(r.contains("every rank's data matches"), "{r}");
        }
    }
    // The two unsharded arrays hold the same pattern: same checksum.
    let crc = |a: &str| ok(s.sluice(&["array", "verify", a])).split("crc32c ").nth(1).unwrap().split_whitespace().next().unwrap().to_string();
    assert_eq!(crc(":run/t0/temp"), crc(":run/t0/dens"));
    // The fixed-offset layout on disk: a chunk file is the whole chunk; a
    // shard is its chunks then a 16-byte entry per chunk and a CRC32C.
    let root = s.root();
    assert_eq!(std::fs::metadata(root.join("run/t0/temp/c/2/1/0")).unwrap().len(), 4 * 5 * 6 * 8);
    assert_eq!(std::fs::metadata(root.join("run/t0/dens/c/0/0/0")).unwrap().len(), 2 * 2 * 2 * (2 * 5 * 3 * 8) + 8 * 16 + 4);
    assert!(root.join("run/zarr.json").exists() && root.join("run/t0/zarr.json").exists(), "groups above the array get metadata");
    let info = ok(s.sluice(&["array", "info", ":run/t0/dens"]));
    for want in ["shape        [12, 10, 6]", "sharding_indexed", "fixed offsets: chunks [2, 5, 3]", "shards [4, 10, 6]"] {
        assert!(info.contains(want), "{want:?} missing from:\n{info}");
    }
    let ls = ok(s.sluice(&["array", "ls", ":run/t0"]));
    assert!(ls.contains("temp") && ls.contains("[12,10,6] float64") && ls.contains("edge"), "{ls}");
    assert_eq!(ok(s.sluice(&["array", "cat", ":run/t0/edge", "--region", "9,:"])).trim(), "27 28 29");
    assert_eq!(ok(s.sluice(&["array", "cat", ":run/t0/temp", "--region", "11,9,4:"])).trim(), "718 719");
    // --strategy auto: the cost model is measured against the server, says
    // what it predicts and what it took, and leaves no scratch file.
    let out = ok(s.sluice(&["array", "write", ":run/t1/auto", "--shape", "24,10,6", "--chunks", "6,10,6", "--grid", "2,2,1", "--strategy", "auto"]));
    let line = out.lines().find(|l| l.starts_with("strategy auto: ")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("predicted: independent") && line.contains("two-phase") && line.contains("server-directed"), "{line}");
    let chosen = line["strategy auto: ".len()..].split(' ').next().unwrap();
    assert!(out.contains(&format!("write ({chosen})")), "{out}");
    assert!(ok(s.sluice(&["array", "verify", ":run/t1/auto"])).contains("every element matches"));
    let left: Vec<String> = std::fs::read_dir(root.join("run/t1")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(left.len(), 2, "only auto/ and zarr.json: {left:?}");
}

#[test]
fn array_collective_write_and_read_through_a_three_server_cluster() {
    let dir = tempfile::Builder::new().prefix("sluice-array-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let c = Cluster::start(dir.path(), 3);
    for (name, strategy) in [("a", "independent"), ("b", "two-phase"), ("c", "server-directed")] {
        let path = format!(":ts/{name}");
        let out = ok(c.sluice(&["array", "write", &path, "--shape", "24,16,8", "--chunks", "4,8,8", "--shards", "8,16,8", "--grid", "2,2,1", "--strategy", strategy]));
        assert!(out.contains("3 files") && out.contains("placement by Hungarian"), "{out}");
        let r = ok(c.sluice(&["array", "read", &path, "--grid", "4,1,1", "--strategy", strategy]));
        assert!(r.contains("every rank's data matches"), "{r}");
        assert!(ok(c.sluice(&["array", "verify", &path])).contains("every element matches"));
        // One shard per server: placement gives each a third of the bytes.
        let info = ok(c.sluice(&["array", "info", &path]));
        let placement = info.lines().find(|l| l.starts_with("placement")).unwrap_or_else(|| panic!("{info}"));
        assert_eq!(placement.matches("(33%)").count(), 3, "{placement}");
    }
}

#[test]
fn array_bad_input_gets_a_clear_error() {
    let s = MetricsServe::start();
    fails(s.sluice(&["array", "verify", ":nothing"]), "no zarr.json");
    fails(s.sluice(&["array", "write", ":../x", "--shape", "4"]), "escapes the server root");
    fails(s.sluice(&["array", "write", ":x", "--shape", "4,4", "--grid", "2,2", "--dist", "block,*"]), "not distributed");
    fails(s.sluice(&["array", "write", ":x", "--shape", "4", "--dist", "cyclic(0)"]), "not a distribution");
    fails(s.sluice(&["array", "write", ":x", "--shape", "4", "--chunks", "3", "--shards", "4"]), "multiple of the chunk");
    fails(s.sluice(&["array", "write", ":x", "--shape", "4", "--strategy", "magic"]), "not a strategy");
    ok(s.sluice(&["array", "write", ":big", "--shape", "400,400", "--chunks", "100,100", "--dtype", "uint8"]));
    fails(s.sluice(&["array", "cat", ":big"]), "narrow it with --region");
    fails(s.sluice(&["array", "cat", ":big", "--region", "0:401,:"]), "outside 0..400");
    // A file of the array cut short: the collective read says so.
    std::fs::OpenOptions::new().write(true).open(s.root().join("big/c/3/3")).unwrap().set_len(100).unwrap();
    fails(s.sluice(&["array", "read", ":big", "--strategy", "two-phase"]), "is short");
}

#[test]
fn bench_array_runs_every_strategy_and_reports_the_models_choice() {
    let (out, v) = common::bench_json(&["array", "--scale", "0.002", "--ranks", "4", "--servers", "1,2"], "array.json");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 6, "{out}");
    for r in rows {
        assert!(r["write_s"].as_f64().unwrap() > 0.0 && r["read_s"].as_f64().unwrap() > 0.0 && r["predicted_s"].as_f64().unwrap() > 0.0, "{r}");
    }
    // Server-directed joins every rank's pieces of a shard: far more
    // requests per dispatch than independent list I/O gets.
    let rpd = |s: &str| rows.iter().find(|r| r["strategy"] == s && r["servers"] == 1).unwrap()["requests_per_dispatch"].as_f64().unwrap();
    assert!(rpd("server-directed") > 4.0 * rpd("independent"), "{out}");
    let model = v["model"].as_array().unwrap();
    assert_eq!(model.len(), 2);
    for m in model {
        let (chosen, fastest) = (m["chosen"].as_str().unwrap(), m["fastest_write"].as_str().unwrap());
        assert_eq!(m["chosen_was_fastest"].as_bool().unwrap(), chosen == fastest);
    }
    assert!(out.contains("the model chose"), "{out}");
}

#[test]
fn server_weights_give_shares_of_the_files() {
    // Panda's heterogeneous disks: a server with three times the weight
    // gets three times the shards; `measure` weighs them by their write
    // bandwidth first; model files by their calibrated cost.
    let dir = tempfile::Builder::new().prefix("sluice-array-w-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let c = Cluster::start(dir.path(), 2);
    ok(c.sluice(&["array", "write", ":w", "--shape", "64,8", "--chunks", "8,8", "--ranks", "4", "--server-weights", "1,3"]));
    let info = ok(c.sluice(&["array", "info", ":w"]));
    let placement = info.lines().find(|l| l.starts_with("placement")).unwrap_or_else(|| panic!("{info}"));
    assert!(placement.contains("(25%)") && placement.contains("(75%)"), "{placement}");
    let out = ok(c.sluice(&["array", "write", ":m", "--shape", "64,8", "--chunks", "8,8", "--ranks", "4", "--server-weights", "measure"]));
    assert!(out.contains("server weights (measured write bandwidth): ") && out.matches("MiB/s").count() >= 2, "{out}");
    assert!(ok(c.sluice(&["array", "verify", ":m"])).contains("every element matches"));
    // Calibrated device models (`sluice calibrate --out`), one per server:
    // a disk three times as fast per byte, with no fixed cost, gets three
    // times the shards.
    let (slow, fast) = (dir.path().join("slow.toml"), dir.path().join("fast.toml"));
    std::fs::write(&slow, "dispatch_ns = 0\nbyte_ps = 3000\nseek_ns = 0\nparallelism = 1\n").unwrap();
    std::fs::write(&fast, "dispatch_ns = 0\nbyte_ps = 1000\nseek_ns = 0\nparallelism = 1\n").unwrap();
    let models = format!("{},{}", slow.display(), fast.display());
    let out = ok(c.sluice(&["array", "write", ":c", "--shape", "64,8", "--chunks", "8,8", "--ranks", "4", "--server-weights", &models]));
    assert!(out.contains("server weights (calibrated models"), "{out}");
    let info = ok(c.sluice(&["array", "info", ":c"]));
    let placement = info.lines().find(|l| l.starts_with("placement")).unwrap_or_else(|| panic!("{info}"));
    assert!(placement.contains("(25%)") && placement.contains("(75%)"), "{placement}");
    fails(c.sluice(&["array", "write", ":x", "--shape", "8", "--server-weights", &format!("{}", slow.display())]), "1 weights for 2 data servers");
    fails(c.sluice(&["array", "write", ":x", "--shape", "8", "--server-weights", "nowhere.toml,x.toml"]), "nowhere.toml");
    fails(c.sluice(&["array", "write", ":x", "--shape", "8", "--server-weights", "1"]), "1 weights for 2 data servers");
    fails(c.sluice(&["array", "write", ":x", "--shape", "8", "--server-weights", "1,-2"]), "positive numbers");
    // The scratch files of `measure` are gone.
    let ls = ok(c.sluice(&["ls", ":"]));
    assert!(!ls.contains("weigh"), "{ls}");
}

#[test]
fn migration_moves_a_timestep_to_slower_tiers_and_reads_follow_it() {
    let s = MetricsServe::start();
    let dir = tempfile::Builder::new().prefix("sluice-tier-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let tier = Cluster::start(dir.path(), 2);
    ok(s.sluice(&["array", "write", ":run/t0/temp", "--shape", "24,16,8", "--chunks", "4,8,8", "--shards", "8,16,8", "--ranks", "4"]));
    ok(s.sluice(&["array", "write", ":run/t0/dens", "--shape", "10,3", "--chunks", "4,2", "--ranks", "2", "--dtype", "int16"]));
    let crc = |s: &MetricsServe, a: &str| {
        let v = ok(s.sluice(&["array", "verify", a]));
        assert!(v.contains("every element matches"), "{v}");
        v.split("crc32c ").nth(1).unwrap().split_whitespace().next().unwrap().to_string()
    };
    let before = (crc(&s, ":run/t0/temp"), crc(&s, ":run/t0/dens"));
    // To another directory of the same server, in the background class.
    let out = ok(s.sluice(&["array", "migrate", ":run/t0", "--to", ":slow/t0"]));
    assert!(out.contains("migrated run/t0 to :slow/t0") && out.contains("weight 0"), "{out}");
    let root = s.root();
    let left: Vec<_> = std::fs::read_dir(root.join("run/t0")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, [std::ffi::OsString::from("zarr.json")], "only the mark stays");
    assert!(std::fs::read_to_string(root.join("run/t0/zarr.json")).unwrap().contains("\"path\": \"slow/t0\""));
    assert_eq!(std::fs::metadata(root.join("slow/t0/temp/c/1/0/0")).unwrap().len(), std::fs::metadata(root.join("slow/t0/temp/c/0/0/0")).unwrap().len());
    // The old paths read the copy: same checksums, a collective read, info.
    assert_eq!((crc(&s, ":run/t0/temp"), crc(&s, ":run/t0/dens")), before);
    assert!(ok(s.sluice(&["array", "read", ":run/t0/temp", "--ranks", "3", "--dist", "cyclic,*,*"])).contains("every rank's data matches"));
    assert!(ok(s.sluice(&["array", "info", ":run/t0/temp"])).starts_with("path         slow/t0/temp"));
    // The server let the copy's requests in as background work.
    let metrics = sluice_server::metrics::get(&s.metrics, "/metrics", std::time::Duration::from_secs(10)).unwrap();
    let admitted = metrics.lines().find_map(|l| l.strip_prefix("sluice_scheduler_background_admitted_total ")).unwrap_or_else(|| panic!("{metrics}"));
    assert!(admitted.parse::<f64>().unwrap() >= 10.0, "background requests let in: {admitted}");
    // As an application of its own, so a job's own I/O keeps its class.
    assert!(metrics.lines().any(|l| l.starts_with("sluice_app_requests_total{app=\"") && l.contains("-migrate\"")), "{metrics}");
    // On to a second tier on other servers: the old path follows both marks.
    let out = ok(s.sluice(&["array", "migrate", ":slow/t0", "--to", ":tier2/t0", "--to-server", &tier.addr]));
    assert!(out.contains("source files removed"), "{out}");
    assert_eq!((crc(&s, ":run/t0/temp"), crc(&s, ":run/t0/dens")), before);
    assert!(ok(tier.sluice(&["array", "verify", ":tier2/t0/temp"])).contains("every element matches"));
    assert!(ok(s.sluice(&["array", "read", ":run/t0/dens", "--ranks", "2"])).contains("every rank's data matches"));
    // Bad input.
    fails(s.sluice(&["array", "migrate", ":slow/t0", "--to", ":elsewhere"]), "already migrated");
    fails(s.sluice(&["array", "migrate", ":nothing", "--to", ":x"]), "nothing: no zarr.json");
    ok(s.sluice(&["array", "write", ":run/t1/a", "--shape", "4", "--ranks", "1"]));
    fails(s.sluice(&["array", "migrate", ":run/t1", "--to", ":run/t1/inside"]), "overlap");
    fails(s.sluice(&["array", "migrate", ":run/t1", "--to", ":slow"]), "exists and is not empty");
    fails(s.sluice(&["array", "migrate", ":run/t1", "--to", "slow"]), "write :PATH");
    // Nothing was lost by the refusals.
    assert!(ok(s.sluice(&["array", "verify", ":run/t1/a"])).contains("every element matches"));
    // A half-written mark an earlier run left is not copied and does not
    // stop the removal.
    std::fs::write(root.join("run/t1/.zarr.json.migrating"), b"{").unwrap();
    let out = ok(s.sluice(&["array", "migrate", ":run/t1", "--to", ":slow/t1"]));
    assert!(!root.join("slow/t1/.zarr.json.migrating").exists(), "{out}");
    assert!(!root.join("run/t1/a").exists() && ok(s.sluice(&["array", "verify", ":run/t1/a"])).contains("every element matches"));
    // A removal cut short (here: --keep, then a chunk gone from the
    // source): the marked group wins over the unmarked array below it, so
    // the reader gets the copy, not the hole as fill values.
    ok(s.sluice(&["array", "write", ":run/t2/a", "--shape", "16,4", "--chunks", "4,4", "--ranks", "2"]));
    let whole = ok(s.sluice(&["array", "verify", ":run/t2/a"]));
    ok(s.sluice(&["array", "migrate", ":run/t2", "--to", ":slow/t2", "--keep"]));
    std::fs::remove_file(root.join("run/t2/a/c/1/0")).unwrap();
    assert_eq!(ok(s.sluice(&["array", "verify", ":run/t2/a"])).split("crc32c ").nth(1), whole.split("crc32c ").nth(1));
}

#[test]
fn uneven_data_gen_block_and_small_arrays_are_balanced_over_the_servers() {
    let dir = tempfile::Builder::new().prefix("sluice-amr-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let c = Cluster::start(dir.path(), 3);
    // GEN_BLOCK: rank 0 holds 20 of 24 rows, ranks 1 and 2 two each, rank 3
    // none; written and read back under another distribution.
    let out =
        ok(c.sluice(&["array", "write", ":amr/t0/rho", "--shape", "24,8", "--chunks", "4,8", "--grid", "4,1", "--dist", "gen_block(20:2:2:0),*", "--strategy", "server-directed"]));
    assert!(out.contains("GEN_BLOCK(20:2:2:0)") && out.contains("6 files"), "{out}");
    assert!(ok(c.sluice(&["array", "read", ":amr/t0/rho", "--grid", "2,1", "--dist", "gen_block(3:21),*"])).contains("every rank's data matches"));
    assert!(ok(c.sluice(&["array", "verify", ":amr/t0/rho"])).contains("every element matches"));
    let servers = |a: &str| -> Vec<u64> {
        let info = ok(c.sluice(&["array", "info", a]));
        let line = info.lines().find(|l| l.starts_with("placement")).unwrap_or_else(|| panic!("{info}")).to_string();
        line.split("server ").skip(1).map(|s| s.split(':').nth(1).unwrap().trim().split(' ').next().unwrap().parse().unwrap()).collect()
    };
    // However unevenly the ranks hold it, each server gets two of the six
    // equal files.
    let rho = servers(":amr/t0/rho");
    assert!(rho.iter().all(|&b| b == rho[0]) && rho[0] > 0, "{rho:?}");
    // Adaptive-mesh patches: one-file arrays of different sizes in one
    // group go each to the server holding least of the group so far.
    let mut held = vec![0u64; 3];
    for (i, rows) in [16u64, 2, 2, 8, 4, 2, 2].iter().enumerate() {
        let p = format!(":amr/t1/patch{i}");
        ok(c.sluice(&["array", "write", &p, "--shape", &format!("{rows},8"), "--ranks", "1"]));
        let on = servers(&p);
        assert_eq!(on.iter().filter(|&&b| b > 0).count(), 1, "one file, one server: {on:?}");
        let s = on.iter().position(|&b| b > 0).unwrap();
        let least = *held.iter().min().unwrap();
        assert_eq!(held[s], least, "patch {i} went to server {s} holding {held:?}");
        held[s] += on[s];
    }
    let (lo, hi) = (*held.iter().min().unwrap(), *held.iter().max().unwrap());
    assert!(hi == held[0] && lo * 2 >= hi, "the largest patch's server gets little else: {held:?}");
}

#[test]
fn a_migration_whose_tier_dies_leaves_the_source_whole() {
    use std::process::{Command, Stdio};
    let s = MetricsServe::start();
    ok(s.sluice(&["array", "write", ":run/t5/temp", "--shape", "1024,1024,4", "--chunks", "32,1024,4", "--ranks", "4"]));
    let crc = || ok(s.sluice(&["array", "verify", ":run/t5/temp"])).split("crc32c ").nth(1).unwrap().split_whitespace().next().unwrap().to_string();
    let before = crc();
    // The slower tier: a server on the emulated disk (32 MiB take it over
    // a second: it was at file 10 of 32 at 300 ms), killed while the copy
    // runs. The copy's client is soft, so it fails instead of waiting.
    let dir = tempfile::Builder::new().prefix("sluice-tier-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    std::fs::create_dir(dir.path().join("root")).unwrap();
    let tier_addr = format!("unix:{}", dir.path().join("t.sock").display());
    let mut tier = Command::new(common::SLUICE)
        .args(["serve", "--root", dir.path().join("root").to_str().unwrap(), "--listen", &tier_addr, "--device", "hdd7200", "--queue-depth", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    common::wait_for(|| dir.path().join("t.sock").exists(), "the tier's socket");
    let migrate = Command::new(common::SLUICE)
        .args(["array", "migrate", ":run/t5", "--to", ":t5", "--to-server", &tier_addr])
        .env("SLUICE_SERVER", &s.addr)
        .env("SLUICE_SOFT", "1")
        .env("SLUICE_TIMEOUT", "2")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    tier.kill().unwrap();
    tier.wait().unwrap();
    let out = migrate.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the migration cannot succeed without its tier: {}", String::from_utf8_lossy(&out.stdout));
    assert!(!err.is_empty() && err.lines().count() <= 2, "one clear error: {err}");
    // Nothing was switched or removed: same bytes, no mark.
    assert!(!std::fs::read_to_string(s.root().join("run/t5/zarr.json")).unwrap().contains("sluice_migrated"));
    assert_eq!(crc(), before);
    // And to a tier that stays up, it completes.
    ok(s.sluice(&["array", "migrate", ":run/t5", "--to", ":slow/t5"]));
    assert_eq!(crc(), before);
}
