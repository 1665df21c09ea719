//! The per-(interface, peer) series (`linkpilot_peer_*`): RTT, bytes on the wire, shares and
//! rates of one row of a snapshot, and the congestion marks on the jobs' flows and others'.

use prometheus_client::{
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use super::{family, labels, Labels, F64};
use crate::sense::sensors::PeerSnapshot;

const RTT_STATS: [&str; 4] = ["srtt", "min", "p50", "p99"];
const DIRECTIONS: [&str; 2] = ["rx", "tx"];
const MARKS: [(&str, &str); 4] = [("ce", "job"), ("ce", "other"), ("ece", "job"), ("ece", "other")];

#[derive(Clone)]
pub struct PeerMetrics {
    rtt: Family<Labels, F64>,
    bits: Family<Labels, F64>,
    f64s: Vec<(&'static str, Family<Labels, F64>)>,
    marks: Family<Labels, Counter>,
}

impl PeerMetrics {
    pub fn register(r: &mut Registry) -> Self {
        let rtt = family(
            r,
            "peer_rtt_seconds",
            "Peer RTT: srtt (mean of the last flow-table reading), min, p50, p99",
        );
        let bits = family(r, "peer_bytes_per_second", "Bytes per second on the wire, by direction");
        let f64s = [
            ("peer_goodput_bytes_per_second", "Goodput (acknowledged payload)"),
            ("peer_ce_fraction", "CE share of received packets"),
            ("peer_ece_fraction", "ECE share of received TCP segments"),
            ("peer_retrans_per_second", "TCP segments retransmitted per second"),
            ("peer_cnp_per_second", "RoCEv2 CNPs per second"),
            ("peer_flows", "TCP flows with a fresh RTT sample"),
        ]
        .map(|(n, h)| (n, family(r, n, h)))
        .to_vec();
        let marks = family(
            r,
            "peer_marks",
            "Congestion marks received: CE-marked packets (mark=ce) and ECE segments (mark=ece), \
             on the flows of jobs reporting on this host (flows=job) or on others' (flows=other)",
        );
        Self { rtt, bits, f64s, marks }
    }

    /// One row of a snapshot. `flows_read`: the flow table was read this tick; when it was not
    /// (a large table is read less often than ticks come), srtt keeps the value of the last
    /// reading rather than vanishing between two scrapes.
    pub fn row(&self, p: &PeerSnapshot, flows_read: bool) {
        let l = labels(&[("interface", &p.link), ("peer", &p.peer)]);
        let with = |k: &str, v: &str| {
            let mut ls = l.clone();
            ls.push((k.into(), v.into()));
            ls
        };
        let rtt = [p.rtt.srtt_ms, p.rtt.min_ms, p.rtt.p50_ms, p.rtt.p99_ms];
        for (stat, v) in RTT_STATS.into_iter().zip(rtt) {
            if stat == "srtt" && !flows_read {
                continue;
            }
            match v {
                Some(v) => _ = self.rtt.get_or_create(&with("stat", stat)).set(v / 1e3),
                None => _ = self.rtt.remove(&with("stat", stat)),
            }
        }
        for (dir, v) in DIRECTIONS.into_iter().zip([p.rx_bps / 8.0, p.tx_bps / 8.0]) {
            self.bits.get_or_create(&with("direction", dir)).set(v);
        }
        for (name, v) in [
            ("peer_goodput_bytes_per_second", p.goodput_bps / 8.0),
            ("peer_ce_fraction", p.ce_fraction),
            ("peer_ece_fraction", p.ece_fraction),
            ("peer_retrans_per_second", p.retrans_per_s),
            ("peer_cnp_per_second", p.cnp_per_s),
            ("peer_flows", p.flows as f64),
        ] {
            if let Some((_, f)) = self.f64s.iter().find(|(n, _)| *n == name) {
                f.get_or_create(&l).set(v);
            }
        }
        let m = &p.marks;
        let counts =
            [m.job_ce, m.ce.saturating_sub(m.job_ce), m.job_ece, m.ece.saturating_sub(m.job_ece)];
        for ((mark, flows), n) in MARKS.into_iter().zip(counts) {
            let mut ls = l.clone();
            ls.extend(labels(&[("mark", mark), ("flows", flows)]));
            self.marks.get_or_create(&ls).inc_by(n);
        }
    }

    /// Removes every series of the row (`iface`, `peer`), whatever values it was written with.
    pub fn remove(&self, iface: &str, peer: &str) {
        let l = labels(&[("interface", iface), ("peer", peer)]);
        let at = |k: &str, v: &str| labels(&[("interface", iface), ("peer", peer), (k, v)]);
        RTT_STATS.iter().for_each(|st| _ = self.rtt.remove(&at("stat", st)));
        DIRECTIONS.iter().for_each(|d| _ = self.bits.remove(&at("direction", d)));
        self.f64s.iter().for_each(|(_, f)| _ = f.remove(&l));
        for (mark, flows) in MARKS {
            let mut ls = l.clone();
            ls.extend(labels(&[("mark", mark), ("flows", flows)]));
            self.marks.remove(&ls);
        }
    }
}
