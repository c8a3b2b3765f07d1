//! The network: NICs and one store-and-forward switch in a star, after
//! PIOsimHD (seed `004_…`: "Store-and-Forward Switching", NICs and ports
//! with latency and throughput, data flows as packets, no overtaking).
//!
//! A message from node A to node B crosses three hops: A's NIC (send),
//! the switch backplane, B's NIC (receive). Each hop is a FIFO resource
//! with a bandwidth and a latency. A message crosses a hop as packets of
//! `packet_bytes`: the hop is busy for the whole message, and the next hop
//! may start once the first packet arrived (store-and-forward per packet),
//! but cannot finish before the last packet arrived. One event per hop
//! after the first, which the sender crosses when it sends (`World::send`).

use sluice_device::transfer_ns;

use crate::engine::Time;
use crate::scenario::Network;

/// Hops of a message between two nodes.
pub const HOPS: u8 = 3;

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
}
