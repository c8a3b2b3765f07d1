//! `sluice top`: a live terminal view of a server, from its metrics
//! endpoint (`sluice serve --metrics HOST:PORT`). Applications sorted by
//! throughput, with their request rate, latency percentiles, waiting
//! requests, aggregation and quantum; above them the policy deciding, the
//! scheduler's queue and the device's busy time. Rates are the difference
//! of two scrapes over the time between them. `q`, Esc or Ctrl-C quits;
//! `--once` prints one frame as text instead (two scrapes an interval
//! apart).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph, Row, Table};

#[derive(Args)]
pub struct TopArgs {
    /// The server's metrics endpoint: HOST:PORT as given to `sluice serve
    /// --metrics`.
    #[arg(long, default_value = "127.0.0.1:9464")]
    metrics: String,
    /// Seconds between scrapes.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// Print one frame as text and exit.
    #[arg(long)]
    once: bool,
    /// Sort applications by: throughput, latency (p99), name.
    #[arg(long, default_value = "throughput")]
    sort: String,
}

/// Seconds a scrape may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// One scrape, reduced to what the view shows.
#[derive(Clone, Debug, Default)]
struct Scrape {
    at: Option<Instant>,
    policy: String,
    queued: f64,
    blocked: f64,
    inflight: f64,
    depth: f64,
    busy_s: f64,
    connections: f64,
    uptime_s: f64,
    apps: HashMap<String, App>,
}

#[derive(Clone, Debug, Default)]
struct App {
    bytes: f64,
    requests: f64,
    p50_s: f64,
    p99_s: f64,
    waiting: f64,
    per_dispatch: f64,
    quantum: Option<f64>,
    connections: f64,
}

/// One application's line.
struct Line_ {
    name: String,
    mb_s: f64,
    req_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    waiting: f64,
    per_dispatch: f64,
    quantum: Option<f64>,
    connections: f64,
}

fn scrape(addr: &str) -> anyhow::Result<Scrape> {
    let text = sluice_server::metrics::get(addr, "/metrics", SCRAPE_TIMEOUT).with_context(|| format!("no metrics from {addr} (start the server with --metrics {addr})"))?;
    let samples = sluice_server::metrics::parse(&text).map_err(|e| anyhow::anyhow!("the endpoint's reply does not parse: {e}"))?;
    let mut s = Scrape { at: Some(Instant::now()), policy: "?".into(), ..Scrape::default() };
    for (name, labels, v) in samples {
        let label = |k: &str| labels.iter().find(|(lk, _)| lk == k).map(|(_, lv)| lv.as_str());
        let app = label("app").map(|a| s.apps.entry(a.to_string()).or_default());
        match (name.as_str(), app) {
            ("sluice_app_bytes_total", Some(a)) => a.bytes += v,
            ("sluice_app_requests_total", Some(a)) => a.requests += v,
            ("sluice_app_requests_per_dispatch", Some(a)) => a.per_dispatch = v,
            ("sluice_app_waiting_requests", Some(a)) => a.waiting = v,
            ("sluice_app_quantum_bytes", Some(a)) => a.quantum = Some(v),
            ("sluice_app_connections", Some(a)) => a.connections = v,
            ("sluice_app_latency_seconds", Some(a)) => match label("quantile") {
                Some("0.5") => a.p50_s = v,
                Some("0.99") => a.p99_s = v,
                _ => {}
            },
            ("sluice_scheduler_policy", _) => s.policy = label("policy").unwrap_or("?").to_string(),
            ("sluice_scheduler_queued_requests", _) => s.queued = v,
            ("sluice_scheduler_blocked_requests", _) => s.blocked = v,
            ("sluice_scheduler_inflight_dispatches", _) => s.inflight = v,
            ("sluice_scheduler_depth", _) => s.depth = v,
            ("sluice_device_busy_seconds_total", _) => s.busy_s = v,
            ("sluice_connections", _) => s.connections = v,
            ("sluice_uptime_seconds", _) => s.uptime_s = v,
            _ => {}
        }
    }
    Ok(s)
}

/// Seconds between two scrapes: by the server's clock when both carry
/// it (scrape delays then do not skew rates), else by this one's.
fn seconds_between(prev: &Scrape, cur: &Scrape) -> f64 {
    if prev.uptime_s > 0.0 && cur.uptime_s > prev.uptime_s {
        return cur.uptime_s - prev.uptime_s;
    }
    match (prev.at, cur.at) {
        (Some(a), Some(b)) if b > a => (b - a).as_secs_f64(),
        _ => 0.0,
    }
}

/// The lines of `cur` with rates since `prev`, sorted as asked.
fn lines(prev: &Scrape, cur: &Scrape, sort: &str) -> Vec<Line_> {
    let dt = seconds_between(prev, cur);
    let rate = |now: f64, before: f64| if dt > 0.0 { (now - before).max(0.0) / dt } else { 0.0 };
    let mut out: Vec<Line_> = cur
        .apps
        .iter()
        .map(|(name, a)| {
            let p = prev.apps.get(name).cloned().unwrap_or_default();
            Line_ {
                name: name.clone(),
                mb_s: rate(a.bytes, p.bytes) / 1e6,
                req_s: rate(a.requests, p.requests),
                p50_ms: a.p50_s * 1e3,
                p99_ms: a.p99_s * 1e3,
                waiting: a.waiting,
                per_dispatch: a.per_dispatch,
                quantum: a.quantum,
                connections: a.connections,
            }
        })
        .collect();
    match sort {
        "name" => out.sort_by(|a, b| a.name.cmp(&b.name)),
        "latency" => out.sort_by(|a, b| b.p99_ms.total_cmp(&a.p99_ms).then(a.name.cmp(&b.name))),
        _ => out.sort_by(|a, b| b.mb_s.total_cmp(&a.mb_s).then(b.req_s.total_cmp(&a.req_s)).then(a.name.cmp(&b.name))),
    }
    out
}

fn summary(prev: &Scrape, cur: &Scrape) -> String {
    let dt = seconds_between(prev, cur);
    let busy = if dt > 0.0 { (cur.busy_s - prev.busy_s).max(0.0) / dt * 100.0 } else { 0.0 };
    format!(
        "policy {} | queued {} blocked {} | in flight {}/{} | device busy {:.0}% | {} connections | up {:.0} s",
        cur.policy, cur.queued, cur.blocked, cur.inflight, cur.depth, busy, cur.connections, cur.uptime_s
    )
}

const HEADER: [&str; 9] = ["application", "MB/s", "req/s", "p50 ms", "p99 ms", "waiting", "req/disp", "quantum", "conns"];

fn cells(l: &Line_) -> [String; 9] {
    [
        l.name.clone(),
        format!("{:.1}", l.mb_s),
        format!("{:.0}", l.req_s),
        format!("{:.3}", l.p50_ms),
        format!("{:.3}", l.p99_ms),
        format!("{}", l.waiting),
        format!("{:.2}", l.per_dispatch),
        l.quantum.map_or("-".into(), |q| sluice_sim::size(q as u64)),
        format!("{}", l.connections),
    ]
}

fn text_frame(prev: &Scrape, cur: &Scrape, sort: &str) -> String {
    let mut out = format!("{}\n", summary(prev, cur));
    out += &format!("{:<24} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>10} {:>6}\n", HEADER[0], HEADER[1], HEADER[2], HEADER[3], HEADER[4], HEADER[5], HEADER[6], HEADER[7], HEADER[8]);
    for l in lines(prev, cur, sort) {
        let c = cells(&l);
        out += &format!("{:<24} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>10} {:>6}\n", c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8]);
    }
    out
}

pub fn run(a: TopArgs) -> anyhow::Result<()> {
    if !matches!(a.sort.as_str(), "throughput" | "latency" | "name") {
        bail!("--sort {:?}: use throughput, latency or name", a.sort);
    }
    if !(a.interval > 0.0 && a.interval <= 3600.0) {
        bail!("--interval {} is outside (0, 3600] seconds", a.interval);
    }
    let interval = Duration::from_secs_f64(a.interval);
    let first = scrape(&a.metrics)?;
    if a.once {
        std::thread::sleep(interval);
        print!("{}", text_frame(&first, &scrape(&a.metrics)?, &a.sort));
        return Ok(());
    }
    let mut term = ratatui::init();
    let result = live(&mut term, &a, first, interval);
    ratatui::restore();
    result
}

fn live(term: &mut ratatui::DefaultTerminal, a: &TopArgs, first: Scrape, interval: Duration) -> anyhow::Result<()> {
    let (mut prev, mut cur, mut error) = (first.clone(), first, None::<String>);
    let mut next = Instant::now();
    loop {
        if Instant::now() >= next {
            match scrape(&a.metrics) {
                Ok(s) => {
                    prev = std::mem::replace(&mut cur, s);
                    error = None;
                }
                Err(e) => error = Some(format!("{e:#}")),
            }
            next = Instant::now() + interval;
        }
        term.draw(|f| {
            let [top, table] = Layout::vertical([Constraint::Length(2), Constraint::Min(0)]).areas(f.area());
            let status = match &error {
                Some(e) => format!("{} | scrape failed: {e}", a.metrics),
                None => format!("{} | sorted by {} | q quits", a.metrics, a.sort),
            };
            f.render_widget(Paragraph::new(vec![Line::from(summary(&prev, &cur)), Line::from(status)]), top);
            let rows: Vec<Row> = lines(&prev, &cur, &a.sort).iter().map(|l| Row::new(cells(l))).collect();
            let widths = [
                Constraint::Min(20),
                Constraint::Length(9),
                Constraint::Length(9),
                Constraint::Length(9),
                Constraint::Length(9),
                Constraint::Length(8),
                Constraint::Length(9),
                Constraint::Length(10),
                Constraint::Length(6),
            ];
            let t = Table::new(rows, widths).header(Row::new(HEADER).style(Style::new().add_modifier(Modifier::BOLD))).block(Block::bordered().title(" sluice top "));
            f.render_widget(t, table);
        })?;
        let wait = next.saturating_duration_since(Instant::now()).min(Duration::from_millis(250));
        if event::poll(wait)? {
            if let Event::Key(k) = event::read()? {
                let quit = k.kind == KeyEventKind::Press
                    && (matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || (k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL)));
                if quit {
                    return Ok(());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape_with(apps: &[(&str, f64, f64)], at: Instant) -> Scrape {
        let apps = apps.iter().map(|(n, bytes, p99)| (n.to_string(), App { bytes: *bytes, requests: bytes / 4096.0, p99_s: *p99, ..App::default() })).collect();
        Scrape { at: Some(at), apps, ..Scrape::default() }
    }

    #[test]
    fn rates_come_from_the_difference_of_two_scrapes_and_sort_as_asked() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(2);
        let prev = scrape_with(&[("slow", 0.0, 0.5), ("fast", 0.0, 0.001)], t0);
        let cur = scrape_with(&[("slow", 2e6, 0.5), ("fast", 8e6, 0.001), ("new", 4e6, 0.0)], t1);
        let by_tput: Vec<(String, f64)> = lines(&prev, &cur, "throughput").into_iter().map(|l| (l.name, l.mb_s)).collect();
        assert_eq!(by_tput, [("fast".to_string(), 4.0), ("new".to_string(), 2.0), ("slow".to_string(), 1.0)]);
        assert_eq!(lines(&prev, &cur, "latency")[0].name, "slow");
        assert_eq!(lines(&prev, &cur, "name")[0].name, "fast");
        assert!(text_frame(&prev, &cur, "throughput").lines().nth(2).unwrap().starts_with("fast"));
    }
}
