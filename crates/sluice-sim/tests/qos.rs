//! Service classes in the simulator: the daemon's classes, applied by the
//! same core, cap a class at its rate (and aIOLi keeps it there); users
//! share equally with a sharing order; a scenario naming an unknown class
//! or share level is refused.

mod common;

use common::{check, shipped};

#[test]
fn a_limited_class_never_beats_its_rate_in_the_simulator() {
    let sc = shipped("qos-limit");
    let r = check(&sc, 0.25, &["aioli", "fifo"]);
    let limited = &sc.apps[0];
    let rate = sc.classes[0].rate_bytes_per_s.unwrap() as f64;
    for run in &r.runs {
        let app = run.apps.iter().find(|a| a.name == "limited").unwrap();
        let got = (limited.bytes as f64 * 0.25) / app.completion_s;
        // One bucket's depth (20 ms) ahead of the rate at most.
        assert!(got <= rate * 1.05, "{}: {got} bytes/s against a limit of {rate}", run.mode);
    }
    // aIOLi paces the class in bursts that keep its rate: on the emulated
    // disk it gets within 5% of it over its run.
    let run = r.runs.iter().find(|run| run.mode == "aioli").unwrap();
    let app = run.apps.iter().find(|a| a.name == "limited").unwrap();
    let got = (limited.bytes as f64 * 0.25) / app.completion_s;
    assert!(got >= rate * 0.95, "aioli: {got} bytes/s against a limit of {rate}");
}

#[test]
fn an_unknown_class_is_refused() {
    let mut sc = shipped("qos-limit");
    sc.apps[1].class = Some("nowhere".into());
    assert!(sc.validate().unwrap_err().to_string().contains("no class"));
}

/// When each user's last application was done (the one-job user's, the
/// four-job user's), s.
fn done(sc: &sluice_sim::Scenario, run: &sluice_sim::RunReport) -> (f64, f64) {
    let mut out = [0.0f64; 2];
    for (a, r) in sc.apps.iter().zip(&run.apps) {
        let u = &mut out[usize::from(a.user != 0)];
        *u = u.max(r.completion_s);
    }
    (out[0], out[1])
}

#[test]
fn users_then_jobs_give_a_one_job_user_what_a_four_job_user_gets() {
    // Each user moves the same bytes: equal shares end together.
    let sc = shipped("qos-share");
    let r = check(&sc, 0.25, &["aioli"]);
    let (one, four) = done(&sc, &r.runs[0]);
    assert!((one / four - 1.0).abs() <= 0.1, "shared: one job done at {one} s, four at {four} s");
    // Without the sharing order each job is an application of its own:
    // the four-job user takes more and ends well first.
    let mut free = sc.clone();
    free.share.clear();
    let r = check(&free, 0.25, &["aioli"]);
    let (one, four) = done(&free, &r.runs[0]);
    assert!(four < 0.85 * one, "unshared: one job done at {one} s, four at {four} s");
}

#[test]
fn an_unknown_share_level_is_refused() {
    let mut sc = shipped("qos-share");
    sc.share.push("planet".into());
    assert!(sc.validate().unwrap_err().to_string().contains("no level"));
}

/// On a device of eight channels sharing one bandwidth, a guaranteed
/// class's requests would each wait behind the others' in flight: aIOLi
/// keeps the others to one dispatch in flight while the class is owed and
/// active, and the guarantee holds.
#[test]
fn a_guarantee_holds_on_a_parallel_device() {
    let mut sc = shipped("qos-guarantee");
    sc.server.device = "profile".into();
    sc.server.channels = 8;
    sc.server.profile = Some(sluice_sim::ProfileFigures { access_ns: 40_000, bytes_per_s: 1_600_000_000, seek_ns: 0, shared_ns: 10_000, shared_bytes_per_s: 1_500_000_000 });
    let guarantee = 500_000_000u64;
    sc.classes[0].guarantee_bytes_per_s = Some(guarantee);
    let scale = 3.0;
    let r = check(&sc, scale, &["aioli"]);
    let gold = r.runs[0].apps.iter().find(|a| a.name == "gold").unwrap();
    let got = sc.apps[0].bytes as f64 * scale / gold.completion_s;
    assert!(got >= guarantee as f64, "gold {got} bytes/s against a guarantee of {guarantee}");
}
