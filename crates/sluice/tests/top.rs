//! `sluice top` against a real `sluice serve --metrics` with real clients:
//! in a tmux pane (capture-pane shows the applications, `q` quits), and
//! `--once` as text; a missing endpoint is one clear line.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Load, MetricsServe as Serve, SLUICE};

/// A detached tmux session, killed on drop.
struct Tmux(String);

impl Tmux {
    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux").args(args).output().expect("tmux is installed (make deps)")
    }
    fn alive(&self) -> bool {
        self.run(&["has-session", "-t", &self.0]).status.success()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-session", "-t", &self.0]);
    }
}

#[test]
fn top_in_tmux_shows_the_applications_and_q_quits() {
    let s = Serve::start();
    let _load = Load::start(&s.addr, &["ocean-model", "climate-post"]);
    let t = Tmux(format!("sluice-top-{}", std::process::id()));
    let cmd = format!("{SLUICE} top --metrics {} --interval 0.3", s.metrics);
    assert!(t.run(&["new-session", "-d", "-s", &t.0, "-x", "160", "-y", "20", &cmd]).status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut screen = String::new();
    while Instant::now() < deadline {
        screen = String::from_utf8_lossy(&t.run(&["capture-pane", "-p", "-t", &t.0]).stdout).into_owned();
        if screen.contains("ocean-model") && screen.contains("climate-post") && screen.contains("policy aioli") {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(screen.contains("ocean-model") && screen.contains("climate-post"), "the pane shows both applications:\n{screen}");
    assert!(screen.contains("MB/s") && screen.contains("p99 ms") && screen.contains("policy aioli"), "{screen}");
    assert!(t.run(&["send-keys", "-t", &t.0, "q"]).status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while t.alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!t.alive(), "q quits top (and so its tmux session)");
}

#[test]
fn top_once_prints_a_text_frame_and_a_missing_endpoint_is_one_line() {
    let s = Serve::start();
    let _load = Load::start(&s.addr, &["solo"]);
    let out = Command::new(SLUICE).args(["top", "--once", "--interval", "0.3", "--metrics", &s.metrics]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let row = text.lines().find(|l| l.starts_with("solo")).unwrap_or_else(|| panic!("a row for the application:\n{text}"));
    let mb_s: f64 = row.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(mb_s > 0.0, "a writing application shows throughput: {row}");
    // A port with nothing behind it.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let out = Command::new(SLUICE).args(["top", "--once", "--metrics", &free.to_string()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.lines().count() == 1 && err.contains("no metrics endpoint at"), "{err}");
}
