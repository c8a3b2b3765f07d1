//! Service classes in the simulator: the daemon's classes, applied by the
//! same core, cap a class at its rate; a scenario naming an unknown class
//! is refused.

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
    // Without the class the same application goes faster than the limit.
    let mut free = sc.clone();
    free.apps[0].class = None;
    free.classes.clear();
    let r = check(&free, 0.25, &["aioli"]);
    let app = r.runs[0].apps.iter().find(|a| a.name == "limited").unwrap();
    assert!((limited.bytes as f64 * 0.25) / app.completion_s > rate, "unlimited: {} s", app.completion_s);
}

#[test]
fn an_unknown_class_is_refused() {
    let mut sc = shipped("qos-limit");
    sc.apps[1].class = Some("nowhere".into());
    assert!(sc.validate().unwrap_err().to_string().contains("no class"));
}
