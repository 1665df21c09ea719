//! The knob values decisions carry: timeouts that follow the RTT, a static policy's fixed
//! recipe, buffers sized from a probed rate, and transport profiles. Apart from the ladder
//! tests because they check what a state sets, not when it is entered.

use super::{policy, run, snap, POLICY};
use crate::control::{
    decide::Core,
    knobs::{self, Compression},
    policy::{Policy, SHIPPED},
};

#[test]
fn timeouts_follow_rtt_p99_and_rise_at_once() {
    // p99 180 ms: 4 x 0.18 s / 4.096 us = 175,781 -> 2^18.
    let ds = run(policy(), 50, |t| {
        let p99 = if t < 30 { 180.0 } else { 900.0 };
        snap(t * 100, 170.0, p99, 0.0, 0.0)
    });
    let before = ds.iter().rfind(|d| d.at_ms < 3000).unwrap();
    assert_eq!(before.knobs.nccl_ib_timeout, 18);
    // Watchdog: 3000 x 180 ms = 540 s, rounded up to 30 s.
    assert_eq!(before.knobs.watchdog_s, 540);
    // The tick p99 jumps to 900 ms, both timeouts rise, before any state change could.
    let jump = ds.iter().find(|d| d.at_ms == 3000).expect("a decision at the jump");
    assert_eq!(jump.knobs.nccl_ib_timeout, 20, "4 x 0.9 s needs 2^20");
    assert_eq!(jump.knobs.watchdog_s, 2700);
    assert!(jump.reason.contains("watchdog: 3000 x peak RTT p99 900.0 ms"), "{}", jump.reason);
}

#[test]
fn a_static_policy_decides_once() {
    let p = Policy::parse(SHIPPED[2].1, "static").unwrap();
    let mut core = Core::new(p);
    let ds: Vec<_> = (0..300)
        .flat_map(|t| {
            let mut s = snap(t * 100, 180.0 + (t % 7) as f64 * 40.0, 600.0, 0.2, 0.1);
            s.peers[0].link = "eth0".into();
            core.step(&s)
        })
        .collect();
    assert_eq!(ds.len(), 1, "{ds:?}");
    let k = ds[0].knobs;
    assert_eq!((k.compression, k.chunk_bytes, k.nccl_ib_timeout), (Compression::Int8, 8 << 20, 22));
    assert_eq!(
        (k.roce_traffic_class, k.tcp_buffer_bytes, k.watchdog_s),
        (Some(106), 128 << 20, 1800)
    );
}

/// `capacity` left out ("auto") on a 300 Mbit/s link behind 180 ms whose flows send at most
/// half their buffers per RTT: the buffers are probed up while the rate follows, and settle
/// within a few bandwidth-delay products, where the nominal 40 Gbit/s a policy might say
/// takes them to the 1 GiB bound (what overran the lab's queue).
#[test]
fn auto_capacity_sizes_buffers_from_the_measured_rate() {
    let (link, rtt) = (300e6_f64, 180.0);
    let bdp = link / 8.0 * rtt / 1e3;
    let closed_loop = |policy: Policy| {
        let mut core = Core::new(policy);
        let mut buffers: u64 = 8 << 20;
        let mut decisions = Vec::new();
        for t in 0..6000u64 {
            let mut s = snap(t * 100, rtt, rtt + 2.0, 0.0, 0.0);
            s.peers[0].goodput_bps = link.min(buffers as f64 / 2.0 * 8.0 / (rtt / 1e3));
            for d in core.step(&s) {
                buffers = d.knobs.tcp_buffer_bytes;
                decisions.push(d);
            }
        }
        (buffers, decisions)
    };
    let auto = POLICY.replace("capacity = \"1Gbit/s\"\n", "");
    let (buffers, ds) = closed_loop(Policy::parse(&auto, "auto").unwrap());
    let reasons: String = ds.iter().map(|d| d.reason.as_str()).collect::<Vec<_>>().join("\n");
    assert!(reasons.contains("probing") && reasons.contains("measured"), "{reasons}");
    assert!((2.0 * bdp..=8.0 * bdp).contains(&(buffers as f64)), "{buffers} vs BDP {bdp}");
    let most = ds.iter().map(|d| d.knobs.tcp_buffer_bytes).max().unwrap();
    assert!(most as f64 <= 8.0 * bdp, "{most}");
    let nominal = POLICY.replace("capacity = \"1Gbit/s\"", "capacity = \"40Gbit/s\"");
    let (buffers, _) = closed_loop(Policy::parse(&nominal, "nominal").unwrap());
    assert_eq!(buffers, 1 << 30);
}

#[test]
fn a_state_change_moves_the_transport_profile_and_explains_it() {
    let src = POLICY
        .replacen(
            "roce_traffic_class = 106\n[[state]]\nname = \"congested\"",
            "roce_traffic_class = 106\n[state.transport]\ncongestion_control = \"cubic\"\n\
             [[state]]\nname = \"congested\"",
            1,
        )
        .replacen(
            "compression = \"int8\"\ndscp = 26\nroce_traffic_class = 106\n",
            "compression = \"int8\"\ndscp = 26\nroce_traffic_class = 106\n[state.transport]\n\
             congestion_control = \"bbr\"\ninitial_cwnd = 32\nsocket_buffers = \"auto\"\n",
            1,
        );
    let p = Policy::parse(&src, "t").unwrap_or_else(|e| panic!("{e}"));
    let ds = run(p, 100, |t| snap(t * 100, 180.0, 185.0, if t >= 50 { 0.05 } else { 0.0 }, 0.0));
    let first = &ds[0].knobs;
    assert_eq!(first.transport.map(|t| t.to_string()), Some("cc=cubic".into()));
    let up = ds.iter().find(|d| d.state == "congested").expect("congested");
    let t = up.knobs.transport.expect("a profile");
    // "auto" socket buffers follow the state's tcp_buffers.
    assert_eq!((t.initial_cwnd, t.socket_buffer), (32, up.knobs.tcp_buffer_bytes));
    let want = format!("transport cc=cubic -> cc=bbr iw=32 buf={}", knobs::bytes(t.socket_buffer));
    assert!(up.changes.contains(&want), "{:?}", up.changes);
    // The severe state has no profile: its peers' new connections are left alone.
    let severe = ds.iter().find(|d| d.state == "severe");
    assert!(severe.is_none_or(|d| d.knobs.transport.is_none()));
    assert!(!policy().has_transport());
}
