//! The sensors layer: turns cumulative kernel counters (read by `probes`) into one typed snapshot
//! per tick per link and peer. Pure: readings and time are passed in, so resets, missed ticks
//! and flows that come and go are tested without a kernel.

use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use linkpilot_common::{FlowKey, FlowState, PeerStats};

pub use super::snapshot::{
    JobProgress, LinkSnapshot, MarkCounts, PeerSnapshot, RttSnapshot, Snapshot,
};
pub use crate::kernel::readings::{PeerReading, Readings};
use crate::sense::{
    job_marks::{Added, JobMarks, MarkSplit},
    rtt_window::RttWindow,
};

mod nic;
#[cfg(test)]
mod tests;

struct PeerState {
    prev: Option<PeerStats>,
    rtt: RttWindow,
    /// The samples of others' queue (`cross` in [`Sensors::tick`]) over the same window: their
    /// spread is the jitter a job's own bursts do not add.
    cross_rtt: RttWindow,
    /// Flows with a fresh sample at the last flow-table reading.
    flows: usize,
    marks: MarkSplit,
}

/// Turns readings into snapshots.
pub struct Sensors {
    window: Duration,
    last: Option<Duration>,
    peers: HashMap<(String, u32), PeerState>,
    /// `Readings::kernel_ns` of the previous tick: flows updated after it have fresh samples.
    /// Nothing is kept per flow for RTT, so its memory does not grow with the flow count (the
    /// mark split keeps each marked flow: [`JobMarks`]).
    last_kernel_ns: u64,
    /// NIC counters at the previous tick.
    nic: nic::NicRates,
    /// The reporting jobs' flows, as last found ([`Self::set_job_flows`]), and their marks.
    job_flows: HashSet<FlowKey>,
    /// The reporting jobs' own network namespaces (inode numbers): every flow in one is a job's.
    job_netns: HashSet<u32>,
    job_marks: JobMarks,
}

/// Counter delta that survives a reset (a reading below the previous one counts from zero).
fn delta(prev: u64, now: u64) -> u64 {
    if now >= prev {
        now - prev
    } else {
        now
    }
}

impl Sensors {
    /// Sensors whose RTT percentiles and minimum cover `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            last: None,
            peers: HashMap::new(),
            last_kernel_ns: 0,
            nic: nic::NicRates::default(),
            job_flows: HashSet::new(),
            job_netns: HashSet::new(),
            job_marks: JobMarks::default(),
        }
    }

    /// The reporting jobs' TCP flows from now on, and their own network namespaces (whose
    /// every flow is a job's): their marks are told from the others'.
    pub fn set_job_flows(&mut self, flows: HashSet<FlowKey>, netns: HashSet<u32>) {
        if flows.is_empty() && netns.is_empty() {
            // No job: no share of the marks is a job's, whatever the last one was.
            for p in self.peers.values_mut() {
                p.marks.clear_jobs();
            }
        }
        self.job_flows = flows;
        self.job_netns = netns;
        self.job_marks.looked_up();
    }

    /// Whether a flow of `flows` (this tick's flow-table reading) was marked since the jobs'
    /// flows were last set and is not one of them: a job's new connection may be, so look
    /// them up again before [`Self::tick`] gives its marks to anyone.
    pub fn unknown_owner(&self, flows: &[(FlowKey, FlowState)]) -> bool {
        self.job_marks.unknown_owner(flows, |k, f| self.is_job(k, f))
    }

    /// Whether a flow is a reporting job's.
    fn is_job(&self, k: &FlowKey, f: &FlowState) -> bool {
        self.job_flows.contains(k) || (f.netns != 0 && self.job_netns.contains(&f.netns))
    }

    /// One tick at time `now` (monotonic, since start).
    pub fn tick(&mut self, now: Duration, r: &Readings) -> Snapshot {
        let interval = self.last.map_or(Duration::ZERO, |l| now.saturating_sub(l));
        self.last = Some(now);
        let secs = interval.as_secs_f64();
        let per_s = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };

        // Fresh RTT samples: flows the tracepoint updated since the last reading, by (interface,
        // peer): one peer may be reached over several interfaces, each another link's.
        let mut fresh: HashMap<(u32, u32), Vec<u32>> = HashMap::new();
        // Samples of others' queue by the same key: a job's own flows count only with the first
        // sample of a burst, the one that did not queue behind the burst itself.
        let mut cross: HashMap<(u32, u32), Vec<u32>> = HashMap::new();
        let mut job_marks = Added::new();
        if !r.flows_skipped {
            let last = self.last_kernel_ns;
            for (k, f) in &r.flows {
                let row = (f.ifindex, f.peer);
                let sampled = f.last_ns > last && f.srtt_us > 0 && f.rtt_samples > 0;
                if sampled {
                    fresh.entry(row).or_default().push(f.srtt_us);
                }
                let job = self.is_job(k, f);
                self.job_marks.add(k, row, (f.ce_segs, f.ece_segs), job, &mut job_marks);
                let others = if job {
                    (f.burst_ns > last && f.burst_rtt_us > 0).then_some(f.burst_rtt_us)
                } else {
                    sampled.then_some(f.srtt_us)
                };
                if let Some(us) = others {
                    cross.entry(row).or_default().push(us);
                }
            }
            self.job_marks.end_reading();
            self.last_kernel_ns = r.kernel_ns;
        }

        let mut out = Vec::with_capacity(r.peers.len());
        for PeerReading { link, ifindex, peer, id, stats } in &r.peers {
            let window = self.window;
            let state = self.peers.entry((link.clone(), *id)).or_insert_with(|| PeerState {
                prev: None,
                rtt: RttWindow::new(window),
                cross_rtt: RttWindow::new(window),
                flows: 0,
                marks: MarkSplit::default(),
            });
            let prev = state.prev.unwrap_or(*stats);
            let d = |f: fn(&PeerStats) -> u64| delta(f(&prev), f(stats));
            let rx_ect = d(|s| s.rx.ecn[1]) + d(|s| s.rx.ecn[2]) + d(|s| s.rx.ecn[3]);
            let ce = d(|s| s.rx.ecn[3]);
            let tx_pkts = d(|s| s.tx.packets);
            let retrans = d(|s| s.retrans_segs);
            state.marks.count(ce, d(|s| s.rx.tcp_ece));
            let marks = if r.flows_skipped {
                MarkCounts::default()
            } else {
                state.marks.reading(job_marks.remove(&(*ifindex, *id)).unwrap_or_default())
            };
            let samples = fresh.remove(&(*ifindex, *id)).unwrap_or_default();
            if !r.flows_skipped {
                state.flows = samples.len();
            }
            let srtt_ms = (!samples.is_empty()).then(|| {
                samples.iter().map(|&us| f64::from(us)).sum::<f64>() / samples.len() as f64 / 1e3
            });
            let cross_samples = cross.remove(&(*ifindex, *id)).unwrap_or_default();
            let cross_ms = (!cross_samples.is_empty()).then(|| {
                cross_samples.iter().map(|&us| f64::from(us)).sum::<f64>()
                    / cross_samples.len() as f64
                    / 1e3
            });
            for &us in &samples {
                state.rtt.push(now, us);
            }
            state.rtt.expire(now);
            for &us in &cross_samples {
                state.cross_rtt.push(now, us);
            }
            state.cross_rtt.expire(now);
            let retrans_fraction =
                if tx_pkts > 0 { (retrans as f64 / tx_pkts as f64).min(1.0) } else { 0.0 };
            out.push(PeerSnapshot {
                link: link.clone(),
                peer: peer.clone(),
                rx_pps: per_s(d(|s| s.rx.packets)),
                tx_pps: per_s(tx_pkts),
                rx_bps: per_s(d(|s| s.rx.bytes)) * 8.0,
                tx_bps: per_s(d(|s| s.tx.bytes)) * 8.0,
                ce_fraction: if rx_ect > 0 { ce as f64 / rx_ect as f64 } else { 0.0 },
                ece_fraction: match d(|s| s.rx.packets) {
                    0 => 0.0,
                    n => (d(|s| s.rx.tcp_ece) as f64 / n as f64).min(1.0),
                },
                retrans_per_s: per_s(retrans),
                retrans_fraction,
                cnp_per_s: per_s(d(|s| s.rx_roce.cnp) + d(|s| s.tx_roce.cnp)),
                goodput_bps: per_s(d(|s| s.tx.bytes)) * 8.0 * (1.0 - retrans_fraction),
                rtt: RttSnapshot {
                    srtt_ms,
                    min_ms: state.rtt.min_ms(),
                    p50_ms: state.rtt.quantile_ms(0.5),
                    p99_ms: state.rtt.quantile_ms(0.99),
                    samples: state.rtt.samples() as usize,
                    cross_srtt_ms: cross_ms,
                    cross_samples: cross_samples.len(),
                    cross_p50_ms: state.cross_rtt.quantile_ms(0.5),
                    cross_p99_ms: state.cross_rtt.quantile_ms(0.99),
                },
                flows: state.flows,
                opens_per_s: per_s(d(|s| s.flows.active_opens) + d(|s| s.flows.passive_opens)),
                closes_per_s: per_s(d(|s| s.flows.closes)),
                failed_opens_per_s: per_s(d(|s| s.flows.failed_opens)),
                job_ce_share: state.marks.share.0,
                job_ece_share: state.marks.share.1,
                marks,
            });
            state.prev = Some(*stats);
        }
        let links = self.nic.rates(&r.nic, &per_s);
        Snapshot {
            at_ms: now.as_millis() as u64,
            interval_ms: interval.as_millis() as u64,
            peers: out,
            links,
            jobs: None,
        }
    }
}
