//! The estimator fed as the core feeds it: baselines, EWMAs over gaps, shares weighted by
//! packets, cross-traffic signals, bursts and unanswered links.

use super::*;
use crate::sense::sensors::{PeerSnapshot, RttSnapshot, Snapshot};
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
            cross_p50_ms: Some(rtt),
            cross_p99_ms: Some(rtt * 1.1),
        },
        flows: 1,
        ..PeerSnapshot::default()
    };
    let other = PeerSnapshot { peer: "other".into(), rx_pps: 1e6, ce_fraction: 1.0, ..p.clone() };
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

#[test]
fn cross_jitter_is_the_spread_of_others_samples_and_ages_out() {
    let mut e = Fed::new();
    // A job's burst spreads its own flows' RTT 150 ms; the samples of others' queue, 5 ms.
    let mut own = snap(0, 180.0, 0.0);
    own.peers[0].rtt.p99_ms = Some(330.0);
    (own.peers[0].rtt.cross_p50_ms, own.peers[0].rtt.cross_p99_ms) = (Some(181.0), Some(186.0));
    let s = e.update(&own);
    assert!((s.jitter_ms - 150.0).abs() < 1e-9, "{s:?}");
    assert!((s.cross_jitter_ms.unwrap() - 5.0).abs() < 1e-9, "{s:?}");
    // The worst peer's spread counts, as for the percentiles of all samples.
    let mut two = own.clone();
    two.at_ms = 1000;
    let mut far = two.peers[0].clone();
    (far.peer, far.rtt.cross_p99_ms) = ("us".into(), Some(301.0));
    two.peers.insert(1, far);
    assert!((e.update(&two).cross_jitter_ms.unwrap() - 120.0).abs() < 1e-9);
    // No such samples: the last spread holds for a window, then it is unmeasured.
    let mut none = snap(2, 180.0, 0.0);
    (none.peers[0].rtt.cross_p50_ms, none.peers[0].rtt.cross_p99_ms) = (None, None);
    assert!((e.update(&none).cross_jitter_ms.unwrap() - 120.0).abs() < 1e-9);
    none.at_ms = 12_000;
    assert_eq!(e.update(&none).cross_jitter_ms, None);
}
