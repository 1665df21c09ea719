//! The core on synthetic traces: steps, ramps, noise at thresholds, spikes, gaps, idle links
//! and reloads walk the ladder as the hysteresis says. The fixtures here (the test policy, one
//! tick's snapshot) serve the other tests of the core too.

use std::sync::LazyLock;

use super::{
    decide::{Core, Decision},
    knobs::Compression,
    policy::{builder::PolicyToml, Policy, SHIPPED},
};
use crate::sense::sensors::{PeerSnapshot, RttSnapshot, Snapshot};

mod knob_values;
mod properties;

/// Healthy / congested (CE 1%, exit 0.2%) / severe (CE 10% or p99 400 ms); fast EWMA.
pub(super) static POLICY: LazyLock<String> = LazyLock::new(|| {
    PolicyToml::new()
        .table("[estimator]\newma_half_life = \"100ms\"")
        .hysteresis("2s", "1s")
        .table(
            "[bounds]\nnccl_ib_timeout = { k = 4.0, min = 14, max = 24 }\nwatchdog = { min = \"5min\", \
             max = \"60min\", rtt_multiple = 3000.0, max_step = 2.0 }",
        )
        .link("wan", "eth0", "1Gbit/s", Some(("us", "198.18.2.0/24")))
        .healthy()
        .congested_on_ce(26, 106)
        .state(
            "severe",
            "ce_fraction = \"10%\", rtt_p99 = \"400ms\"",
            "ce_fraction = \"2%\", rtt_p99 = \"300ms\"",
            ("int4", 46, 186),
        )
        .build()
});

fn policy() -> Policy {
    Policy::parse(&POLICY, "test").unwrap_or_else(|e| panic!("{e}"))
}

/// A shipped policy whose `@default-route` is this trace's `eth0`, as the daemon resolves it:
/// unresolved, no row would reach its link and every test on it would pass whatever the core did.
fn shipped(name: &str) -> Policy {
    let (_, src) = SHIPPED.iter().find(|(n, _)| *n == name).unwrap_or_else(|| panic!("{name}"));
    let mut p = Policy::parse(src, name).unwrap_or_else(|e| panic!("{e}"));
    p.rename_interface(crate::kernel::iface::DEFAULT_ROUTE, "eth0");
    assert!(p.links.iter().all(|l| l.interfaces.iter().any(|i| i == "eth0")), "{name}");
    p
}

/// One tick of the link: RTT (p50 = srtt, p99 as given), CE fraction, retransmitted share.
pub(super) fn snap(at_ms: u64, rtt: f64, p99: f64, ce: f64, retrans: f64) -> Snapshot {
    let p = PeerSnapshot {
        link: "eth0".into(),
        peer: "us".into(),
        rx_pps: 10_000.0,
        tx_pps: 10_000.0,
        ce_fraction: ce,
        retrans_per_s: retrans * 10_000.0,
        retrans_fraction: retrans,
        goodput_bps: 5e8,
        rtt: RttSnapshot {
            srtt_ms: Some(rtt),
            min_ms: Some(rtt),
            p50_ms: Some(rtt),
            p99_ms: Some(p99),
            samples: 100,
            cross_srtt_ms: Some(rtt),
            cross_samples: 4,
            cross_p50_ms: Some(rtt),
            cross_p99_ms: Some(p99),
        },
        flows: 4,
        ..PeerSnapshot::default()
    };
    Snapshot { at_ms, interval_ms: 100, peers: vec![p], ..Snapshot::default() }
}

/// Runs `f(tick)` -> snapshot for `ticks` ticks of 100 ms.
fn run(policy: Policy, ticks: u64, f: impl Fn(u64) -> Snapshot) -> Vec<Decision> {
    let mut core = Core::new(policy);
    (0..ticks).flat_map(|t| core.step(&f(t))).collect()
}

fn state_changes(ds: &[Decision]) -> Vec<(u64, String)> {
    let mut out: Vec<(u64, String)> = Vec::new();
    for d in ds {
        if out.last().is_none_or(|(_, s)| *s != d.state) {
            out.push((d.at_ms, d.state.clone()));
        }
    }
    out
}

#[test]
fn a_ce_step_escalates_within_enter_after_and_exits_only_after_exit_after() {
    // CE 5% from 5 s to 10 s, none otherwise.
    let ds = run(policy(), 200, |t| {
        snap(t * 100, 180.0, 185.0, if (50..100).contains(&t) { 0.05 } else { 0.0 }, 0.0)
    });
    let changes = state_changes(&ds);
    assert_eq!(changes.len(), 3, "{changes:?}");
    let (up_at, ref up) = changes[1];
    assert_eq!(up, "congested");
    // The EWMA crosses 1% within a tick; the condition must then hold 300 ms.
    assert!((5300..=5600).contains(&up_at), "congested at {up_at} ms");
    let d = ds.iter().find(|d| d.at_ms == up_at).unwrap();
    assert_eq!(d.knobs.compression, Compression::Int8);
    assert!(d.reason.starts_with("congested: ce_fraction "), "{}", d.reason);
    assert!(d.reason.contains(">= 1%") && d.reason.contains(" for 0."), "{}", d.reason);
    assert!(d.changes.contains(&"compression none -> int8".to_owned()), "{:?}", d.changes);
    // CE stops at 10 s; the EWMA falls below 0.2% within ~0.5 s; then 2 s of exit window.
    let (down_at, ref down) = changes[2];
    assert_eq!(down, "healthy");
    assert!((12_000..=13_000).contains(&down_at), "healthy at {down_at} ms");
    assert!(ds
        .iter()
        .find(|d| d.at_ms == down_at)
        .unwrap()
        .reason
        .contains("congested cleared for 2.0 s"));
    // Ids increase by one.
    assert!(ds.windows(2).all(|w| w[1].id == w[0].id + 1));
}

#[test]
fn noise_around_a_threshold_changes_state_at_most_once_per_dwell() {
    // CE alternates 0.1% / 1.5% every tick: the EWMA hovers around the 1% threshold.
    let ds = run(policy(), 600, |t| {
        snap(t * 100, 180.0, 185.0, if t % 2 == 0 { 0.001 } else { 0.015 }, 0.0)
    });
    let changes = state_changes(&ds);
    for w in changes.windows(2).skip(1) {
        assert!(w[1].0 - w[0].0 >= 1000, "two changes within the dwell: {changes:?}");
    }
    assert!(changes.len() <= 2, "the exit threshold (0.2%) is far below the noise: {changes:?}");
}

#[test]
fn a_second_escalation_waits_for_the_dwell() {
    // CE 5% from 5 s (congested), 20% from 5.4 s (severe's 10% holds from ~5.5 s): severe's
    // enter_after is met long before the 1 s dwell since the first change is over.
    let ds = run(policy(), 120, |t| {
        let ce = match t {
            0..50 => 0.0,
            50..54 => 0.05,
            _ => 0.20,
        };
        snap(t * 100, 180.0, 185.0, ce, 0.0)
    });
    let changes = state_changes(&ds);
    let at = |s: &str| changes.iter().find(|(_, st)| st == s).map(|(t, _)| *t);
    let (congested, severe) = (at("congested").expect("congested"), at("severe").expect("severe"));
    assert!(severe - congested >= 1000, "severe {} ms after congested", severe - congested);
    assert!(severe - congested <= 1100, "held back past the dwell: {changes:?}");
}

#[test]
fn a_one_tick_spike_does_not_escalate_but_a_sustained_one_does() {
    let spike = |from: u64, len: u64| {
        move |t: u64| {
            let p99 = if (from..from + len).contains(&t) { 500.0 } else { 190.0 };
            snap(t * 100, 180.0, p99, 0.0, 0.0)
        }
    };
    assert_eq!(state_changes(&run(policy(), 100, spike(50, 2))).len(), 1, "200 ms < enter_after");
    let changes = state_changes(&run(policy(), 100, spike(50, 10)));
    assert_eq!(changes.get(1).map(|c| c.1.as_str()), Some("severe"), "{changes:?}");
}

#[test]
fn a_ramp_escalates_monotonically_skipping_levels_when_needed() {
    // CE ramps from 0 to 20% over 20 s.
    let ds =
        run(policy(), 250, |t| snap(t * 100, 180.0, 185.0, (t as f64 / 200.0 * 0.2).min(0.2), 0.0));
    let names: Vec<String> = state_changes(&ds).into_iter().map(|c| c.1).collect();
    assert_eq!(names, ["healthy", "congested", "severe"]);
    let severe = ds.iter().find(|d| d.state == "severe").unwrap();
    assert_eq!((severe.knobs.compression, severe.knobs.dscp), (Compression::Int4, Some(46)));
}

#[test]
fn gaps_restart_the_exit_window_rather_than_skip_it() {
    let mut core = Core::new(policy());
    for t in 0..30 {
        core.step(&snap(t * 100, 180.0, 185.0, 0.05, 0.0));
    }
    assert_eq!(core.current()[0].1, "congested");
    // 30 s without snapshots (the daemon was stopped), then healthy signals.
    assert!(
        core.step(&snap(33_000, 180.0, 185.0, 0.0, 0.0)).is_empty(),
        "no exit without a window"
    );
    let mut exited = None;
    for t in 1..40 {
        let at = 33_000 + t * 100;
        if core.step(&snap(at, 180.0, 185.0, 0.0, 0.0)).iter().any(|d| d.state == "healthy") {
            exited = Some(at);
            break;
        }
    }
    assert_eq!(exited, Some(35_000), "2 s after the first healthy snapshot");
}

#[test]
fn counter_resets_between_sensors_and_core_cause_no_alarm() {
    use crate::sense::sensors::{PeerReading, Readings, Sensors};
    use linkpilot_common::PeerStats;
    use std::time::Duration;
    let stats = |n: u64| {
        let mut s = PeerStats::default();
        s.tx.packets = n * 10_000;
        s.rx.packets = n * 10_000;
        s.rx.ecn[2] = n * 10_000;
        s.retrans_segs = n; // 0.01%
        s
    };
    let mut sensors = Sensors::new(Duration::from_secs(10));
    // The default policy escalates on retransmissions (0.5%, 2%, 5%).
    let mut core = Core::new(shipped("default"));
    let mut worst = 0;
    for t in 0..100u64 {
        // At 5 s the counters start again from zero (the interface was re-added): a naive
        // difference would be ~2^64 retransmissions.
        let n = if t < 50 { 1000 + t } else { t - 50 };
        let readings = Readings {
            peers: vec![PeerReading {
                link: "eth0".into(),
                ifindex: 1,
                peer: "us".into(),
                id: 1,
                stats: stats(n),
            }],
            ..Readings::default()
        };
        let snap = sensors.tick(Duration::from_millis(t * 100), &readings);
        for d in core.step(&snap) {
            // The rows reach the link: it sees the 10,000 packets/s, so a wrong delta would count.
            assert!(t == 0 || d.signals.active, "{d:?}");
            worst = worst.max(core.policy().states.iter().position(|s| s.name == d.state).unwrap());
        }
    }
    assert_eq!(worst, 0, "a reset is not congestion");
    let signals = core.signals();
    assert!(signals[0].1.active && signals[0].1.retrans > 0.0, "{signals:?}");
}

#[test]
fn an_idle_link_forgets_old_rtt_walks_back_and_lowers_its_timeouts() {
    // Windows of 2 s (RTT) and 5 s (peak p99): old RTT ages out within the test.
    let short = POLICY.replace(
        "[estimator]\n",
        "[estimator]\nwindow = \"2s\"\nbaseline_window = \"2s\"\npeak_window = \"5s\"\n",
    );
    let p = Policy::parse(&short, "test").unwrap_or_else(|e| panic!("{e}"));
    // 3 s of a 500 ms p99 (severe), then no traffic at all for 20 s: no rates, no RTT.
    let idle = |at_ms| {
        let mut s = snap(at_ms, 0.0, 0.0, 0.0, 0.0);
        let p = &mut s.peers[0];
        (p.rx_pps, p.tx_pps, p.retrans_per_s, p.goodput_bps) = (0.0, 0.0, 0.0, 0.0);
        (p.rtt, p.flows) = (RttSnapshot::default(), 0);
        s
    };
    let mut core = Core::new(p);
    let ds: Vec<Decision> = (0..230)
        .flat_map(|t| {
            core.step(&if t < 30 { snap(t * 100, 170.0, 500.0, 0.0, 0.0) } else { idle(t * 100) })
        })
        .collect();
    let severe = ds.iter().find(|d| d.state == "severe").expect("severe on a 500 ms p99");
    // 4 x 0.5 s needs 2^19; the watchdog 3000 x 0.5 s.
    assert_eq!((severe.knobs.nccl_ib_timeout, severe.knobs.watchdog_s), (19, 1500));
    // The p99 is unmeasured 2 s into the silence, so severe's exit holds from 5 s; 2 s later
    // the link steps down, and down again after another exit window.
    let changes = state_changes(&ds);
    assert_eq!(
        changes.iter().map(|(_, s)| s.as_str()).collect::<Vec<_>>(),
        ["healthy", "severe", "congested", "healthy"],
        "{changes:?}"
    );
    let (down_at, _) = changes[2];
    assert!((6_900..=7_200).contains(&down_at), "stepped down at {down_at} ms");
    let d = ds.iter().find(|d| d.at_ms == down_at).unwrap();
    assert!(d.reason.contains("rtt_p99 unmeasured"), "{}", d.reason);
    // The peak p99 left its 5 s window at ~8 s: timeouts come down, paced by the dwell.
    let last = ds.last().unwrap();
    assert_eq!(
        (last.state.as_str(), last.knobs.nccl_ib_timeout, last.knobs.watchdog_s),
        ("healthy", 14, 300)
    );
    let s = core.signals()[0].1;
    assert_eq!(
        (s.rtt_ms, s.rtt_p99_ms, s.peak_p99_ms, s.baseline_ms),
        (None, None, None, None),
        "{s:?}"
    );
    assert_eq!((s.jitter_ms, s.rtt_inflation), (0.0, 0.0));
    // Traffic again: measured afresh, the EWMA starts from the new RTT, not the old one.
    let again = core.step(&snap(23_000, 90.0, 95.0, 0.0, 0.0));
    let s = core.signals()[0].1;
    assert_eq!(
        (s.rtt_ms, s.rtt_p99_ms, s.baseline_ms),
        (Some(90.0), Some(95.0), Some(90.0)),
        "{again:?}"
    );
}

#[test]
fn a_reload_keeps_the_state_and_baseline_and_explains_the_new_knobs() {
    let mut core = Core::new(policy());
    let mut ds = Vec::new();
    // A 150 ms baseline before the reload, 180 ms after: a fresh estimator would say 180.
    for t in 0..30 {
        ds.extend(core.step(&snap(t * 100, 150.0, 185.0, 0.05, 0.0)));
    }
    assert_eq!(ds.last().map(|d| d.state.as_str()), Some("congested"));
    let last_id = ds.last().map_or(0, |d| d.id);
    // Same ladder, congested now marks DSCP 34 instead of 26.
    let edited = POLICY.replacen(
        "compression = \"int8\"\ndscp = 26",
        "compression = \"int8\"\ndscp = 34",
        1,
    );
    core.reload(Policy::parse(&edited, "test").unwrap_or_else(|e| panic!("{e}")));
    let d = core.step(&snap(3000, 180.0, 185.0, 0.05, 0.0));
    assert_eq!(d.len(), 1, "a reload decides on the next tick");
    assert_eq!(
        (d[0].id, d[0].state.as_str(), d[0].knobs.dscp),
        (last_id + 1, "congested", Some(34))
    );
    assert!(d[0].reason.starts_with("policy reloaded, in congested"), "{}", d[0].reason);
    assert_eq!(d[0].changes, vec!["dscp 26 -> 34".to_owned()]);
    // The estimator was kept: the baseline is what it learnt before the reload.
    assert_eq!(d[0].signals.baseline_ms, Some(150.0));
    // Nothing more to say on the tick after.
    assert!(core.step(&snap(3100, 180.0, 185.0, 0.05, 0.0)).is_empty());

    // A ladder without the current state starts over from its first state.
    let renamed = POLICY.replace("\"congested\"", "\"busy\"");
    core.reload(Policy::parse(&renamed, "test").unwrap_or_else(|e| panic!("{e}")));
    let d = core.step(&snap(3200, 180.0, 185.0, 0.05, 0.0));
    assert_eq!(d[0].state, "healthy", "{}", d[0].reason);
}

#[test]
fn a_jobs_own_rtt_spread_is_not_jitter_but_a_spiking_path_is() {
    // hk-us reads jitter from the samples of others' queue (cross_jitter): a job's own burst
    // spreads its flows' RTT 150 ms for 5 s while those samples stay within 5 ms.
    let own = |t: u64| {
        let mut s =
            snap(t * 100, 181.0, if (50..100).contains(&t) { 331.0 } else { 185.0 }, 0.0, 0.0);
        (s.peers[0].rtt.cross_p50_ms, s.peers[0].rtt.cross_p99_ms) = (Some(181.0), Some(186.0));
        s
    };
    let ds = run(shipped("hk-us"), 150, own);
    assert_eq!(state_changes(&ds), vec![(0, "healthy".to_owned())], "{ds:#?}");
    // The same spread in the samples of others' queue is the path's: degraded (at 100 ms).
    let spiking = |t: u64| {
        let mut s = own(t);
        s.peers[0].rtt.cross_p99_ms = s.peers[0].rtt.p99_ms;
        s
    };
    let ds = run(shipped("hk-us"), 150, spiking);
    let states: Vec<String> = state_changes(&ds).into_iter().map(|(_, s)| s).collect();
    assert_eq!(states, ["healthy", "degraded"], "{ds:#?}");
    assert!(ds.iter().any(|d| d.reason.contains("cross_jitter 150.0ms >= 100ms")), "{ds:#?}");
}
