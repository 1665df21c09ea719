//! The sensors layer: turns cumulative kernel counters (read by `probes`) into one typed snapshot
//! per tick per link and peer. Pure: readings and time are passed in, so resets, missed ticks
//! and flows that come and go are tested without a kernel.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    time::Duration,
};

use linkpilot_common::{FlowKey, FlowState, PeerStats};
use serde::{Deserialize, Serialize};

use crate::rdma::RdmaPort;

/// One reading of the kernel's counters.
#[derive(Clone, Debug, Default)]
pub struct Readings {
    /// (link name, peer name, peer id, counters) for every watched link and peer.
    pub peers: Vec<(String, String, u32, PeerStats)>,
    /// The flow table.
    pub flows: Vec<(FlowKey, FlowState)>,
    /// (link name, the RDMA ports whose netdev it is) for every watched link.
    pub nic: Vec<(String, Vec<RdmaPort>)>,
}

/// RTT over the estimator window, milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RttSnapshot {
    /// Mean of the smoothed RTTs sampled during this tick.
    pub srtt_ms: Option<f64>,
    /// Smallest smoothed RTT in the window.
    pub min_ms: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Flow samples in the window.
    pub samples: usize,
}

/// Signals of one peer of one link over the last tick.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerSnapshot {
    pub link: String,
    pub peer: String,
    pub rx_pps: f64,
    pub tx_pps: f64,
    pub rx_bps: f64,
    pub tx_bps: f64,
    /// CE share of the ECN-capable packets received.
    pub ce_fraction: f64,
    /// Retransmitted TCP segments per second, and as a share of segments sent.
    pub retrans_per_s: f64,
    pub retrans_fraction: f64,
    /// RoCEv2 CNPs per second, both directions.
    pub cnp_per_s: f64,
    /// Bits per second sent to this peer that were not retransmissions (`tx_bps` scaled by
    /// `1 - retrans_fraction`): the useful sending rate, to hold against link capacity.
    pub goodput_bps: f64,
    pub rtt: RttSnapshot,
    /// Active flows to this peer (updated during the tick).
    pub flows: usize,
    /// TCP connections established (either side opening) and closed per second, and
    /// connection attempts that failed.
    pub opens_per_s: f64,
    pub closes_per_s: f64,
    pub failed_opens_per_s: f64,
}

/// What the RDMA NIC behind a link counted over the last tick: RoCE traffic the NIC offloads
/// never reaches the TC hooks, so its congestion signals come from here.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkSnapshot {
    pub link: String,
    /// `device/port` of each RDMA port on this link, with its state ("mlx5_0/1 ACTIVE").
    pub rdma_ports: Vec<String>,
    /// CNPs the NIC acted on as a sender told to slow down (`rp_cnp_handled`), per second.
    pub cnp_handled_per_s: f64,
    /// CNPs the NIC sent as a receiver of CE-marked packets (`np_cnp_sent`), per second.
    pub cnp_sent_per_s: f64,
    /// CE-marked RoCE packets received (`np_ecn_marked_roce_packets`), per second.
    pub ecn_marked_per_s: f64,
    /// Events that make the requester resend (`local_ack_timeout_err`, `packet_seq_err`,
    /// `implied_nak_seq_err`, `roce_adp_retrans`), per second.
    pub retrans_events_per_s: f64,
    /// Every signal counter of [`crate::rdma::SIGNAL_COUNTERS`] present, per second, summed over
    /// the link's ports.
    pub counters_per_s: BTreeMap<String, f64>,
}

const NIC_RETRANS_EVENTS: [&str; 4] =
    ["local_ack_timeout_err", "packet_seq_err", "implied_nak_seq_err", "roce_adp_retrans"];

/// Everything the sensors saw in one tick.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Time since the sensors started.
    pub at_ms: u64,
    /// Length of the interval the rates cover (longer than a tick after missed ticks).
    pub interval_ms: u64,
    pub peers: Vec<PeerSnapshot>,
    /// Links with RDMA ports behind them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<LinkSnapshot>,
}

/// Most flow samples kept per peer for the percentiles, whatever the flow count.
const MAX_RTT_SAMPLES: usize = 20_000;

#[derive(Default)]
struct PeerState {
    prev: Option<PeerStats>,
    /// (time, srtt ms) of flow samples inside the window.
    rtt: VecDeque<(Duration, f64)>,
}

/// Turns readings into snapshots.
pub struct Sensors {
    window: Duration,
    last: Option<Duration>,
    peers: HashMap<(String, u32), PeerState>,
    /// Samples count of each flow at the previous tick, to take only fresh srtt values.
    flow_samples: HashMap<FlowKey, u64>,
    /// NIC counters at the previous tick, by (link, device, port, counter).
    nic_prev: HashMap<(String, String, u32, String), u64>,
}

/// Counter delta that survives a reset (a reading below the previous one counts from zero).
fn delta(prev: u64, now: u64) -> u64 {
    if now >= prev {
        now - prev
    } else {
        now
    }
}

fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

impl Sensors {
    /// Sensors whose RTT percentiles and minimum cover `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            last: None,
            peers: HashMap::new(),
            flow_samples: HashMap::new(),
            nic_prev: HashMap::new(),
        }
    }

    /// One tick at time `now` (monotonic, since start).
    pub fn tick(&mut self, now: Duration, r: &Readings) -> Snapshot {
        let interval = self.last.map_or(Duration::ZERO, |l| now.saturating_sub(l));
        self.last = Some(now);
        let secs = interval.as_secs_f64();
        let per_s = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };

        // Fresh RTT samples: flows whose sample count moved since the last tick.
        let mut fresh: HashMap<u32, Vec<f64>> = HashMap::new();
        let mut active: HashMap<u32, usize> = HashMap::new();
        let mut seen = HashMap::with_capacity(r.flows.len());
        for (k, f) in &r.flows {
            let before = self.flow_samples.get(k).copied().unwrap_or(0);
            if f.rtt_samples != before && f.srtt_us > 0 {
                fresh.entry(f.peer).or_default().push(f64::from(f.srtt_us) / 1e3);
                *active.entry(f.peer).or_default() += 1;
            }
            seen.insert(*k, f.rtt_samples);
        }
        // Flows that left the table are forgotten with it: memory follows the kernel's bound.
        self.flow_samples = seen;

        let mut out = Vec::with_capacity(r.peers.len());
        for (link, peer, id, stats) in &r.peers {
            let state = self.peers.entry((link.clone(), *id)).or_default();
            let prev = state.prev.unwrap_or(*stats);
            let d = |f: fn(&PeerStats) -> u64| delta(f(&prev), f(stats));
            let rx_ect = d(|s| s.rx.ecn[1]) + d(|s| s.rx.ecn[2]) + d(|s| s.rx.ecn[3]);
            let ce = d(|s| s.rx.ecn[3]);
            let tx_pkts = d(|s| s.tx.packets);
            let retrans = d(|s| s.retrans_segs);
            let samples = fresh.remove(id).unwrap_or_default();
            let srtt_ms =
                (!samples.is_empty()).then(|| samples.iter().sum::<f64>() / samples.len() as f64);
            state.rtt.extend(samples.into_iter().map(|ms| (now, ms)));
            while state.rtt.front().is_some_and(|(t, _)| now.saturating_sub(*t) > self.window)
                || state.rtt.len() > MAX_RTT_SAMPLES
            {
                state.rtt.pop_front();
            }
            let retrans_fraction =
                if tx_pkts > 0 { (retrans as f64 / tx_pkts as f64).min(1.0) } else { 0.0 };
            let mut sorted: Vec<f64> = state.rtt.iter().map(|(_, ms)| *ms).collect();
            sorted.sort_by(f64::total_cmp);
            out.push(PeerSnapshot {
                link: link.clone(),
                peer: peer.clone(),
                rx_pps: per_s(d(|s| s.rx.packets)),
                tx_pps: per_s(tx_pkts),
                rx_bps: per_s(d(|s| s.rx.bytes)) * 8.0,
                tx_bps: per_s(d(|s| s.tx.bytes)) * 8.0,
                ce_fraction: if rx_ect > 0 { ce as f64 / rx_ect as f64 } else { 0.0 },
                retrans_per_s: per_s(retrans),
                retrans_fraction,
                cnp_per_s: per_s(d(|s| s.rx_roce.cnp) + d(|s| s.tx_roce.cnp)),
                goodput_bps: per_s(d(|s| s.tx.bytes)) * 8.0 * (1.0 - retrans_fraction),
                rtt: RttSnapshot {
                    srtt_ms,
                    min_ms: sorted.first().copied(),
                    p50_ms: percentile(&sorted, 0.5),
                    p99_ms: percentile(&sorted, 0.99),
                    samples: sorted.len(),
                },
                flows: active.get(id).copied().unwrap_or(0),
                opens_per_s: per_s(d(|s| s.flows.active_opens) + d(|s| s.flows.passive_opens)),
                closes_per_s: per_s(d(|s| s.flows.closes)),
                failed_opens_per_s: per_s(d(|s| s.flows.failed_opens)),
            });
            state.prev = Some(*stats);
        }
        let links = self.nic(&r.nic, &per_s);
        Snapshot {
            at_ms: now.as_millis() as u64,
            interval_ms: interval.as_millis() as u64,
            peers: out,
            links,
        }
    }

    /// NIC counter rates per link; a port or counter seen for the first time starts at zero.
    fn nic(
        &mut self,
        nic: &[(String, Vec<RdmaPort>)],
        per_s: &dyn Fn(u64) -> f64,
    ) -> Vec<LinkSnapshot> {
        let mut seen = HashMap::new();
        let mut out = Vec::new();
        for (link, ports) in nic.iter().filter(|(_, p)| !p.is_empty()) {
            let mut snap = LinkSnapshot { link: link.clone(), ..LinkSnapshot::default() };
            for p in ports {
                snap.rdma_ports.push(format!("{}/{} {}", p.device, p.port, p.state));
                for (name, &now) in &p.signals {
                    let key = (link.clone(), p.device.clone(), p.port, name.clone());
                    let prev = self.nic_prev.get(&key).copied().unwrap_or(now);
                    *snap.counters_per_s.entry(name.clone()).or_default() +=
                        per_s(delta(prev, now));
                    seen.insert(key, now);
                }
            }
            let rate = |name: &str| snap.counters_per_s.get(name).copied().unwrap_or(0.0);
            snap.cnp_handled_per_s = rate("rp_cnp_handled");
            snap.cnp_sent_per_s = rate("np_cnp_sent");
            snap.ecn_marked_per_s = rate("np_ecn_marked_roce_packets");
            snap.retrans_events_per_s = NIC_RETRANS_EVENTS.iter().map(|n| rate(n)).sum();
            out.push(snap);
        }
        // Ports that went away are forgotten with them.
        self.nic_prev = seen;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(rx: u64, ect0: u64, ce: u64, tx: u64, retrans: u64) -> PeerStats {
        let mut s = PeerStats::default();
        s.rx.packets = rx;
        s.rx.bytes = rx * 1500;
        s.rx.ecn[2] = ect0;
        s.rx.ecn[3] = ce;
        s.tx.packets = tx;
        s.tx.bytes = tx * 1000;
        s.retrans_segs = retrans;
        s
    }

    fn readings(s: PeerStats, flows: Vec<(FlowKey, FlowState)>) -> Readings {
        Readings { peers: vec![("eth0".into(), "us".into(), 1, s)], flows, nic: vec![] }
    }

    fn flow(port: u16, srtt_us: u32, samples: u64) -> (FlowKey, FlowState) {
        let k = FlowKey { family: 2, local_port: port, remote_port: 5201, ..FlowKey::default() };
        (k, FlowState { srtt_us, rtt_samples: samples, peer: 1, ..FlowState::default() })
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn rates_and_fractions_over_the_interval() {
        let mut s = Sensors::new(Duration::from_secs(10));
        s.tick(Duration::ZERO, &readings(stats(0, 0, 0, 0, 0), vec![]));
        let snap = s.tick(S, &readings(stats(1000, 900, 100, 2000, 20), vec![]));
        let p = &snap.peers[0];
        assert_eq!((p.rx_pps, p.tx_pps, p.retrans_per_s), (1000.0, 2000.0, 20.0));
        assert_eq!(p.ce_fraction, 0.1);
        assert_eq!(p.retrans_fraction, 0.01);
        assert_eq!(p.goodput_bps, 2000.0 * 1000.0 * 8.0 * 0.99);
    }

    #[test]
    fn missed_ticks_stretch_the_interval_and_resets_count_from_zero() {
        let mut s = Sensors::new(Duration::from_secs(10));
        s.tick(Duration::ZERO, &readings(stats(0, 0, 0, 0, 0), vec![]));
        let snap = s.tick(3 * S, &readings(stats(3000, 0, 0, 0, 0), vec![]));
        assert_eq!((snap.interval_ms, snap.peers[0].rx_pps), (3000, 1000.0));
        // The counters were recreated (interface re-added): 500 since then, not a huge wrap.
        let snap = s.tick(4 * S, &readings(stats(500, 0, 0, 0, 0), vec![]));
        assert_eq!(snap.peers[0].rx_pps, 500.0);
    }

    #[test]
    fn rtt_percentiles_over_the_window_from_fresh_flow_samples() {
        let mut s = Sensors::new(Duration::from_secs(2));
        let base = stats(0, 0, 0, 0, 0);
        s.tick(Duration::ZERO, &readings(base, vec![]));
        let flows: Vec<_> = (0..100).map(|i| flow(i, 180_000 + u32::from(i) * 100, 1)).collect();
        let snap = s.tick(S, &readings(base, flows.clone()));
        let rtt = snap.peers[0].rtt;
        assert_eq!(rtt.samples, 100);
        assert_eq!(rtt.min_ms, Some(180.0));
        assert_eq!(rtt.p50_ms, Some(184.9));
        assert_eq!(rtt.p99_ms, Some(189.8));
        assert_eq!(snap.peers[0].flows, 100);
        // Same sample counts: stale, nothing new; the window still holds the old samples.
        let snap = s.tick(2 * S, &readings(base, flows));
        assert_eq!((snap.peers[0].rtt.srtt_ms, snap.peers[0].rtt.samples), (None, 100));
        // Past the window they are gone.
        let snap = s.tick(4 * S, &readings(base, vec![]));
        assert_eq!(snap.peers[0].rtt, RttSnapshot::default());
    }

    #[test]
    fn departed_flows_are_forgotten() {
        let mut s = Sensors::new(Duration::from_secs(10));
        let base = stats(0, 0, 0, 0, 0);
        s.tick(Duration::ZERO, &readings(base, (0..1000).map(|i| flow(i, 1000, 1)).collect()));
        assert_eq!(s.flow_samples.len(), 1000);
        s.tick(S, &readings(base, vec![flow(1, 1000, 2)]));
        assert_eq!(s.flow_samples.len(), 1);
    }

    fn port(cnp_handled: u64, timeouts: u64) -> RdmaPort {
        let signals = BTreeMap::from([
            ("rp_cnp_handled".to_owned(), cnp_handled),
            ("local_ack_timeout_err".to_owned(), timeouts),
        ]);
        RdmaPort {
            device: "mlx5_0".into(),
            port: 1,
            state: "ACTIVE".into(),
            signals,
            ..RdmaPort::default()
        }
    }

    #[test]
    fn nic_counter_rates_per_link() {
        let mut s = Sensors::new(Duration::from_secs(10));
        let at = |cnp, to| Readings {
            nic: vec![("eth2".into(), vec![port(cnp, to)])],
            ..Readings::default()
        };
        let first = s.tick(Duration::ZERO, &at(5000, 10));
        assert_eq!(first.links[0].cnp_handled_per_s, 0.0, "the first reading is the baseline");
        let snap = s.tick(2 * S, &at(5400, 14));
        let l = &snap.links[0];
        assert_eq!(
            (l.link.as_str(), l.rdma_ports.clone()),
            ("eth2", vec!["mlx5_0/1 ACTIVE".to_owned()])
        );
        assert_eq!((l.cnp_handled_per_s, l.retrans_events_per_s), (200.0, 2.0));
        // The driver was reloaded: counters restart from zero.
        let snap = s.tick(3 * S, &at(30, 0));
        assert_eq!(snap.links[0].cnp_handled_per_s, 30.0);
        // Links without RDMA ports carry no NIC section.
        let none = Readings { nic: vec![("eth0".into(), vec![])], ..Readings::default() };
        assert!(s.tick(4 * S, &none).links.is_empty());
    }

    #[test]
    fn connection_rates() {
        let mut s = Sensors::new(Duration::from_secs(10));
        s.tick(Duration::ZERO, &readings(stats(0, 0, 0, 0, 0), vec![]));
        let mut b = stats(0, 0, 0, 0, 0);
        b.flows.active_opens = 6;
        b.flows.passive_opens = 4;
        b.flows.closes = 5;
        b.flows.failed_opens = 1;
        let p = &s.tick(S, &readings(b, vec![])).peers[0];
        assert_eq!((p.opens_per_s, p.closes_per_s, p.failed_opens_per_s), (10.0, 5.0, 1.0));
    }
}
