//! `sluice bench scheduler`: what one request costs the scheduling core.
//!
//! The queue is filled to `queued` requests (10,000 by default) from
//! `apps` applications (100) over `files` files (1,000), a third of the
//! applications sequential, a third strided over a shared file, a third
//! random. Then, until `requests` requests have been admitted, one request
//! is enqueued each time one dispatch completes, which keeps the queue at
//! its target depth; finally the queue is drained. The figure is the wall
//! time of all `enqueue`, `next` and `complete` calls divided by the
//! requests admitted, best of `rounds`.

use std::time::Instant;

use serde::Serialize;
use sluice_core::{AppId, ClientId, Decision, FileId, Limits, Op, PolicyConfig, Request, RequestId, Scheduler, POLICY_NAMES};

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    pub requests: u64,
    pub queued: u64,
    pub apps: u32,
    pub files: u64,
    pub rounds: u32,
    pub seed: u64,
    pub policies: Vec<String>,
}

impl Default for Config {
    fn default() -> Config {
        Config { requests: 100_000, queued: 10_000, apps: 100, files: 1_000, rounds: 3, seed: 1, policies: POLICY_NAMES.iter().map(|s| s.to_string()).collect() }
    }
}

/// One policy's figure.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyResult {
    pub name: String,
    pub ns_per_request: f64,
    pub requests: u64,
    pub dispatches: u64,
    pub requests_per_dispatch: f64,
}

/// The whole report (JSON: `{"policies":[…],"queued":…,"apps":…,"files":…}`).
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub policies: Vec<PolicyResult>,
    pub queued: u64,
    pub apps: u32,
    pub files: u64,
}

/// A deterministic generator of the mixed workload.
struct Workload {
    cfg: Config,
    rng: u64,
    /// Per application: next offset (sequential) or next piece (strided).
    cursor: Vec<u64>,
    n: u64,
}

const CLIENTS_PER_APP: u64 = 8;

impl Workload {
    fn new(cfg: &Config) -> Workload {
        Workload { cfg: cfg.clone(), rng: cfg.seed | 1, cursor: vec![0; cfg.apps as usize], n: 0 }
    }

    fn rand(&mut self) -> u64 {
        // xorshift64*: small, fast, deterministic.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn next(&mut self) -> Request {
        let app = (self.rand() % u64::from(self.cfg.apps)) as u32;
        let client = self.rand() % CLIENTS_PER_APP;
        let files = self.cfg.files;
        let c = &mut self.cursor[app as usize];
        let (file, offset, len) = match app % 3 {
            0 => {
                let off = *c;
                *c += 64 << 10;
                (u64::from(app) % files, off, 64 << 10)
            }
            1 => {
                let piece = *c;
                *c += 1;
                (u64::from(app) % files, piece * (8 << 10), 8 << 10)
            }
            _ => {
                let f = self.rand() % files;
                (f, (self.rand() % (1 << 18)) * 4096, 4096)
            }
        };
        let op = if app.is_multiple_of(7) { Op::Write } else { Op::Read };
        self.n += 1;
        Request { id: RequestId(self.n), app: AppId(app), client: ClientId(client as u32), file: FileId(file), op, offset, len }
    }
}

fn run_once(cfg: &Config, policy: &str) -> (f64, u64) {
    let config = PolicyConfig::from_name(policy).expect("policy names come from POLICY_NAMES");
    let limits = Limits { dispatches_inflight_max: 1, ..Limits::default() };
    let mut s = Scheduler::new(config, limits);
    let mut w = Workload::new(cfg);
    let mut now = 0u64;
    let mut admitted = 0u64;
    let start = Instant::now();
    loop {
        while admitted < cfg.requests && s.waiting() < cfg.queued {
            s.enqueue(w.next(), now).expect("the bench stays within the default limits");
            admitted += 1;
        }
        now += 1_000;
        match s.next(now) {
            Decision::Dispatch(d) => {
                s.complete(d.id, now).expect("dispatch is in flight");
                // As the daemon and the simulator do: the member list
                // serves a later dispatch.
                s.recycle(d);
            }
            Decision::WaitUntil(t) => now = t,
            Decision::Idle if s.is_empty() && admitted == cfg.requests => break,
            Decision::Idle => {}
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / admitted as f64;
    s.check_invariants();
    (ns, s.stats().dispatches)
}

/// Run every configured policy.
pub fn run(cfg: &Config) -> Report {
    let policies = cfg
        .policies
        .iter()
        .map(|name| {
            let mut best = f64::INFINITY;
            let mut dispatches = 0;
            for _ in 0..cfg.rounds.max(1) {
                let (ns, d) = run_once(cfg, name);
                best = best.min(ns);
                dispatches = d;
            }
            PolicyResult {
                name: name.clone(),
                ns_per_request: (best * 10.0).round() / 10.0,
                requests: cfg.requests,
                dispatches,
                requests_per_dispatch: cfg.requests as f64 / dispatches.max(1) as f64,
            }
        })
        .collect();
    Report { policies, queued: cfg.queued, apps: cfg.apps, files: cfg.files }
}

/// The report as a table for people.
pub fn table(r: &Report) -> String {
    let mut out = format!(
        "scheduler cost: {} queued requests, {} applications, {} files\n{:<12} {:>14} {:>12} {:>12} {:>10}\n",
        r.queued, r.apps, r.files, "policy", "ns/request", "requests", "dispatches", "req/disp"
    );
    for p in &r.policies {
        out += &format!("{:<12} {:>14.1} {:>12} {:>12} {:>10.2}\n", p.name, p.ns_per_request, p.requests, p.dispatches, p.requests_per_dispatch);
    }
    out
}
