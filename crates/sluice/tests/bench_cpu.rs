//! What the server costs in CPU per request, as the benchmarks report it:
//! `sluice bench service` per request of its 4 KiB passes, here against
//! the null device (no disk under the server at all).

mod common;

#[test]
fn bench_service_reports_the_servers_cpu_per_request_on_the_null_device() {
    let args = ["service", "--size-mib", "4", "--rounds", "1", "--rtt-requests", "300", "--device", "null"];
    let (out, v) = common::bench_json(&args, "svc-null.json");
    assert!(out.contains("server CPU per request") && out.contains("device null"), "{out}");
    assert_eq!(v["device"], "null");
    let f = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k} in {v}"));
    let (blocking, pipelined, per_core) = (f("rtt_server_us_per_request"), f("pipelined_server_us_per_request"), f("requests_per_s_per_core"));
    assert!(blocking > 0.0 && pipelined > 0.0, "{v}");
    assert!((per_core * pipelined - 1e6).abs() < 1e-3, "{v}");
    assert!(f("pipelined_requests_per_s") > 0.0);
}
