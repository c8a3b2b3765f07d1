//! One test per shipped scenario, each asserting the physically expected
//! direction (never the seed's numbers), on a scaled-down copy.

mod common;

use common::{check, makespan, shipped};

#[test]
fn mix10_aioli_makespan_lower_and_no_application_slower() {
    let sc = shipped("mix10");
    let r = check(&sc, 1.0 / 32.0, &["fifo", "aioli"]);
    let (fifo, aioli) = (r.run("fifo", None).unwrap(), r.run("aioli", None).unwrap());
    assert!(aioli.makespan_s * 2.0 < fifo.makespan_s, "makespan aioli {} vs fifo {}", aioli.makespan_s, fifo.makespan_s);
    for (f, a) in fifo.apps.iter().zip(&aioli.apps) {
        assert!(a.completion_s <= f.completion_s * 1.05, "{}: aioli {} s, fifo {} s", a.name, a.completion_s, f.completion_s);
    }
    // The synchronous 4 KiB reader gets its dedicated windows.
    let cat = "read sequential. - 32MB (1 node, granularity=4KB)";
    assert!(aioli.app(cat).unwrap().completion_s * 5.0 < fifo.app(cat).unwrap().completion_s);
    // Aggregation is what the gain is made of.
    assert!(aioli.device_stats.requests_per_dispatch > 4.0 * fifo.device_stats.requests_per_dispatch);
    assert!(aioli.device_stats.seeks_far < fifo.device_stats.seeks_far);
}

#[test]
fn mix10_mpiio_aioli_lower_makespan_and_collective_buffering_loads_the_nfs_server() {
    let scale = 1.0 / 32.0;
    let mpi = check(&shipped("mix10-mpiio"), scale, &["fifo", "aioli"]);
    let posix = check(&shipped("mix10"), scale, &["fifo"]);
    assert!(makespan(&mpi, "aioli", None) * 2.0 < makespan(&mpi, "fifo", None));
    // One aggregator per node, each streaming 16 MiB buffers: on the
    // unscheduled server the decompositions get slower than with POSIX
    // (the seed's NFS columns: 490 s POSIX, 840 s MPI IO).
    let read = "read decompos. - 2GB (32 nodes, granularity=128KB)";
    let (p, m) = (posix.runs[0].app(read).unwrap().completion_s, mpi.run("fifo", None).unwrap().app(read).unwrap().completion_s);
    assert!(m > p, "MPI-IO {m} s, POSIX {p} s");
}

#[test]
fn bench_10k_completes_with_memory_bounded_by_what_is_in_flight() {
    let r = check(&shipped("bench-10k"), 1.0 / 200.0, &["fifo", "aioli"]);
    for run in &r.runs {
        assert_eq!(run.apps.iter().map(|a| a.procs).sum::<u64>(), 10_000);
        assert!(run.pieces_peak <= 10_000 * 16 && run.messages_peak <= 10_000 * 16, "{}", run.mode);
        assert!(run.makespan_s > 0.0 && run.events > 10_000);
    }
}

#[test]
fn decomposition_small_granularity_aioli_many_times_faster() {
    let mut sc = shipped("decomposition");
    sc.sweep_granularity_bytes = vec![8 << 10, 16 << 10, 32 << 10, 4 << 20];
    let r = check(&sc, 1.0 / 32.0, &["fifo", "aioli"]);
    for g in [8 << 10, 16 << 10, 32 << 10] {
        let (f, a) = (makespan(&r, "fifo", Some(g)), makespan(&r, "aioli", Some(g)));
        assert!(a * 3.0 < f, "at {g} B: aioli {a} s, fifo {f} s");
    }
    // With 4 MiB requests there is little left to aggregate: no harm done.
    let (f, a) = (makespan(&r, "fifo", Some(4 << 20)), makespan(&r, "aioli", Some(4 << 20)));
    assert!(a <= f * 1.1, "at 4 MiB: aioli {a} s, fifo {f} s");
    // The unscheduled server gets slower as the granularity shrinks.
    assert!(makespan(&r, "fifo", Some(8 << 10)) > makespan(&r, "fifo", Some(32 << 10)));
}

#[test]
fn decomposition_cat_the_cat_is_shielded_by_aioli() {
    let mut sc = shipped("decomposition-cat");
    sc.sweep_granularity_bytes = vec![8 << 10, 128 << 10];
    let r = check(&sc, 1.0 / 32.0, &["fifo", "aioli"]);
    let cat = "cat 16MB (1 node, granularity=32KB)";
    for g in [8 << 10, 128 << 10] {
        let (f, a) = (r.run("fifo", Some(g)).unwrap(), r.run("aioli", Some(g)).unwrap());
        let (fc, ac) = (f.app(cat).unwrap().completion_s, a.app(cat).unwrap().completion_s);
        assert!(ac * 5.0 < fc, "at {g} B the cat takes {ac} s under aioli, {fc} s under fifo");
        assert!(a.makespan_s < f.makespan_s);
    }
}

#[test]
fn piosimhd_aggregation_and_server_directed_not_slower_than_no_cache() {
    let sc = shipped("piosimhd-strided");
    let r = check(&sc, 1.0 / 16.0, &["fifo", "fifo/aggregation", "aioli/aggregation"]);
    let small = Some(5 << 10);
    let (none, agg, directed) = (makespan(&r, "fifo", small), makespan(&r, "fifo/aggregation", small), makespan(&r, "aioli/aggregation", small));
    assert!(agg < none, "5 KiB: aggregation {agg} s, no cache {none} s");
    assert!(directed <= agg * 1.05, "5 KiB: server-directed {directed} s, aggregation {agg} s");
    let hits = r.run("fifo/aggregation", small).unwrap().device_stats.cache_hits;
    assert!(hits > 0, "5 KiB blocks share 64 KiB cache blocks");
    let big = Some(512 << 10);
    assert!(makespan(&r, "aioli/aggregation", big) <= makespan(&r, "fifo", big) * 1.05);
    // 10 disks of 50 MB/s: nothing reads faster than 500 MB/s.
    for run in &r.runs {
        assert!(run.apps[0].bytes as f64 / run.makespan_s < 500e6, "{} beat the disks", run.mode);
    }
}

#[test]
fn piosim_list_calls_and_more_clients_keep_the_seeds_ratios() {
    let small = Some(5 << 10);
    let one = check(&shipped("piosimhd-strided"), 1.0 / 16.0, &["fifo"]);
    let list = check(&shipped("piosim-100-blocks"), 1.0 / 16.0, &["fifo", "fifo/aggregation"]);
    // The seed: 100 blocks per call read 15x faster than one (15 vs 1 MB/s).
    let (single, listed) = (makespan(&one, "fifo", small), makespan(&list, "fifo/aggregation", small));
    assert!(single > 5.0 * listed, "5 KiB: one block {single} s, 100 blocks aggregated {listed} s");
    // The pieces of a list call go out together: faster than one by one
    // even without a cache.
    assert!(makespan(&list, "fifo", small) < single);
    let many = check(&shipped("piosim-100-clients"), 1.0 / 16.0, &["fifo", "fifo/aggregation"]);
    // The seed: server-directed 4.4 against 0.9 MB/s without a cache.
    let (none, agg) = (makespan(&many, "fifo", None), makespan(&many, "fifo/aggregation", None));
    assert!(none > 3.0 * agg, "100 clients: no cache {none} s, aggregation {agg} s");
    let two = check(&shipped("piosim-two-phase"), 1.0 / 16.0, &["fifo"]);
    for r in [&one, &list, &many, &two] {
        for run in &r.runs {
            assert!(run.apps[0].bytes as f64 / run.makespan_s < 500e6, "{}: {} beat the disks", r.scenario, run.mode);
        }
    }
}

#[test]
fn every_shipped_scenario_parses_and_names_known_modes() {
    let dir = format!("{}/../../scenarios", env!("CARGO_MANIFEST_DIR"));
    let mut names: Vec<String> = std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()?.file_name().into_string().ok()?.strip_suffix(".toml").map(String::from)).collect();
    names.sort();
    assert!(names.len() >= 11 && names.iter().any(|n| n == "piosim-100-clients"), "{names:?}");
    for name in &names {
        let sc = shipped(name);
        for m in &sc.modes {
            sluice_sim::Mode::parse(m).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}

#[test]
fn array_strategies_four_servers_share_the_collectives_work() {
    // `sluice bench array` simulated: two-phase and server-directed
    // spread every round over the servers, so four servers finish in well
    // under half the time of one (the device is the bound here).
    let scale = 1.0 / 16.0;
    let (one, four) = (check(&shipped("array-strategies"), scale, &["aioli"]), check(&shipped("array-strategies-4"), scale, &["aioli"]));
    for name in ["two-phase write", "two-phase read", "server-directed write", "server-directed read"] {
        let (a, b) = (one.runs[0].app(name).unwrap().completion_s, four.runs[0].app(name).unwrap().completion_s);
        assert!(b * 2.0 < a, "{name}: 4 servers {b} s, 1 server {a} s");
    }
    // The applications start 30 s apart and each is alone.
    assert!(one.runs[0].apps.iter().all(|a| a.completion_s < 30.0), "{:?}", one.runs[0].apps);
}

#[test]
fn collectives_at_scale_have_the_shapes_of_the_seeds_curves() {
    // 1,024 ranks, a strided shared file striped over 4 and 64 disks: a
    // collective that orders each server's share (server-directed) is
    // never slower than ROMIO's two-phase with stripe-unaware file
    // domains, and under fifo independent list I/O pays a seek a piece.
    // At full size (4 GiB, 64 rounds of 64 MiB; about 0.2 s a scenario):
    // at an eighth the two-phase gap is gone under aioli.
    let scale = 1.0;
    for n in [4, 64] {
        let r = check(&shipped(&format!("collective-scale-{n}")), scale, &["fifo", "aioli"]);
        let t = |mode: &str, app: &str| r.runs.iter().find(|x| x.mode == mode).unwrap().app(app).unwrap().completion_s;
        for op in ["write", "read"] {
            let two = t("aioli", &format!("two-phase (ROMIO, 64 aggregators, even file domains) {op}"));
            let sd = t("aioli", &format!("server-directed (one group per server and round) {op}"));
            let ind = t("aioli", &format!("independent (each rank's list I/O) {op}"));
            assert!(sd <= two && ind <= two * 1.05, "{n} servers, {op}: server-directed {sd} s, independent {ind} s, two-phase {two} s");
            let ind_fifo = t("fifo", &format!("independent (each rank's list I/O) {op}"));
            assert!(ind_fifo > 5.0 * ind, "{n} servers, {op}: independent under fifo {ind_fifo} s, under aioli {ind} s");
        }
    }
}
