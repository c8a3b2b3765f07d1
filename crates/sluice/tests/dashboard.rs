//! The dashboard (`sluice serve --metrics`, page `/`) in a real headless
//! Chromium against a real server with two writing applications: after a
//! few seconds of (virtual) time the page has scraped several times, its
//! charts drew non-zero values, its table lists both applications with
//! their rates and requests (the uncapped one's rate above zero), and the
//! screenshot has the charts' line colours in it.

mod common;

use std::process::Command;

use common::{Load, MetricsServe};

/// The series colours of the charts (dashboard.html `COLORS[0]`, `[1]`).
const BLUE: [u8; 3] = [0x1f, 0x77, 0xb4];
const RED: [u8; 3] = [0xd6, 0x27, 0x28];

fn chromium(args: &[&str], profile: &std::path::Path) -> std::process::Output {
    let mut all = vec!["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run", "--window-size=1400,1000", "--virtual-time-budget=5000"];
    let dir = format!("--user-data-dir={}", profile.display());
    all.push(&dir);
    all.extend_from_slice(args);
    Command::new("chromium").args(&all).output().expect("chromium is installed (make deps)")
}

/// Pixels of `png` within 24 of `rgb` on every channel.
fn pixels_near(png: &[u8], rgb: [u8; 3]) -> usize {
    let mut r = png::Decoder::new(png);
    r.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = r.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    assert!(channels >= 3, "a colour screenshot");
    buf[..info.buffer_size()].chunks(channels).filter(|p| (0..3).all(|i| p[i].abs_diff(rgb[i]) <= 24)).count()
}

/// The value of `attr` on the element with `id` in a dumped DOM.
fn attr(dom: &str, id: &str, attr: &str) -> Option<u64> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let tag_end = at + dom[at..].find('>')?;
    let tag_start = dom[..at].rfind('<')?;
    let tag = &dom[tag_start..tag_end];
    let v = tag.split(&format!("{attr}=\"")).nth(1)?.split('"').next()?;
    v.parse().ok()
}

#[test]
fn the_dashboard_renders_live_charts_in_headless_chromium() {
    let s = MetricsServe::start();
    // A service class on one of them: the page shows its rate against
    // its limit.
    let rules = s.root().join("qos.toml");
    std::fs::write(&rules, "[[class]]\nname = \"capped\"\nrate_bytes_per_s = 50000000\n[[rule]]\nclass = \"capped\"\napp = \"climate-post\"\n").unwrap();
    let (ok, _, err) = s.sluice(&["qos", "set", rules.to_str().unwrap()]);
    assert!(ok, "sluice qos set: {err}");
    let _load = Load::start(&s.addr, &["ocean-model", "climate-post"]);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("http://{}/", s.metrics);
    // The DOM after the page's scripts ran. Under Chromium's virtual time
    // the last two scrapes can come a few milliseconds apart in real
    // time, and on a loaded machine even the uncapped application may
    // have had no request answered in between (seen once in `make test`,
    // 2026-12-07: 0.0 MB/s with 10,313 requests served): a page whose
    // uncapped row shows no throughput is loaded again, at most thrice.
    let shows_throughput =
        |dom: &str| dom.split("<tr><td>ocean-model</td><td>").nth(1).and_then(|r| r.split("</td>").next()).and_then(|v| v.parse::<f64>().ok()).is_some_and(|v| v > 0.0);
    let mut out = chromium(&["--dump-dom", &url], &dir.path().join("p1"));
    for again in 0..2 {
        if !out.status.success() || shows_throughput(&String::from_utf8_lossy(&out.stdout)) {
            break;
        }
        out = chromium(&["--dump-dom", &url], &dir.path().join(format!("p1-{again}")));
    }
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "chromium --dump-dom: {}", String::from_utf8_lossy(&out.stderr));
    let scrapes = dom.split("data-scrapes=\"").nth(1).and_then(|r| r.split('"').next()).and_then(|v| v.parse::<u64>().ok());
    assert!(scrapes.is_some_and(|n| n >= 3), "the page scraped /metrics several times: {scrapes:?}");
    for chart in ["tput", "lat", "dev"] {
        let n = attr(&dom, chart, "data-nonzero");
        assert!(n.is_some_and(|n| n >= 2), "chart {chart} drew non-zero values: {n:?}");
    }
    // Each application's row: its throughput over the last scrape
    // interval, and its requests so far. Under Chromium's virtual time two
    // scrapes can come a few milliseconds apart in real time, in which the
    // capped application (paced at 50 MB/s) may have had no request
    // answered (one run in ten showed 0.0 with 470 requests served): it
    // must show a rate and requests; the uncapped one must show throughput.
    for app in ["ocean-model", "climate-post"] {
        let row = dom.split(&format!("<tr><td>{app}</td><td>")).nth(1).unwrap_or_else(|| panic!("a table row for {app}"));
        let cells: Vec<&str> = row.split("</td><td>").take(2).collect();
        let mb_s: f64 = cells[0].parse().unwrap_or_else(|e| panic!("{app}'s MB/s: {e}: {row}"));
        let requests: u64 = cells[1].parse().unwrap_or_else(|e| panic!("{app}'s requests: {e}: {row}"));
        assert!(mb_s >= 0.0 && requests > 0, "{app} shows its rate and requests: {row}");
        assert!(app == "climate-post" || mb_s > 0.0, "{app} shows throughput: {row}");
    }
    let row = dom.split("<tr><td>capped</td><td>").nth(1).expect("a service-class row for capped");
    let cells: Vec<&str> = row.split("</td><td>").take(2).collect();
    assert_eq!(cells.get(1).copied(), Some("50.0"), "capped shows its limit: {row}");
    assert!(cells[0].parse::<f64>().is_ok_and(|v| v >= 0.0), "capped shows its rate: {row}");
    // The screenshot: the charts' lines are drawn.
    let shot = dir.path().join("dash.png");
    let out = chromium(&[&format!("--screenshot={}", shot.display()), &url], &dir.path().join("p2"));
    assert!(out.status.success(), "chromium --screenshot: {}", String::from_utf8_lossy(&out.stderr));
    let png = std::fs::read(&shot).unwrap();
    let (blue, red) = (pixels_near(&png, BLUE), pixels_near(&png, RED));
    // The three legends hold at most 300 pixels of each colour (10 x 10
    // each); lines across three charts hold about 500 to thousands each,
    // fewer where a later series covers an earlier one.
    assert!(blue > 500 && red > 500, "chart lines in the screenshot: {blue} blue, {red} red pixels");
    if let Ok(keep) = std::env::var("SLUICE_DASHBOARD_PNG") {
        std::fs::copy(&shot, keep).unwrap();
    }
}
