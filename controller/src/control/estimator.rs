//! The link estimator: turns one sensors snapshot per tick into the signals the thresholds
//! speak of. EWMAs with a time-based weight (so a gap of missed ticks weighs as the time it
//! spans), a windowed-min RTT baseline (BBR-style), windowed maxima of delivery rate and RTT
//! p99, and the RTT gradient. Rates already come from counter deltas that survive resets and
//! missed ticks (the sensors layer). RTT signals age out: a window with no RTT samples (an idle
//! link) makes them unmeasured again, so a state entered on RTT is not held by old news.
//!
//! The per-link sums of a snapshot's rows (`Aggregate`) and the two filters have files of their
//! own.

use std::{collections::HashSet, time::Duration};

use serde::{Deserialize, Serialize};

use super::policy::{EstimatorConfig, Link};

mod aggregate;
mod filters;
#[cfg(test)]
mod tests;

pub use aggregate::Aggregate;
use filters::{Ewma, WindowedMax};

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
    /// p99 - p50 of the samples of others' queue (`cross_rtt_ms`'s): the path's jitter without
    /// what a reporting job's own bursts add, `None` while there are none in the window. Equal
    /// to `jitter_ms` while no job reports.
    #[serde(default)]
    pub cross_jitter_ms: Option<f64>,
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
    cross_percentiles_seen: Option<Duration>,
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
            cross_percentiles_seen: None,
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
        if let (Some(p50), Some(p99)) = (a.cross_p50_ms, a.cross_p99_ms) {
            s.cross_jitter_ms = Some((p99 - p50).max(0.0));
            self.cross_percentiles_seen = Some(now);
        } else if aged(self.cross_percentiles_seen) {
            s.cross_jitter_ms = None;
        }
        let inflation = |r: Option<f64>| match (r, s.baseline_ms) {
            (Some(r), Some(b)) if b > 0.0 => (r / b - 1.0).max(0.0),
            _ => 0.0,
        };
        s.rtt_inflation = inflation(s.rtt_ms);
        s.cross_rtt_inflation = inflation(s.cross_rtt_ms);
        *s
    }
}
