//! The link estimator: turns one sensors snapshot per tick into the signals the thresholds
//! speak of. EWMAs with a time-based weight (so a gap of missed ticks weighs as the time it
//! spans), a windowed-min RTT baseline (BBR-style), windowed maxima of delivery rate and RTT
//! p99, and the RTT gradient. Rates already come from counter deltas that survive resets and
//! missed ticks (the sensors layer). RTT signals age out: a window with no RTT samples (an idle
//! link) makes them unmeasured again, so a state entered on RTT is not held by old news.

use std::{
    collections::{HashSet, VecDeque},
    time::Duration,
};

use serde::{Deserialize, Serialize};

use super::policy::{EstimatorConfig, Link};
use crate::sense::sensors::{LinkSnapshot, PeerSnapshot};

/// The link's signals after one tick.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Signals {
    pub at_ms: u64,
    /// EWMA of the smoothed RTT, ms (`None` before the first sample).
    pub rtt_ms: Option<f64>,
    /// Smallest RTT over the baseline window, ms.
    pub baseline_ms: Option<f64>,
    /// `rtt_ms / baseline_ms - 1`.
    pub rtt_inflation: f64,
    /// EWMA of the RTT samples that show others' queue (`RttSnapshot::cross_srtt_ms`), ms.
    #[serde(default)]
    pub cross_rtt_ms: Option<f64>,
    /// `cross_rtt_ms / baseline_ms - 1`: the queueing delay others' traffic causes, without what
    /// a reporting job's own bursts add. Equal to `rtt_inflation` while no job reports.
    #[serde(default)]
    pub cross_rtt_inflation: f64,
    pub rtt_p50_ms: Option<f64>,
    pub rtt_p99_ms: Option<f64>,
    /// p99 - p50.
    pub jitter_ms: f64,
    /// Change of the RTT EWMA, ms per second.
    pub rtt_gradient: f64,
    /// Largest RTT p99 over the peak window, ms.
    pub peak_p99_ms: Option<f64>,
    /// CE share of received packets, or ECE share of received segments (a sender sees the marks
    /// echoed), whichever is higher; EWMA.
    pub ce_fraction: f64,
    /// The same, counting only the marks that were not on the flows of jobs reporting on this
    /// host: congestion from others' traffic. Equal to `ce_fraction` when no job reports.
    #[serde(default)]
    pub cross_ce_fraction: f64,
    pub retrans: f64,
    pub cnp_per_s: f64,
    pub goodput_bps: f64,
    /// Largest goodput EWMA over the window: the delivery rate the link has shown it can carry.
    pub delivery_bps: f64,
    /// Largest goodput of a single tick over the window of ticks that carried data (at least
    /// `min_packet_rate` packets and some payload; idle ticks neither enter nor age it): what
    /// bursty traffic (a job that syncs every H steps) shows the link carries, where its EWMA
    /// shows the average, which would shrink as the bursts grow rarer.
    pub burst_bps: f64,
    /// Largest EWMA of the bits received over the window: what a receiving host sees the link
    /// carry (its goodput counts only what it sends).
    #[serde(default)]
    pub received_bps: f64,
    /// Goodput as a share of the link's nominal capacity.
    pub goodput_fraction: f64,
    /// Whether the link carried traffic this tick (goodput conditions need it).
    pub active: bool,
    /// How long the link has gone without receiving a packet since it retransmitted one, ms:
    /// 0 once anything arrives. A dead link shows here while its shares are unmeasured (the
    /// retransmissions into it are far below `min_packet_rate`).
    #[serde(default)]
    pub unanswered_ms: f64,
}

/// Max (or, negated, min) over a sliding time window, amortised O(1).
#[derive(Default)]
struct WindowedMax {
    q: VecDeque<(Duration, f64)>,
}

impl WindowedMax {
    fn push(&mut self, now: Duration, v: f64, window: Duration) {
        while self.q.back().is_some_and(|&(_, b)| b <= v) {
            self.q.pop_back();
        }
        self.q.push_back((now, v));
        while self.q.front().is_some_and(|&(t, _)| now.saturating_sub(t) > window) {
            self.q.pop_front();
        }
    }

    /// Forgets values older than `window` (pushes do too, but an idle link pushes nothing).
    fn expire(&mut self, now: Duration, window: Duration) {
        while self.q.front().is_some_and(|&(t, _)| now.saturating_sub(t) > window) {
            self.q.pop_front();
        }
    }

    fn get(&self) -> Option<f64> {
        self.q.front().map(|&(_, v)| v)
    }
}

struct Ewma {
    half_life: f64,
    value: Option<f64>,
}

impl Ewma {
    fn update(&mut self, v: f64, dt: f64) -> f64 {
        let next = match self.value {
            None => v,
            Some(old) => {
                let w = 1.0 - 0.5f64.powf(dt / self.half_life);
                old + w * (v - old)
            }
        };
        self.value = Some(next);
        next
    }
}

/// Per-link estimator state.
pub struct Estimator {
    cfg: EstimatorConfig,
    link: Link,
    peer_names: HashSet<String>,
    last: Option<Duration>,
    rtt: Ewma,
    cross_rtt: Ewma,
    cross_seen: Option<Duration>,
    /// When the last srtt sample and the last percentiles came: RTT signals older than the
    /// window are unmeasured.
    srtt_seen: Option<Duration>,
    percentiles_seen: Option<Duration>,
    /// Shares are ratios of EWMAs (marked over all packets), so each packet weighs the same
    /// however the ticks slice them.
    ce_pps: Ewma,
    cross_ce_pps: Ewma,
    rx_pps: Ewma,
    retrans_pps: Ewma,
    tx_pps: Ewma,
    cnp: Ewma,
    goodput: Ewma,
    rx_bps: Ewma,
    /// Negated RTT minima: a windowed max of -min is the windowed min.
    baseline: WindowedMax,
    delivery: WindowedMax,
    received: WindowedMax,
    burst: WindowedMax,
    peak_p99: WindowedMax,
    /// The first tick that retransmitted after the link last received anything.
    unanswered_since: Option<Duration>,
    signals: Signals,
}

pub(super) fn dur(n: linkpilot_common::units::Nanos) -> Duration {
    Duration::from_nanos(n.0)
}

impl Estimator {
    pub fn new(cfg: EstimatorConfig, link: Link) -> Self {
        let hl = (cfg.ewma_half_life.0 as f64 / 1e9).max(1e-3);
        let e = || Ewma { half_life: hl, value: None };
        Self {
            cfg,
            peer_names: link.peers.iter().map(|(n, _)| n.clone()).collect(),
            link,
            last: None,
            rtt: e(),
            cross_rtt: e(),
            cross_seen: None,
            srtt_seen: None,
            percentiles_seen: None,
            ce_pps: e(),
            cross_ce_pps: e(),
            rx_pps: e(),
            retrans_pps: e(),
            tx_pps: e(),
            cnp: e(),
            goodput: e(),
            rx_bps: e(),
            baseline: WindowedMax::default(),
            delivery: WindowedMax::default(),
            received: WindowedMax::default(),
            burst: WindowedMax::default(),
            peak_p99: WindowedMax::default(),
            unanswered_since: None,
            signals: Signals::default(),
        }
    }

    pub fn link(&self) -> &Link {
        &self.link
    }

    /// Whether a peer of a snapshot row on one of this link's interfaces counts: one of its
    /// named peers, or any when the link names none.
    pub fn counts_peer(&self, peer: &str) -> bool {
        self.peer_names.is_empty() || self.peer_names.contains(peer)
    }

    /// Folds in this link's share of a snapshot taken at `at_ms`.
    pub fn update_aggregate(&mut self, at_ms: u64, a: &Aggregate) -> Signals {
        let now = Duration::from_millis(at_ms);
        let dt = self.last.map_or(0.0, |l| now.saturating_sub(l).as_secs_f64());
        self.last = Some(now);
        // Shares weighted by the packets they are of, unmeasured (0) below the minimum rate.
        let min = self.cfg.min_packet_rate;
        let share =
            |part: f64, all: f64| if all >= min && all > 0.0 { (part / all).min(1.0) } else { 0.0 };
        let (ce, rx) = (self.ce_pps.update(a.ce_pps, dt), self.rx_pps.update(a.rx_pps, dt));
        let (re, tx) =
            (self.retrans_pps.update(a.retrans_per_s, dt), self.tx_pps.update(a.tx_pps, dt));
        let s = &mut self.signals;
        s.at_ms = at_ms;
        s.active = a.tx_pps > 0.0 || a.rx_pps > 0.0;
        // Raw rates of this tick, not EWMAs: one packet received answers the link.
        if a.rx_pps > 0.0 {
            self.unanswered_since = None;
        } else if a.retrans_per_s > 0.0 && self.unanswered_since.is_none() {
            self.unanswered_since = Some(now);
        }
        s.unanswered_ms =
            self.unanswered_since.map_or(0.0, |t| now.saturating_sub(t).as_secs_f64() * 1e3);
        s.ce_fraction = share(ce, rx);
        s.cross_ce_fraction = share(self.cross_ce_pps.update(a.cross_ce_pps, dt), rx);
        s.retrans = share(re, tx);
        s.cnp_per_s = self.cnp.update(a.cnp_per_s, dt);
        s.goodput_bps = self.goodput.update(a.goodput_bps, dt);
        // With capacity "auto" there is no nominal rate to compare with (and no goodput_below).
        s.goodput_fraction = self.link.capacity_bps.map_or(0.0, |c| s.goodput_bps / c);
        self.delivery.push(now, s.goodput_bps, dur(self.cfg.window));
        s.delivery_bps = self.delivery.get().unwrap_or(0.0);
        let rx = self.rx_bps.update(a.rx_bps, dt);
        self.received.push(now, rx, dur(self.cfg.window));
        s.received_bps = self.received.get().unwrap_or(0.0);
        // Only a tick that carried data enters the burst window, and only such a tick ages it:
        // a job that syncs less often than the window leaves the link idle between bursts, and
        // an idle link is not a slow one (read as one, it made rounds longer, hence rarer).
        if a.goodput_bps > 0.0 && a.rx_pps + a.tx_pps >= min {
            self.burst.push(now, a.goodput_bps, dur(self.cfg.window));
        }
        s.burst_bps = self.burst.get().unwrap_or(0.0);
        let window = dur(self.cfg.window);
        let aged = |seen: Option<Duration>| seen.is_none_or(|t| now.saturating_sub(t) > window);
        if a.srtt_weight > 0.0 {
            let before = self.rtt.value;
            let r = self.rtt.update(a.srtt_sum / a.srtt_weight, dt);
            s.rtt_gradient = match before {
                Some(b) if dt > 0.0 => (r - b) / dt,
                _ => 0.0,
            };
            s.rtt_ms = Some(r);
            self.srtt_seen = Some(now);
        } else if aged(self.srtt_seen) {
            // No sample for a window: the next one starts the EWMA afresh.
            self.rtt.value = None;
            (s.rtt_ms, s.rtt_gradient) = (None, 0.0);
        }
        if a.cross_weight > 0.0 {
            // A job's flows give such a sample once a burst: weighed by the time since the
            // last one, so sparse samples move the EWMA as the half-life says, not by ticks.
            let since = self.cross_seen.map_or(0.0, |t| now.saturating_sub(t).as_secs_f64());
            s.cross_rtt_ms = Some(self.cross_rtt.update(a.cross_sum / a.cross_weight, since));
            self.cross_seen = Some(now);
        } else if aged(self.cross_seen) {
            self.cross_rtt.value = None;
            s.cross_rtt_ms = None;
        }
        if let Some(min) = a.min_ms {
            self.baseline.push(now, -min, dur(self.cfg.baseline_window));
        }
        self.baseline.expire(now, dur(self.cfg.baseline_window));
        s.baseline_ms = self.baseline.get().map(|v| -v);
        if a.p50_ms.is_some() || a.p99_ms.is_some() {
            s.rtt_p50_ms = a.p50_ms.or(s.rtt_p50_ms);
            s.rtt_p99_ms = a.p99_ms.or(s.rtt_p99_ms);
            self.percentiles_seen = Some(now);
        } else if aged(self.percentiles_seen) {
            (s.rtt_p50_ms, s.rtt_p99_ms) = (None, None);
        }
        if let Some(p99) = a.p99_ms {
            self.peak_p99.push(now, p99, dur(self.cfg.peak_window));
        }
        self.peak_p99.expire(now, dur(self.cfg.peak_window));
        s.peak_p99_ms = self.peak_p99.get();
        s.jitter_ms = match (s.rtt_p50_ms, s.rtt_p99_ms) {
            (Some(a), Some(b)) => (b - a).max(0.0),
            _ => 0.0,
        };
        let inflation = |r: Option<f64>| match (r, s.baseline_ms) {
            (Some(r), Some(b)) if b > 0.0 => (r / b - 1.0).max(0.0),
            _ => 0.0,
        };
        s.rtt_inflation = inflation(s.rtt_ms);
        s.cross_rtt_inflation = inflation(s.cross_rtt_ms);
        *s
    }
}

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
    }

    /// The RDMA NIC's CNPs (handled as the sender told to slow down) join the TC-seen ones.
    pub fn add_nic(&mut self, l: &LinkSnapshot) {
        self.cnp_per_s += l.cnp_handled_per_s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sense::sensors::{RttSnapshot, Snapshot};
    use linkpilot_common::units::Nanos;

    fn cfg() -> EstimatorConfig {
        EstimatorConfig {
            baseline_window: Nanos(10_000_000_000),
            window: Nanos(10_000_000_000),
            ewma_half_life: Nanos(1_000_000_000),
            peak_window: Nanos(60_000_000_000),
            min_packet_rate: 100.0,
        }
    }

    /// An estimator fed the way the core feeds it: its link's rows picked from a snapshot by
    /// `Core::aggregate`, the one place that decides which rows belong to which link.
    struct Fed {
        core: crate::control::decide::Core,
        e: Estimator,
    }

    impl Fed {
        fn new() -> Self {
            let policy = crate::control::policy::Policy::parse(
                "[[link]]\nname = \"wan\"\ninterfaces = [\"eth0\"]\ncapacity = \"1Gbit/s\"\n\
                 [[link.peer]]\nname = \"us\"\ncidrs = [\"198.18.2.0/24\"]\n\
                 [[state]]\nname = \"healthy\"\n[state.knobs]\ncompression = \"none\"\ndscp = 26\nroce_traffic_class = 106\n",
                "test",
            )
            .unwrap_or_else(|e| panic!("{e}"));
            let link = policy.links[0].clone();
            Self { core: crate::control::decide::Core::new(policy), e: Estimator::new(cfg(), link) }
        }

        fn update(&mut self, snap: &Snapshot) -> Signals {
            let aggs = self.core.aggregate(snap);
            self.e.update_aggregate(snap.at_ms, &aggs[0])
        }
    }

    fn snap(at_s: u64, rtt: f64, ce: f64) -> Snapshot {
        let p = PeerSnapshot {
            link: "eth0".into(),
            peer: "us".into(),
            rx_pps: 1000.0,
            tx_pps: 1000.0,
            ce_fraction: ce,
            goodput_bps: 5e8,
            rtt: RttSnapshot {
                srtt_ms: Some(rtt),
                min_ms: Some(rtt),
                p50_ms: Some(rtt),
                p99_ms: Some(rtt * 1.1),
                samples: 10,
                cross_srtt_ms: Some(rtt),
                cross_samples: 1,
            },
            flows: 1,
            ..PeerSnapshot::default()
        };
        let other =
            PeerSnapshot { peer: "other".into(), rx_pps: 1e6, ce_fraction: 1.0, ..p.clone() };
        Snapshot {
            at_ms: at_s * 1000,
            interval_ms: 1000,
            peers: vec![p, other],
            links: vec![],
            jobs: None,
        }
    }

    #[test]
    fn baseline_is_the_windowed_min_and_inflation_follows() {
        let mut e = Fed::new();
        e.update(&snap(0, 180.0, 0.0));
        let s = e.update(&snap(1, 180.0, 0.0));
        assert_eq!((s.baseline_ms, s.rtt_inflation), (Some(180.0), 0.0));
        // RTT rises to 360 ms: one half-life later the EWMA is half way, inflation 50%.
        let s = e.update(&snap(2, 360.0, 0.0));
        assert!((s.rtt_ms.unwrap() - 270.0).abs() < 1e-9, "{s:?}");
        assert!((s.rtt_inflation - 0.5).abs() < 1e-9);
        assert!(s.rtt_gradient > 0.0);
        // 11 s later the 180 ms minimum left the baseline window.
        let s = e.update(&snap(13, 360.0, 0.0));
        assert_eq!(s.baseline_ms, Some(360.0));
    }

    #[test]
    fn other_peers_do_not_count_and_gaps_weigh_as_time() {
        let mut e = Fed::new();
        assert_eq!(e.update(&snap(0, 180.0, 0.0)).ce_fraction, 0.0, "'other' is not on the link");
        // A 10 s gap (missed ticks): the new value dominates (1 - 2^-10).
        let s = e.update(&snap(10, 180.0, 0.1));
        assert!((s.ce_fraction - 0.1 * (1.0 - 0.5f64.powi(10))).abs() < 1e-12);
        assert_eq!(s.goodput_fraction, 0.5);
    }

    #[test]
    fn cross_traffic_ce_leaves_out_the_jobs_own_marks() {
        let mut e = Fed::new();
        let mut own = snap(0, 180.0, 0.1);
        own.peers[0].job_ce_share = 1.0;
        let s = e.update(&own);
        assert_eq!((s.ce_fraction, s.cross_ce_fraction), (0.1, 0.0));
        // Half the CE marks on others' flows, and echoed marks (ECE) all on the job's.
        let mut e = Fed::new();
        let mut shared = snap(0, 180.0, 0.1);
        (shared.peers[0].job_ce_share, shared.peers[0].ece_fraction) = (0.5, 0.2);
        shared.peers[0].job_ece_share = 1.0;
        let s = e.update(&shared);
        assert!((s.ce_fraction - 0.2).abs() < 1e-12, "{}", s.ce_fraction);
        assert!((s.cross_ce_fraction - 0.05).abs() < 1e-12, "{}", s.cross_ce_fraction);
        // No job reports: the two are one.
        let s = Fed::new().update(&snap(0, 180.0, 0.1));
        assert_eq!(s.cross_ce_fraction, s.ce_fraction);
    }

    #[test]
    fn cross_inflation_follows_the_samples_of_others_queue() {
        let mut e = Fed::new();
        e.update(&snap(0, 180.0, 0.0));
        // The job's own queue doubles its flows' RTT; the first samples of its bursts (and the
        // other flows) still see 198 ms.
        let mut own = snap(1, 360.0, 0.0);
        own.peers[0].rtt.min_ms = Some(180.0);
        own.peers[0].rtt.cross_srtt_ms = Some(198.0);
        let s = e.update(&own);
        assert!((s.rtt_inflation - 0.5).abs() < 1e-9, "{s:?}");
        assert!((s.cross_rtt_inflation - 0.05).abs() < 1e-9, "{s:?}");
        // Ticks without such a sample keep the last value, for a window; then it is unmeasured.
        let mut none = snap(2, 360.0, 0.0);
        none.peers[0].rtt.cross_srtt_ms = None;
        assert!((e.update(&none).cross_rtt_inflation - 0.05).abs() < 1e-9);
        // The next sample, 2 s (two half-lives) after the last, weighs as that time: 3/4.
        let mut later = own.clone();
        later.at_ms = 3000;
        later.peers[0].rtt.cross_srtt_ms = Some(217.0);
        let s = e.update(&later);
        assert!((s.cross_rtt_ms.unwrap() - 210.0).abs() < 1e-9, "{s:?}");
        none.at_ms = 14_000;
        let s = e.update(&none);
        assert_eq!((s.cross_rtt_ms, s.cross_rtt_inflation), (None, 0.0));
        // No job reports: every sample is another's, the two are one.
        let s = Fed::new().update(&snap(0, 180.0, 0.0));
        assert_eq!((s.cross_rtt_ms, s.cross_rtt_inflation), (s.rtt_ms, s.rtt_inflation));
    }

    #[test]
    fn shares_weigh_packets_and_a_trickle_is_unmeasured() {
        let mut e = Fed::new();
        let mut trickle = snap(0, 180.0, 0.5);
        trickle.peers[0].rx_pps = 20.0; // a handshake's worth, half of it marked
        assert_eq!(e.update(&trickle).ce_fraction, 0.0, "below min_packet_rate");
        // 1,000 packets/s with none marked, then a tick of 10,000 with 10% marked: the share is
        // of all packets in the EWMA, not the mean of two per-tick shares.
        let mut e = Fed::new();
        e.update(&snap(0, 180.0, 0.0));
        let mut burst = snap(1, 180.0, 0.1);
        burst.peers[0].rx_pps = 10_000.0;
        let s = e.update(&burst);
        // EWMAs after one half-life: marked 500/s, all 5,500/s.
        assert!((s.ce_fraction - 500.0 / 5500.0).abs() < 1e-12, "{}", s.ce_fraction);
    }

    /// A job that syncs every few seconds: one busy tick among idle ones. The EWMA's maximum
    /// stays at a fraction of the burst's rate; `burst_bps` is the burst's own, holds through
    /// idle ticks however long, and is aged by ticks that carry data.
    #[test]
    fn a_burst_shows_its_own_rate_where_the_ewma_shows_the_average() {
        let mut e = Fed::new();
        let idle = |at_s: u64| {
            let mut s = snap(at_s, 180.0, 0.0);
            s.peers[0].goodput_bps = 0.0;
            s
        };
        e.update(&idle(0));
        e.update(&snap(1, 180.0, 0.0)); // 500 Mbit/s for a tick
        let mut last = e.update(&idle(2));
        for t in 3..10 {
            last = e.update(&idle(t));
        }
        assert_eq!(last.burst_bps, 5e8);
        assert!(last.delivery_bps <= 2.5e8, "{}", last.delivery_bps);
        // Idle for longer than the window: a link that carried nothing did not get slower.
        assert_eq!(e.update(&idle(30)).burst_bps, 5e8);
        // A trickle (a few packets of payload a second) neither, though it carries bytes.
        let mut trickle = idle(31);
        (trickle.peers[0].goodput_bps, trickle.peers[0].rx_pps, trickle.peers[0].tx_pps) =
            (8.0, 2.0, 2.0);
        assert_eq!(e.update(&trickle).burst_bps, 5e8);
        // The next burst, slower, 31 s after the first: the first left the window.
        let mut slower = snap(32, 180.0, 0.0);
        slower.peers[0].goodput_bps = 1e8;
        assert_eq!(e.update(&slower).burst_bps, 1e8);
    }

    /// A dead link: RTO retransmissions go out, nothing comes back; `unanswered` counts the time
    /// (the retransmission share soon reads 0: their rate is far below `min_packet_rate`).
    #[test]
    fn a_link_that_retransmits_and_hears_nothing_is_unanswered_until_a_packet_arrives() {
        let mut e = Fed::new();
        let dead = |at_s: u64, retrans: f64| {
            let mut s = snap(at_s, 180.0, 0.0);
            s.peers[0].rx_pps = 0.0;
            s.peers[0].tx_pps = retrans;
            s.peers[0].retrans_per_s = retrans;
            s.peers[0].rtt = RttSnapshot::default();
            s
        };
        assert_eq!(e.update(&snap(0, 180.0, 0.0)).unanswered_ms, 0.0);
        // Silent but not retransmitting (a receiver whose sender paused): not unanswered.
        assert_eq!(e.update(&dead(1, 0.0)).unanswered_ms, 0.0);
        assert_eq!(e.update(&dead(2, 3.0)).unanswered_ms, 0.0, "the first retransmission");
        // Backed-off RTOs leave ticks without any: the time still counts from the first.
        assert_eq!(e.update(&dead(3, 0.0)).unanswered_ms, 1000.0);
        assert_eq!(e.update(&dead(5, 1.0)).unanswered_ms, 3000.0);
        // One packet from the peer answers it.
        let mut back = dead(6, 1.0);
        back.peers[0].rx_pps = 1.0;
        assert_eq!(e.update(&back).unanswered_ms, 0.0);
        // Traffic from peers not on the link answers nothing.
        let mut other_only = dead(7, 2.0);
        other_only.peers[1].rx_pps = 1e6;
        e.update(&other_only);
        assert_eq!(e.update(&dead(8, 0.0)).unanswered_ms, 1000.0);
    }
}
