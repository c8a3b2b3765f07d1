//! The network: NICs and one store-and-forward switch in a star, after
//! PIOsimHD (seed `004_…`: "Store-and-Forward Switching", NICs and ports
//! with latency and throughput, data flows as packets, no overtaking).
//!
//! A message from node A to node B crosses three hops: A's NIC (send),
//! the switch backplane, B's NIC (receive). Each hop is a FIFO resource
//! with a bandwidth and a latency. A message crosses a hop as packets of
//! `packet_bytes`: the hop is busy for the whole message, and the next hop
//! may start once the first packet arrived (store-and-forward per packet),
//! but cannot finish before the last packet arrived. One event a message:
//! its head reaching the switch (`World::hop`). The sender crosses its NIC
//! when it sends (`World::send`), and the switch hands each message on to
//! the receiver's NIC in the order it took them, so that NIC is crossed
//! with the switch.

use sluice_device::transfer_ns;

use crate::engine::Time;
use crate::scenario::Network;

/// Hops of a message between two nodes.
pub const HOPS: u8 = 3;
/// The switch's hop; the receiver's NIC is the next.
pub const SWITCH: u8 = 1;

/// One FIFO link.
#[derive(Clone, Copy, Debug, Default)]
struct Link {
    free_at: Time,
    busy_ns: u64,
}

/// What a hop decided for a message: when its first packet reaches the
/// next hop, and when its last one does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Crossing {
    pub head_at: Time,
    pub tail_at: Time,
}

/// All links of the cluster.
pub struct Net {
    cfg: Network,
    tx: Vec<Link>,
    rx: Vec<Link>,
    switch: Link,
}

impl Net {
    pub fn new(cfg: &Network, nodes: usize) -> Net {
        Net { cfg: cfg.clone(), tx: vec![Link::default(); nodes], rx: vec![Link::default(); nodes], switch: Link::default() }
    }

    /// Cross hop `hop` (0 = sender's NIC, 1 = switch, 2 = receiver's NIC)
    /// of a `bytes` message whose head arrives now and whose tail arrives
    /// at `tail_at` (the send time on the first hop).
    pub fn cross(&mut self, now: Time, tail_at: Time, hop: u8, src: usize, dst: usize, bytes: u64) -> Crossing {
        let c = &self.cfg;
        let (link, bw, lat) = match hop {
            0 => (&mut self.tx[src], c.nic_bytes_per_s, c.nic_latency_ns),
            1 => (&mut self.switch, c.switch_bytes_per_s, c.switch_latency_ns),
            _ => (&mut self.rx[dst], c.nic_bytes_per_s, c.nic_latency_ns),
        };
        let whole = transfer_ns(bytes, bw);
        let first = transfer_ns(bytes.min(c.packet_bytes), bw);
        let start = now.max(link.free_at);
        let end = (start + whole).max(tail_at + first);
        link.free_at = end;
        link.busy_ns += end - start;
        Crossing { head_at: start + first + lat, tail_at: end + lat }
    }

    /// Prefetch the link hop `hop` of a message from `src` to `dst` uses.
    pub fn prefetch(&self, hop: u8, src: usize, dst: usize) {
        let link = match hop {
            0 => self.tx.get(src),
            1 => None,
            _ => self.rx.get(dst),
        };
        if let Some(l) = link {
            crate::engine::prefetch(l);
        }
    }

    /// Bytes on the wire for a request or reply carrying `payload` bytes.
    pub fn wire_bytes(&self, payload: u64) -> u64 {
        self.cfg.header_bytes + payload
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net() -> Net {
        let cfg = Network { nic_bytes_per_s: 100_000_000, nic_latency_ns: 200_000, switch_bytes_per_s: 1_000_000_000, switch_latency_ns: 0, packet_bytes: 1_000, header_bytes: 0 };
        Net::new(&cfg, 4)
    }

    #[test]
    fn one_message_crosses_three_hops_pipelined() {
        let mut n = net();
        // 100 KB at 100 MB/s = 1 ms on each NIC, 0.1 ms on the switch;
        // a 1 KB packet is 10 us on a NIC, 1 us on the switch.
        let a = n.cross(0, 0, 0, 0, 1, 100_000);
        assert_eq!(a, Crossing { head_at: 10_000 + 200_000, tail_at: 1_000_000 + 200_000 });
        let b = n.cross(a.head_at, a.tail_at, 1, 0, 1, 100_000);
        assert_eq!(b, Crossing { head_at: 211_000, tail_at: 1_201_000 });
        let c = n.cross(b.head_at, b.tail_at, 2, 0, 1, 100_000);
        // The receiving NIC cannot finish before the tail arrived + 1 packet.
        assert_eq!(c.tail_at, 1_201_000 + 10_000 + 200_000);
    }

    #[test]
    fn a_busy_link_queues_in_arrival_order() {
        let mut n = net();
        let first = n.cross(0, 0, 0, 0, 1, 100_000);
        let second = n.cross(0, 0, 0, 0, 2, 100_000);
        assert_eq!(second.tail_at, first.tail_at + 1_000_000);
        // Another sender's NIC is independent.
        assert_eq!(n.cross(0, 0, 0, 3, 1, 100_000), first);
    }

    /// `World::hop` crosses the receiver's NIC when the head reaches the
    /// switch. That equals crossing it when the head reaches the NIC, in
    /// the order heads reach it (ties in the order they were pushed),
    /// because the switch lets heads out in the order it takes them in.
    #[test]
    fn crossing_the_receivers_nic_with_the_switch_changes_nothing() {
        // Fast and slow switches, packets smaller and larger than the
        // messages, latencies with and without.
        let cfgs = [(1_000_000_000_000, 0, 1_500), (1_000_000_000, 0, 1_000), (125_000_000, 5_000, 9_000), (10_000_000_000, 300, 64)];
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rand = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for (switch_bw, switch_lat, packet) in cfgs {
            let cfg = Network {
                nic_bytes_per_s: 125_000_000,
                nic_latency_ns: 50_000,
                switch_bytes_per_s: switch_bw,
                switch_latency_ns: switch_lat,
                packet_bytes: packet,
                header_bytes: 0,
            };
            for _ in 0..50 {
                // Messages reaching the switch in time order (heads
                // at equal times too), tails up to 1 ms behind.
                let mut t = 0;
                let msgs: Vec<(Time, Time, usize, u64)> = (0..200)
                    .map(|_| {
                        t += rand(3) * rand(20_000);
                        let bytes = [0, 1, 128, 1_500, 4_096, 65_536 + 128][rand(6) as usize];
                        (t, t + rand(1_000_000), rand(3) as usize, bytes)
                    })
                    .collect();
                let (mut eager, mut late) = (Net::new(&cfg, 4), Net::new(&cfg, 4));
                let mut at_once = Vec::new();
                let mut heads = Vec::new();
                for (i, &(head, tail, dst, bytes)) in msgs.iter().enumerate() {
                    let sw = eager.cross(head, tail, SWITCH, 3, dst, bytes);
                    at_once.push(eager.cross(sw.head_at, sw.tail_at, SWITCH + 1, 3, dst, bytes));
                    let sw = late.cross(head, tail, SWITCH, 3, dst, bytes);
                    heads.push((sw.head_at, i, sw.tail_at));
                }
                heads.sort();
                let mut by_event = vec![None; msgs.len()];
                for (head, i, tail) in heads {
                    let (_, _, dst, bytes) = msgs[i];
                    by_event[i] = Some(late.cross(head, tail, SWITCH + 1, 3, dst, bytes));
                }
                let by_event: Vec<Crossing> = by_event.into_iter().map(Option::unwrap).collect();
                assert_eq!(at_once, by_event);
                for d in 0..3 {
                    assert_eq!(eager.rx[d].busy_ns, late.rx[d].busy_ns);
                }
            }
        }
    }
}
