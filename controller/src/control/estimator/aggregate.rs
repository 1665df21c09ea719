//! One link's share of a snapshot, summed from its rows. Separate from the estimator because it
//! is the per-row hot path (`Core::aggregate` calls it for every row of every tick) and knows
//! only the snapshot's layout, none of the estimator's state.

use crate::sense::sensors::{LinkSnapshot, PeerSnapshot};

/// One link's share of a snapshot, summed in one pass over its rows: rates add up, shares are
/// weighted by their packets, RTT percentiles are the worst peer's, srtt is flow-weighted.
#[derive(Clone, Copy, Debug, Default)]
pub struct Aggregate {
    pub rx_pps: f64,
    pub tx_pps: f64,
    pub ce_pps: f64,
    /// Marks not on the reporting jobs' flows.
    pub cross_ce_pps: f64,
    pub retrans_per_s: f64,
    pub cnp_per_s: f64,
    pub goodput_bps: f64,
    pub rx_bps: f64,
    pub srtt_sum: f64,
    pub srtt_weight: f64,
    /// Samples of others' queue, summed and counted.
    pub cross_sum: f64,
    pub cross_weight: f64,
    pub min_ms: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// The worst peer's percentiles of the samples of others' queue.
    pub cross_p50_ms: Option<f64>,
    pub cross_p99_ms: Option<f64>,
}

fn max_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

impl Aggregate {
    #[inline]
    pub fn add(&mut self, p: &PeerSnapshot) {
        self.rx_pps += p.rx_pps;
        self.tx_pps += p.tx_pps;
        // A receiver sees CE, a sender sees it echoed as ECE: either is congestion on the path.
        self.ce_pps += p.ce_fraction.max(p.ece_fraction) * p.rx_pps;
        let cross =
            (p.ce_fraction * (1.0 - p.job_ce_share)).max(p.ece_fraction * (1.0 - p.job_ece_share));
        self.cross_ce_pps += cross * p.rx_pps;
        self.retrans_per_s += p.retrans_per_s;
        self.cnp_per_s += p.cnp_per_s;
        self.goodput_bps += p.goodput_bps;
        self.rx_bps += p.rx_bps;
        if let Some(srtt) = p.rtt.srtt_ms {
            let w = p.flows.max(1) as f64;
            self.srtt_sum += srtt * w;
            self.srtt_weight += w;
        }
        if let Some(ms) = p.rtt.cross_srtt_ms {
            let w = p.rtt.cross_samples.max(1) as f64;
            self.cross_sum += ms * w;
            self.cross_weight += w;
        }
        self.min_ms = match (self.min_ms, p.rtt.min_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.p50_ms = max_opt(self.p50_ms, p.rtt.p50_ms);
        self.p99_ms = max_opt(self.p99_ms, p.rtt.p99_ms);
        self.cross_p50_ms = max_opt(self.cross_p50_ms, p.rtt.cross_p50_ms);
        self.cross_p99_ms = max_opt(self.cross_p99_ms, p.rtt.cross_p99_ms);
    }

    /// The RDMA NIC's CNPs (handled as the sender told to slow down) join the TC-seen ones.
    pub fn add_nic(&mut self, l: &LinkSnapshot) {
        self.cnp_per_s += l.cnp_handled_per_s;
    }
}
