//! The engine as a whole: determinism, bounds, the device and network
//! models against hand-computed times, the software model's variants,
//! and the trace.

mod common;

use common::{check, shipped};
use sluice_sim::{App, ErrorKind, Pattern, RunOptions, Scenario};

/// One process on a network so fast it costs nothing measurable.
fn lone_reader(device: &str, bytes: u64, granularity: u64) -> Scenario {
    let text = format!(
        r#"
name = "lone"
[network]
nic_bytes_per_s = 1_000_000_000_000_000
nic_latency_ns = 0
switch_bytes_per_s = 1_000_000_000_000_000
header_bytes = 0
[cluster]
compute_nodes = 1
[server]
count = 1
device = "{device}"
stripe_bytes = 1_073_741_824
[server.hdd]
seek_far_ns = 10_000_000
seek_near_ns = 1_000_000
near_bytes = 5_000_000
rotation_ns = 0
bytes_per_s = 50_000_000
[server.profile]
access_ns = 100_000
bytes_per_s = 200_000_000
[client]
fs_piece_bytes = 0
pieces_inflight_max = 16
cb_buffer_bytes = 16_777_216
start_jitter_ns = 0
[[app]]
name = "reader"
procs = 1
op = "read"
pattern = "contiguous"
bytes = {bytes}
granularity_bytes = {granularity}
"#
    );
    Scenario::from_toml(&text).unwrap()
}

fn completion(sc: &Scenario, mode: &str) -> f64 {
    check(sc, 1.0, &[mode]).runs[0].makespan_s
}

#[test]
fn hdd7200_service_times_as_the_sim_charges_them() {
    // Two 1 MiB reads: a far seek + half a rotation + transfer, then a
    // transfer only: 9 + 4.17 + 2 x 10.48576 ms.
    let t = completion(&lone_reader("hdd7200", 2 << 20, 1 << 20), "fifo");
    assert!((t - 0.034_141_52).abs() < 1e-6, "{t}");
    let r = check(&lone_reader("hdd7200", 2 << 20, 1 << 20), 1.0, &["fifo"]);
    let d = &r.runs[0].device_stats;
    assert_eq!((d.seeks_far, d.seeks_near, d.seeks_none, d.dispatches), (1, 0, 1, 2));
}

#[test]
fn piosimhd_disk_and_profile_service_times() {
    // PIOsimHD's disk: 10 ms average access, 50 MB/s: 10 ms + 2 x 20.97152 ms.
    let t = completion(&lone_reader("hdd", 2 << 20, 1 << 20), "fifo");
    assert!((t - 0.051_943_04).abs() < 1e-6, "{t}");
    // A measured profile: 100 us per access, 200 MB/s, four 512 KiB reads.
    let t = completion(&lone_reader("profile", 2 << 20, 512 << 10), "fifo");
    assert!((t - (4.0 * 100e-6 + 4.0 * 524_288.0 / 200e6)).abs() < 1e-6, "{t}");
}

#[test]
fn same_seed_same_json_other_seed_other_run() {
    let sc = shipped("mix10");
    let run = |seed| {
        let opts = RunOptions { modes: vec!["fifo".into(), "aioli".into()], seed: Some(seed), scale: Some(1.0 / 64.0), trace: false, jobs: 1 };
        let (r, _) = sluice_sim::run(&sc, &opts).unwrap();
        serde_json::to_string(&r.without_host_timing()).unwrap()
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}

#[test]
fn bounds_fail_with_the_seed() {
    let mut sc = shipped("mix10");
    sc.bounds.events_max = 1_000;
    let opts = RunOptions { modes: vec!["aioli".into()], seed: Some(42), scale: Some(1.0 / 64.0), trace: false, jobs: 1 };
    let e = sluice_sim::run(&sc, &opts).unwrap_err();
    assert_eq!((e.kind, e.seed), (ErrorKind::Bound, Some(42)));
    assert!(e.to_string().contains("--seed 42"), "{e}");
    // At the bound it passes: the same run needs fewer than this.
    sc.bounds.events_max = 2_000_000;
    sluice_sim::run(&sc, &opts).unwrap();
}

#[test]
fn unknown_mode_and_bad_scenarios_are_errors() {
    let sc = shipped("mix10");
    let opts = RunOptions { modes: vec!["lottery".into()], ..RunOptions::default() };
    assert_eq!(sluice_sim::run(&sc, &opts).unwrap_err().kind, ErrorKind::UnknownMode);
    let opts = RunOptions { modes: vec!["fifo/ram".into()], ..RunOptions::default() };
    assert_eq!(sluice_sim::run(&sc, &opts).unwrap_err().kind, ErrorKind::UnknownMode);
    assert_eq!(Scenario::from_toml("name = 1").unwrap_err().kind, ErrorKind::Parse);
    let mut bad = sc.clone();
    bad.apps[0].procs = 0;
    assert_eq!(bad.validate().unwrap_err().kind, ErrorKind::Invalid);
}

#[test]
fn procs_max_at_n_and_n_plus_one() {
    let mut sc = shipped("mix10");
    let others: u64 = sc.apps[1..].iter().map(|a| a.procs).sum();
    sc.apps[0].procs = sluice_sim::PROCS_MAX - others;
    sc.validate().unwrap();
    sc.apps[0].procs += 1;
    assert_eq!(sc.validate().unwrap_err().kind, ErrorKind::Invalid);
}

/// The scenario's other size bounds, each at N (valid) and N+1 (refused,
/// saying which).
#[test]
fn scenario_bounds_at_n_and_n_plus_one() {
    let base = shipped("mix10");
    let at = |edit: &dyn Fn(&mut Scenario, bool)| {
        let mut sc = base.clone();
        edit(&mut sc, false);
        sc.validate().unwrap();
        let mut sc = base.clone();
        edit(&mut sc, true);
        sc.validate().unwrap_err()
    };
    let e = at(&|sc, over| {
        let one = App { procs: 1, ..sc.apps[0].clone() };
        sc.apps = (0..sluice_sim::APPS_MAX + usize::from(over)).map(|i| App { name: format!("a{i}"), ..one.clone() }).collect();
    });
    assert!(e.detail.contains("applications"), "{e}");
    let e = at(&|sc, over| sc.cluster.compute_nodes = sluice_sim::NODES_MAX + u64::from(over));
    assert!(e.detail.contains("compute_nodes"), "{e}");
    let e = at(&|sc, over| sc.server.count = sluice_sim::SIM_SERVERS_MAX + u64::from(over));
    assert!(e.detail.contains("server count"), "{e}");
    let e = at(&|sc, over| sc.sweep_granularity_bytes = vec![4096; sluice_sim::SWEEP_POINTS_MAX + usize::from(over)]);
    assert!(e.detail.contains("sweep points"), "{e}");
    let e = at(&|sc, over| {
        let a = &mut sc.apps[0];
        (a.pattern, a.blocks_per_call) = (Pattern::Strided, sluice_sim::BLOCKS_PER_CALL_MAX + u64::from(over));
    });
    assert!(e.detail.contains("blocks_per_call"), "{e}");
}

#[test]
fn sim_time_bound_fails_with_the_seed() {
    let mut sc = shipped("mix10");
    sc.bounds.sim_ns_max = 1_000_000;
    let opts = RunOptions { modes: vec!["fifo".into()], scale: Some(1.0 / 64.0), ..RunOptions::default() };
    let e = sluice_sim::run(&sc, &opts).unwrap_err();
    assert_eq!((e.kind, e.seed), (ErrorKind::Bound, Some(sc.seed)));
}

#[test]
fn a_full_scheduler_queue_overflows_into_the_bounded_backlog() {
    // 5,000 processes, each with 16 pieces of 4 KiB in flight, on one
    // disk: 80,000 requests, more than the core's queued_requests_max.
    let mut sc = sluice_sim::bench_scenario(5_000, 1);
    (sc.server.count, sc.server.stripe_count, sc.client.fs_piece_bytes) = (1, 1, 4096);
    sc.server.device = "hdd7200".into();
    let full = sluice_core::Limits::default().queued_requests_max as u64;
    assert!(5_000 * 16 > full);
    let peak = check(&sc, 1.0, &["fifo"]).runs[0].device_stats.backlog_peak;
    assert!(peak > 0, "the backlog was used");
    // The bound at N (the run's peak) holds; at N - 1 the run fails.
    let opts = RunOptions { modes: vec!["fifo".into()], ..RunOptions::default() };
    sc.server.backlog_max = peak;
    assert_eq!(sluice_sim::run(&sc, &opts).unwrap().0.runs[0].device_stats.backlog_peak, peak);
    sc.server.backlog_max = peak - 1;
    let e = sluice_sim::run(&sc, &opts).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Bound);
    assert!(e.detail.contains("backlog_max"), "{e}");
}

#[test]
fn mpiio_two_phase_turns_small_strided_reads_into_large_ones() {
    let mut sc = shipped("decomposition");
    sc.sweep_granularity_bytes = vec![8 << 10];
    let posix = check(&sc, 1.0 / 64.0, &["fifo"]);
    let p = &posix.runs[0];
    for (aggregators, gain) in [(1, 3.0), (4, 1.2)] {
        for a in &mut sc.apps {
            (a.interface, a.aggregators) = (sluice_sim::Interface::Mpiio, aggregators);
        }
        let mpi = check(&sc, 1.0 / 64.0, &["fifo"]);
        let m = &mpi.runs[0];
        // Several aggregators' streams still interleave on an unscheduled
        // disk, so the gain shrinks as aggregators are added.
        assert!(m.makespan_s * gain < p.makespan_s, "{aggregators} aggregators: MPI-IO {} s vs POSIX {} s", m.makespan_s, p.makespan_s);
        assert_eq!(m.apps[0].bytes, p.apps[0].bytes);
    }
    // Writes through the collective complete too, and reach the device as
    // writes (every dispatch in the trace is one).
    sc.apps[0].op = sluice_sim::OpName::Write;
    let w = check(&sc, 1.0 / 64.0, &["fifo", "aioli"]);
    assert!(w.runs.iter().all(|r| r.makespan_s > 0.0 && r.device_stats.bytes >= r.apps[0].bytes));
    let opts = RunOptions { modes: vec!["fifo".into()], scale: Some(1.0 / 64.0), trace: true, ..RunOptions::default() };
    let (_, trace) = sluice_sim::run(&sc, &opts).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&trace.unwrap().to_json()).unwrap();
    let device: Vec<&str> = doc["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X" && e["pid"] == 2).map(|e| e["name"].as_str().unwrap()).collect();
    assert!(!device.is_empty() && device.iter().all(|n| n.starts_with("write")), "collective writes are writes on the device: {:?}", &device[..device.len().min(3)]);
}

#[test]
fn write_behind_answers_writes_before_the_disk() {
    let mut sc = shipped("mix10");
    sc.server.cache_bytes = 64 << 20;
    let r = check(&sc, 1.0 / 64.0, &["fifo", "fifo/write-behind"]);
    let w = "write sequential. - 32MB (1 node, granularity=4KB)";
    let (none, wb) = (r.runs[0].app(w).unwrap().completion_s, r.runs[1].app(w).unwrap().completion_s);
    assert!(wb * 5.0 < none, "write-behind {wb} s vs none {none} s");
}

#[test]
fn trace_has_process_and_device_tracks() {
    let sc = shipped("mix10");
    let opts = RunOptions { modes: vec!["aioli".into()], scale: Some(1.0 / 256.0), trace: true, ..RunOptions::default() };
    let (_, trace) = sluice_sim::run(&sc, &opts).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&trace.unwrap().to_json()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let spans = |pid: u64| events.iter().filter(|e| e["ph"] == "X" && e["pid"] == pid).count();
    assert!(spans(1) > 0 && spans(2) > 0, "process and device spans");
    let begins = events.iter().filter(|e| e["ph"] == "b").count();
    assert!(begins > 0 && begins == events.iter().filter(|e| e["ph"] == "e").count(), "piece slices open and close");
    assert_eq!(events.iter().filter(|e| e["ph"] == "M").count(), 2);
}

#[test]
fn trace_bound_keeps_the_first_events_and_counts_the_rest() {
    let mut sc = shipped("mix10");
    sc.bounds.trace_events_max = 10;
    let opts = RunOptions { modes: vec!["fifo".into()], scale: Some(1.0 / 256.0), trace: true, ..RunOptions::default() };
    let t = sluice_sim::run(&sc, &opts).unwrap().1.unwrap();
    let doc: serde_json::Value = serde_json::from_str(&t.to_json()).unwrap();
    assert_eq!(doc["traceEvents"].as_array().unwrap().len(), 10);
    assert!(t.dropped() > 0);
}

#[test]
fn ten_thousand_processes_with_memory_bounded_by_what_is_in_flight() {
    let sc = sluice_sim::bench_scenario(10_000, 2);
    let r = check(&sc, 1.0, &["aioli"]);
    let run = &r.runs[0];
    assert_eq!(run.apps.iter().map(|a| a.procs).sum::<u64>(), 10_000);
    // One request outstanding per process: the peak is the process count.
    assert!(run.pieces_peak <= 10_000 * 16, "{}", run.pieces_peak);
    assert!(run.events > 10_000 * 2 * 4);
}

#[test]
fn the_benchmark_s_event_bound_grows_with_its_size() {
    let per = sluice_sim::BENCH_EVENTS_PER_REQUEST_MAX;
    let default = sluice_sim::Bounds::default().events_max;
    assert_eq!(sluice_sim::bench_scenario(10_000, 200).bounds.events_max, default);
    assert_eq!(sluice_sim::bench_scenario(1_000_000, 200).bounds.events_max, 1_000_000 * 200 * per);
    // The bound holds what a run takes: under both policies, well within it.
    let sc = sluice_sim::bench_scenario(2_000, 20);
    for policy in ["fifo", "aioli"] {
        let r = check(&sc, 1.0, &[policy]);
        let requests: u64 = r.runs[0].apps.iter().map(|a| a.bytes / 65_536).sum();
        assert!(r.runs[0].events * 2 <= requests * per, "{policy}: {} events for {requests} requests", r.runs[0].events);
    }
}

#[test]
fn aioli_overrides_reach_the_policy() {
    let mut sc = shipped("mix10");
    sc.aioli.hold_ns_max = Some(0);
    sc.aioli.sync_hits_min = Some(3);
    let p = sc.aioli.params();
    assert_eq!((p.hold_ns_max, p.sync_hits_min), (0, 3));
    assert_eq!(p.quantum_bytes_max, sluice_core::AioliParams::default().quantum_bytes_max);
    // A different parameter set gives a different run of the same seed.
    let base = check(&shipped("mix10"), 1.0 / 64.0, &["aioli"]);
    sc.aioli.sync_window_ns_max = Some(0);
    sc.aioli.sync_window_ns_min = Some(0);
    let tuned = check(&sc, 1.0 / 64.0, &["aioli"]);
    assert_ne!(base.runs[0].events, tuned.runs[0].events);
    let text = std::fs::read_to_string(format!("{}/../../scenarios/mix10.toml", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let e = Scenario::from_toml(&format!("{text}\n[aioli]\nwindow = 1\n")).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Parse);
}

#[test]
fn sweep_plot_is_a_png_and_needs_a_sweep() {
    let mut sc = shipped("decomposition");
    sc.sweep_granularity_bytes = vec![8 << 10, 64 << 10, 1 << 20];
    let r = check(&sc, 1.0 / 256.0, &["fifo", "aioli"]);
    let path = std::env::temp_dir().join(format!("sluice-sim-plot-{}.png", std::process::id()));
    let legend = sluice_sim::sweep_png(&r, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(&bytes[1..4], b"PNG");
    assert!(legend.contains("red = fifo") && legend.contains("blue = aioli"), "{legend}");
    let single = check(&shipped("mix10"), 1.0 / 256.0, &["fifo"]);
    assert_eq!(sluice_sim::sweep_png(&single, &path).unwrap_err().kind, ErrorKind::Output);
}

#[test]
fn aggregator_sweep_and_the_seeds_choice_of_k() {
    // The shipped sweep at 1/64 of its size (256 MiB by 1,024 ranks).
    let sc = shipped("aggregators");
    let r = check(&sc, 1.0 / 64.0, &["fifo"]);
    let points: Vec<Option<u64>> = r.runs.iter().map(|run| run.aggregators).collect();
    assert_eq!(points, [1, 4, 16, 64, 256, 1024].map(Some));
    for run in &r.runs {
        assert_eq!(run.apps[0].aggregators, run.aggregators, "the application ran with the swept count");
        assert_eq!(run.apps[0].bytes, 256 << 20);
    }
    // One aggregator cannot keep 16 servers busy; 64 do.
    let at = |n: u64| r.runs.iter().find(|run| run.aggregators == Some(n)).unwrap().makespan_s;
    assert!(at(1) > 1.5 * at(64), "1 aggregator {} s, 64 aggregators {} s", at(1), at(64));
    assert!(r.table().contains("aggregators with 64 aggregators"));
    let path = std::env::temp_dir().join(format!("sluice-sim-agg-{}.png", std::process::id()));
    let legend = sluice_sim::sweep_png(&r, &path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(legend.starts_with("x: aggregators"), "{legend}");
    // k_bytes: ceil(total / k) groups of equal shares, 256 MiB / 32 MiB = 8.
    let mut k = sc.clone();
    k.sweep_aggregators.clear();
    k.apps[0].k_bytes = 32 << 20;
    let r = check(&k, 1.0 / 64.0, &["fifo"]);
    assert_eq!(r.runs[0].apps[0].aggregators, Some(8));
    k.apps[0].k_bytes = 1 << 40;
    assert_eq!(check(&k, 1.0 / 64.0, &["fifo"]).runs[0].apps[0].aggregators, Some(1));
    // Bad sweeps and a k for POSIX are refused.
    let mut bad = sc.clone();
    bad.sweep_granularity_bytes = vec![4096];
    assert_eq!(sluice_sim::run(&bad, &RunOptions::default()).unwrap_err().kind, ErrorKind::Invalid);
    let mut bad = sc.clone();
    bad.sweep_aggregators = vec![1025];
    assert_eq!(sluice_sim::run(&bad, &RunOptions::default()).unwrap_err().kind, ErrorKind::Invalid);
    let mut bad = shipped("decomposition");
    bad.apps[0].k_bytes = 1 << 20;
    assert_eq!(sluice_sim::run(&bad, &RunOptions::default()).unwrap_err().kind, ErrorKind::Invalid);
}

#[test]
fn runs_on_several_threads_give_the_same_report_in_the_same_order() {
    let sc = shipped("aggregators");
    let opts = |jobs| RunOptions { modes: vec!["fifo".into(), "aioli".into()], scale: Some(1.0 / 1024.0), jobs, ..RunOptions::default() };
    let (one, _) = sluice_sim::run(&sc, &opts(1)).unwrap();
    let (four, _) = sluice_sim::run(&sc, &opts(4)).unwrap();
    assert_eq!(one.runs.len(), 12);
    assert_eq!(one.without_host_timing(), four.without_host_timing());
    // More jobs than runs, and an error in one run, are fine too.
    let (many, _) = sluice_sim::run(&sc, &opts(64)).unwrap();
    assert_eq!(one.without_host_timing(), many.without_host_timing());
    let bad = RunOptions { modes: vec!["fifo".into(), "lottery".into()], jobs: 4, ..RunOptions::default() };
    assert_eq!(sluice_sim::run(&sc, &bad).unwrap_err().kind, ErrorKind::UnknownMode);
}

#[test]
fn server_directed_rounds_reach_the_disk_whole_and_in_offset_order() {
    // Eight ranks write interleaved 1 KiB pieces on the emulated disk,
    // unscheduled (fifo). Independent: each rank's pieces come as they
    // are sent, 16 at a time, and the arm jumps between the ranks' places
    // in the file. Server-directed: the server holds a round until all
    // eight ranks' lists are there and hands the pieces over in offset
    // order, so even fifo serves each round as one sweep.
    let mut sc = shipped("array-strategies");
    sc.apps.retain(|a| a.name == "independent write");
    sc.server.device = "hdd7200".into();
    sc.apps[0].blocks_per_call = 128;
    let scale = 1.0 / 64.0; // 8 MiB: 1,024 pieces a rank, 8 rounds
    let ind = check(&sc, scale, &["fifo"]);
    sc.apps[0].interface = sluice_sim::Interface::ServerDirected;
    let sd = check(&sc, scale, &["fifo"]);
    let (i, s) = (&ind.runs[0], &sd.runs[0]);
    assert_eq!((i.apps[0].bytes, s.apps[0].bytes), (8 << 20, 8 << 20));
    assert_eq!(s.device_stats.requests, 8192, "every piece reached the disk once");
    let seeks = |r: &sluice_sim::RunReport| r.device_stats.seeks_near + r.device_stats.seeks_far;
    assert!(seeks(s) <= 8, "at most one seek a round: {:?}", s.device_stats);
    assert!(seeks(i) > 1_000, "independent pieces interleave: {:?}", i.device_stats);
    assert!(s.makespan_s * 3.0 < i.makespan_s, "server-directed {} s vs independent {} s", s.makespan_s, i.makespan_s);
    // Reads come back whole too, and the run is the same each time.
    sc.apps[0].op = sluice_sim::OpName::Read;
    let r1 = check(&sc, scale, &["fifo", "aioli"]);
    let r2 = check(&sc, scale, &["fifo", "aioli"]);
    for (a, b) in r1.runs.iter().zip(&r2.runs) {
        assert_eq!((a.makespan_s, a.device_stats.requests), (b.makespan_s, b.device_stats.requests));
        assert_eq!(a.device_stats.requests, 8192);
    }
}

#[test]
fn server_directed_needs_strided_blocks_or_one_block_per_call() {
    let mut sc = shipped("array-strategies");
    sc.apps.retain(|a| a.name == "server-directed write");
    sc.apps[0].pattern = sluice_sim::Pattern::Contiguous;
    let text = "blocks_per_call > 1 needs the strided pattern";
    let err = sluice_sim::run(&sc, &RunOptions { modes: vec!["fifo".into()], ..RunOptions::default() }).unwrap_err();
    assert!(err.to_string().contains(text), "{err}");
    // A contiguous share, one block per call: each rank one round per piece.
    sc.apps[0].blocks_per_call = 1;
    let r = check(&sc, 1.0 / 512.0, &["fifo"]);
    assert_eq!(r.runs[0].apps[0].bytes, 1 << 20);
}

#[test]
fn server_cpu_per_request_is_one_thread_before_the_scheduler() {
    // One synchronous reader of 8 x 1 MiB: each request costs the
    // server's CPU first, then the device.
    let mut sc = lone_reader("profile", 8 << 20, 1 << 20);
    let free = completion(&sc, "fifo");
    sc.server.cpu_ns_per_request = 1_000_000;
    let paid = completion(&sc, "fifo");
    assert!((paid - free - 0.008).abs() < 1e-6, "8 requests x 1 ms: {free} s -> {paid} s");
    // Two readers: the CPU is one thread, so a request waits for the
    // other reader's; with a device that costs almost nothing the run
    // takes all 32 requests' CPU in a row.
    sc.server.profile = Some(sluice_sim::ProfileFigures { access_ns: 1, bytes_per_s: 1 << 50, seek_ns: 0, shared_ns: 0, shared_bytes_per_s: 0 });
    sc.apps[0].procs = 2;
    sc.apps[0].bytes = 32 << 20;
    sc.server.cpu_ns_per_request = 10_000_000;
    let t = completion(&sc, "fifo");
    assert!((0.32..0.321).contains(&t), "32 requests x 10 ms on one CPU: {t} s");
}

#[test]
fn processes_cpu_on_a_shared_host_queues_for_its_cores() {
    // Two readers, 16 requests each, a device and a server that cost
    // nothing, 10 ms of the process's own CPU per request.
    let mut sc = lone_reader("profile", 32 << 20, 1 << 20);
    sc.server.profile = Some(sluice_sim::ProfileFigures { access_ns: 1, bytes_per_s: 1 << 50, seek_ns: 0, shared_ns: 0, shared_bytes_per_s: 0 });
    sc.apps[0].procs = 2;
    sc.cluster.client_cpu_ns_per_request = 10_000_000;
    // Each process on its own CPU: 16 x 10 ms side by side.
    let own = completion(&sc, "fifo");
    assert!((0.16..0.161).contains(&own), "{own} s");
    // One host of two cores: the same; of one core: all 32 in a row.
    sc.cluster.host_cores = 2;
    assert!((completion(&sc, "fifo") - own).abs() < 1e-4);
    sc.cluster.host_cores = 1;
    let one = completion(&sc, "fifo");
    assert!((0.32..0.321).contains(&one), "{one} s");
    // The server's CPU takes the same cores.
    sc.server.cpu_ns_per_request = 10_000_000;
    let both = completion(&sc, "fifo");
    assert!((0.64..0.641).contains(&both), "{both} s");
    // A host of more cores than the bound is refused.
    sc.cluster.host_cores = sluice_sim::HOST_CORES_MAX + 1;
    let err = sluice_sim::run(&sc, &RunOptions { modes: vec!["fifo".into()], ..RunOptions::default() }).unwrap_err();
    assert!(err.to_string().contains("host_cores"), "{err}");
    sc.cluster.host_cores = sluice_sim::HOST_CORES_MAX;
    completion(&sc, "fifo");
}

#[test]
fn measured_starts_set_the_order_a_fifo_disk_serves_in() {
    // Four processes read one file in 32 KiB blocks, block i by process
    // i % 4. Started in rank order, a FIFO server keeps that order for
    // the whole run: every read continues the previous one. Started in
    // reverse, every read jumps back or ahead within the file.
    let mut sc = lone_reader("hdd7200", (16 * 32) << 10, 32 << 10);
    sc.apps[0].procs = 4;
    sc.apps[0].pattern = sluice_sim::Pattern::Strided;
    sc.cluster.compute_nodes = 4;
    let seeks = |sc: &Scenario| {
        let d = check(sc, 1.0, &["fifo"]).runs.remove(0).device_stats;
        (d.seeks_far, d.seeks_near, d.seeks_none)
    };
    sc.apps[0].start_offsets_ns = vec![0, 10_000, 20_000, 30_000];
    assert_eq!(seeks(&sc), (1, 0, 15));
    sc.apps[0].start_offsets_ns = vec![30_000, 20_000, 10_000, 0];
    assert_eq!(seeks(&sc), (1, 15, 0));
    // One start per process: N is taken, N + 1 and N - 1 are refused.
    for n in [3, 5] {
        sc.apps[0].start_offsets_ns = vec![0; n];
        let err = sluice_sim::run(&sc, &RunOptions { modes: vec!["fifo".into()], ..RunOptions::default() }).unwrap_err();
        assert!(err.to_string().contains(&format!("start_offsets_ns lists {n} starts for 4 processes")), "{err}");
    }
}

#[test]
fn a_scheduler_model_replaces_the_device_figures_in_the_policy_only() {
    let sc = shipped("decomposition-cat");
    let base = check(&sc, 1.0 / 64.0, &["aioli"]).runs.remove(0);
    // aioli held for the decomposition's pieces and kept windows for the
    // cat; fifo does neither.
    assert!(base.device_stats.holds > 0 && base.device_stats.windows > 0, "{:?}", base.device_stats);
    let fifo = check(&sc, 1.0 / 64.0, &["fifo"]).runs.remove(0);
    assert_eq!((fifo.device_stats.holds, fifo.device_stats.windows), (0, 0));
    // The device's own figures, handed over: the same run.
    let mut same = sc.clone();
    let c = sluice_device::Hdd::hdd7200();
    let parts = sluice_device::DeviceModel::cost_parts(&c);
    same.server.scheduler_model = Some(sluice_sim::SchedulerModel { dispatch_ns: parts.access_ns, byte_ps: parts.byte_ps, seek_ns: parts.seek_ns, parallelism: None });
    let again = check(&same, 1.0 / 64.0, &["aioli"]).runs.remove(0);
    assert_eq!((again.events, again.makespan_s), (base.events, base.makespan_s));
    // A scheduler that believes seeks are free holds for nothing: other
    // decisions, on the same device.
    let mut free = sc.clone();
    free.server.scheduler_model = Some(sluice_sim::SchedulerModel { dispatch_ns: 0, byte_ps: parts.byte_ps, seek_ns: 0, parallelism: None });
    let other = check(&free, 1.0 / 64.0, &["aioli"]).runs.remove(0);
    assert_ne!(other.device_stats.dispatches, base.device_stats.dispatches);
    // In a scenario file: the three figures, optionally the parallelism,
    // nothing else.
    let text = std::fs::read_to_string(format!("{}/../../scenarios/mix10.toml", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let model = "\n[server.scheduler_model]\ndispatch_ns = 1\nbyte_ps = 2\nseek_ns = 3\n";
    let parsed = Scenario::from_toml(&format!("{text}{model}")).unwrap();
    assert_eq!(parsed.server.scheduler_model, Some(sluice_sim::SchedulerModel { dispatch_ns: 1, byte_ps: 2, seek_ns: 3, parallelism: None }));
    let e = Scenario::from_toml(&format!("{text}{model}speed = 2\n")).unwrap_err();
    assert!(e.to_string().contains("speed"), "{e}");
    // The learned parallelism may come with them.
    let parsed = Scenario::from_toml(&format!("{text}{model}parallelism = 8\n")).unwrap();
    assert_eq!(parsed.server.scheduler_model.and_then(|m| m.parallelism), Some(8));
}

#[test]
fn a_parallel_device_overlaps_fixed_costs_and_shares_its_bandwidth() {
    // Eight synchronous readers of 64 x 4 KiB each, fifo (no merging):
    // 512 dispatches of 100 us + 4,096 B at 200 MB/s (20.48 us).
    let mut sc = lone_reader("profile", 512 * 4096, 4096);
    sc.apps[0].procs = 8;
    let one = completion(&sc, "fifo");
    assert!((one - 512.0 * 120.48e-6).abs() < 1e-6, "one at a time: {one} s");
    // Eight channels: the fixed costs overlap, the transfers take turns,
    // so the transfers bound the run (512 x 20.48 us, after the first
    // dispatch's 100 us).
    sc.server.channels = 8;
    let eight = completion(&sc, "fifo");
    assert!((512.0 * 20.48e-6..512.0 * 20.48e-6 + 2e-4).contains(&eight), "eight channels: {eight} s");
    // The part they share, as calibrated: 50 us per dispatch.
    let mut shared = sc.clone();
    let p = shared.server.profile.as_mut().unwrap();
    (p.shared_ns, p.shared_bytes_per_s) = (50_000, 0);
    let t = completion(&shared, "fifo");
    assert!((512.0 * 50e-6..512.0 * 50e-6 + 2e-4).contains(&t), "50 us shared: {t} s");
    // A server that keeps two in flight uses two channels: about half
    // the time of one at a time.
    sc.server.dispatches_inflight = 2;
    let two = completion(&sc, "fifo");
    assert!((256.0 * 120.48e-6..256.0 * 140.96e-6).contains(&two), "two in flight: {two} s");
    // The same answers, in the same order, every time.
    assert_eq!(completion(&sc, "fifo"), two);
    for policy in ["fifo-merge", "aioli"] {
        sc.server.dispatches_inflight = 0;
        let t = completion(&sc, policy);
        assert!(t < one, "{policy}: {t} s against {one} s one at a time");
    }
}

#[test]
fn channels_and_dispatches_in_flight_are_bounded() {
    let run = |sc: &Scenario| sluice_sim::run(sc, &RunOptions { modes: vec!["fifo".into()], ..RunOptions::default() });
    let mut sc = lone_reader("profile", 64 * 4096, 4096);
    let max = sluice_sim::CHANNELS_MAX;
    for (channels, inflight, parallelism) in [(max, max, max), (1, 0, 1)] {
        sc.server.channels = channels;
        sc.server.dispatches_inflight = inflight;
        sc.server.scheduler_model = Some(sluice_sim::SchedulerModel { dispatch_ns: 1, byte_ps: 1, seek_ns: 0, parallelism: Some(parallelism) });
        run(&sc).unwrap();
    }
    for (channels, inflight, parallelism, word) in
        [(max + 1, 0, 1, "channels"), (0, 0, 1, "channels"), (1, max + 1, 1, "dispatches_inflight"), (1, 0, max + 1, "parallelism"), (1, 0, 0, "parallelism")]
    {
        sc.server.channels = channels;
        sc.server.dispatches_inflight = inflight;
        sc.server.scheduler_model = Some(sluice_sim::SchedulerModel { dispatch_ns: 1, byte_ps: 1, seek_ns: 0, parallelism: Some(parallelism) });
        let e = run(&sc).unwrap_err();
        assert!(e.to_string().contains(word), "{channels} / {inflight} / {parallelism}: {e}");
    }
}

#[test]
fn dispatches_that_finish_together_complete_one_by_one_in_order() {
    // Eight channels, nothing shared (the transfer costs nothing): the
    // eight readers' dispatches all finish at the same instant, round
    // after round; every one is completed, and the trace shows them as
    // overlapping slices.
    let mut sc = lone_reader("profile", 8 * 16 * 4096, 4096);
    sc.apps[0].procs = 8;
    sc.server.profile = Some(sluice_sim::ProfileFigures { access_ns: 100_000, bytes_per_s: 1 << 50, seek_ns: 0, shared_ns: 0, shared_bytes_per_s: 0 });
    sc.server.channels = 8;
    let opts = RunOptions { modes: vec!["fifo".into()], trace: true, ..RunOptions::default() };
    let (report, trace) = sluice_sim::run(&sc, &opts).unwrap();
    let r = &report.runs[0];
    assert_eq!(r.device_stats.dispatches, 128);
    assert!((r.makespan_s - 16.0 * 100e-6).abs() < 1e-6, "16 rounds of 100 us: {} s", r.makespan_s);
    let json = trace.unwrap().to_json();
    assert_eq!(json.matches("\"cat\":\"dispatch\"").count(), 2 * 128, "a begin and an end per dispatch");
}
