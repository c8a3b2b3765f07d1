//! Scale-out benchmark: one large striped file (1 MiB stripes over every
//! data server) read by several clients at once, with 1, 2 and 4 data
//! servers, each on its own emulated 7200 rpm disk (`hdd7200`).
//!
//! `cargo run --release -p sluice-cluster --example scaleout -- [MIB] [CLIENTS] [REQUEST_MIB] [POLICY]`
//! (defaults: 256 MiB, 4 clients, 4 MiB requests, aioli). Each client reads its
//! contiguous share of the file in requests of REQUEST_MIB; the figure is
//! file bytes / wall time of the slowest client.

use std::time::Instant;

use sluice_client::ConnectOptions;
use sluice_cluster::{LayoutRequest, LocalCluster, LocalClusterConfig, StripedClient};
use sluice_server::DeviceKind;

fn main() {
    let arg = |i: usize, d: u64| std::env::args().nth(i).map_or(d, |a| a.parse().expect("a number"));
    let (mib, clients, req_mib) = (arg(1, 256), arg(2, 4), arg(3, 4));
    let policy = std::env::args().nth(4).unwrap_or_else(|| "aioli".into());
    let size = mib << 20;
    println!("servers\tMiB/s\tspeed-up\t({mib} MiB file, {clients} clients, {req_mib} MiB requests, 1 MiB stripes, hdd7200, {policy})");
    let mut one = 0.0;
    for servers in [1u32, 2, 4] {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut cfg = LocalClusterConfig::new(dir.path(), servers);
        cfg.device = DeviceKind::Hdd7200;
        cfg.policy = sluice_core::PolicyConfig::from_name(&policy).expect("a known policy");
        let cluster = LocalCluster::start(cfg).expect("cluster");
        let w = StripedClient::connect(&cluster.addr()).expect("connect");
        let f = w.create("big.dat", LayoutRequest { stripe_bytes: 1 << 20, count: -1, start: 0 }).expect("create");
        let chunk = vec![0x5au8; 16 << 20];
        for at in (0..size).step_by(chunk.len()) {
            w.pwrite(&f, &chunk[..chunk.len().min((size - at) as usize)], at).expect("write");
        }
        w.fsync(&f).expect("fsync");
        let share = size / clients;
        let t = Instant::now();
        std::thread::scope(|s| {
            for k in 0..clients {
                let addr = cluster.addr();
                s.spawn(move || {
                    let c = StripedClient::connect_with(&addr, ConnectOptions { app: Some(format!("reader-{k}")), ..ConnectOptions::default() }).expect("connect");
                    let f = c.open("big.dat", libc::O_RDONLY).expect("open");
                    let mut buf = vec![0u8; (req_mib << 20) as usize];
                    let mut at = k * share;
                    while at < (k + 1) * share {
                        let n = buf.len().min(((k + 1) * share - at) as usize);
                        assert_eq!(c.read_list(&f, &[(at, n as u64)], &mut buf[..n]).expect("read"), n);
                        assert!(buf[..n].iter().all(|&b| b == 0x5a), "wrong bytes at {at}");
                        at += n as u64;
                    }
                });
            }
        });
        let mibs = (share * clients) as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64();
        if servers == 1 {
            one = mibs;
        }
        println!("{servers}\t{mibs:.1}\t{:.2}x", mibs / one);
    }
}
