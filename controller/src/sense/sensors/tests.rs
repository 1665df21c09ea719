//! Tests of the per-peer rows of `Sensors::tick`: rates, resets, the job-mark split and the RTT
//! window, each driven by hand-made readings.

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

fn row(link: &str, ifindex: u32, peer: &str, id: u32, stats: PeerStats) -> PeerReading {
    PeerReading { link: link.into(), ifindex, peer: peer.into(), id, stats }
}

/// A reading whose kernel clock is `kernel_ns`.
fn readings_at(s: PeerStats, flows: Vec<(FlowKey, FlowState)>, kernel_ns: u64) -> Readings {
    Readings { peers: vec![row("eth0", 1, "us", 1, s)], flows, kernel_ns, ..Readings::default() }
}

fn readings(s: PeerStats, flows: Vec<(FlowKey, FlowState)>) -> Readings {
    readings_at(s, flows, 0)
}

/// A flow to peer 1 on interface 1 last updated at kernel time `last_ns`.
fn flow(port: u16, srtt_us: u32, last_ns: u64) -> (FlowKey, FlowState) {
    flow_on(1, 1, port, srtt_us, last_ns)
}

fn flow_on(ifindex: u32, peer: u32, port: u16, srtt_us: u32, last_ns: u64) -> (FlowKey, FlowState) {
    let k = FlowKey { family: 2, local_port: port, remote_port: 5201, ..FlowKey::default() };
    let f = FlowState { srtt_us, rtt_samples: 1, last_ns, ifindex, peer, ..FlowState::default() };
    (k, f)
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
fn marks_on_job_flows_are_told_from_others_and_agree_over_readings() {
    let mut s = Sensors::new(Duration::from_secs(10));
    let (job, other) = (flow(1, 0, 0), flow(2, 0, 0));
    s.set_job_flows([job.0].into(), HashSet::new());
    let with = |job_ce: u64, other_ce: u64| {
        let (mut j, mut o) = (job, other);
        (j.1.ce_segs, o.1.ce_segs) = (job_ce, other_ce);
        vec![j, o]
    };
    s.tick(Duration::ZERO, &readings(stats(0, 0, 0, 0, 0), with(0, 0)));
    // 30 marks by the counters, 20 on the job's flow and 10 on the other.
    let snap = s.tick(S, &readings(stats(1000, 900, 30, 0, 0), with(20, 10)));
    let p = &snap.peers[0];
    assert_eq!((p.marks.ce, p.marks.job_ce), (30, 20));
    assert!((p.job_ce_share - 2.0 / 3.0).abs() < 1e-12, "{}", p.job_ce_share);
    // Read after the counters: 5 more marks are on the job's flow but not yet counted for
    // the peer. Credited at the next reading, where the counters have them.
    let snap = s.tick(2 * S, &readings(stats(2000, 1800, 40, 0, 0), with(35, 10)));
    assert_eq!((snap.peers[0].marks.ce, snap.peers[0].marks.job_ce), (10, 10));
    let snap = s.tick(3 * S, &readings(stats(3000, 2700, 45, 0, 0), with(35, 10)));
    assert_eq!((snap.peers[0].marks.ce, snap.peers[0].marks.job_ce), (5, 5));
    // No marks, no reading of whose they are: the share holds, also between readings.
    let snap = s.tick(4 * S, &readings(stats(4000, 3600, 45, 0, 0), with(35, 10)));
    assert_eq!(snap.peers[0].job_ce_share, 1.0);
    let skipped = Readings { flows_skipped: true, ..readings(stats(5000, 4500, 60, 0, 0), vec![]) };
    let snap = s.tick(5 * S, &skipped);
    assert_eq!((snap.peers[0].marks, snap.peers[0].job_ce_share), (MarkCounts::default(), 1.0));
    let snap = s.tick(6 * S, &readings(stats(6000, 5400, 60, 0, 0), with(50, 10)));
    assert_eq!((snap.peers[0].marks.ce, snap.peers[0].marks.job_ce), (15, 15));
    // The job is gone: every mark is someone else's.
    s.set_job_flows(HashSet::new(), HashSet::new());
    let snap = s.tick(7 * S, &readings(stats(7000, 6300, 70, 0, 0), with(60, 10)));
    assert_eq!((snap.peers[0].marks.job_ce, snap.peers[0].job_ce_share), (0, 0.0));
}

/// A job in its own network namespace (a pod): every flow of that namespace is the job's,
/// whatever its address; a flow of another namespace is not.
#[test]
fn marks_on_a_job_namespaces_flows_are_the_jobs() {
    let mut s = Sensors::new(Duration::from_secs(10));
    let (mut pod, mut other) = (flow(1, 0, 0), flow(2, 0, 0));
    (pod.1.netns, other.1.netns) = (4026532000, 4026531840);
    s.set_job_flows(HashSet::new(), [4026532000].into());
    let with = |pod_ce: u64, other_ce: u64| {
        let (mut p, mut o) = (pod, other);
        (p.1.ce_segs, o.1.ce_segs) = (pod_ce, other_ce);
        vec![p, o]
    };
    s.tick(Duration::ZERO, &readings(stats(0, 0, 0, 0, 0), with(0, 0)));
    assert!(!s.unknown_owner(&with(5, 0)), "the pod's flow is known to be the job's");
    let snap = s.tick(S, &readings(stats(1000, 900, 30, 0, 0), with(20, 10)));
    assert_eq!((snap.peers[0].marks.ce, snap.peers[0].marks.job_ce), (30, 20));
    // The job gone: its namespace's flows are no one's.
    s.set_job_flows(HashSet::new(), HashSet::new());
    let snap = s.tick(2 * S, &readings(stats(2000, 1800, 40, 0, 0), with(30, 10)));
    assert_eq!(snap.peers[0].marks.job_ce, 0);
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
    s.tick(Duration::ZERO, &readings_at(base, vec![], 100));
    // Updated at kernel time 150, read at 200: fresh.
    let flows: Vec<_> = (0..100).map(|i| flow(i, 180_000 + u32::from(i) * 100, 150)).collect();
    let snap = s.tick(S, &readings_at(base, flows.clone(), 200));
    let (rtt, near) =
        (snap.peers[0].rtt, |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() <= b * 0.005));
    assert_eq!((rtt.samples, rtt.min_ms), (100, Some(180.0)));
    assert!(near(rtt.p50_ms, 184.9) && near(rtt.p99_ms, 189.8), "{rtt:?}");
    assert_eq!(snap.peers[0].flows, 100);
    // Not updated since the last reading: stale; the window still holds the old samples.
    let snap = s.tick(2 * S, &readings_at(base, flows, 300));
    assert_eq!((snap.peers[0].rtt.srtt_ms, snap.peers[0].rtt.samples), (None, 100));
    assert_eq!(snap.peers[0].flows, 0);
    // A tick that skips the table keeps the freshness mark: samples updated at 350 are
    // fresh at the next real reading, and the flow count repeats the last one meanwhile.
    let later: Vec<_> = (0..10).map(|i| flow(i, 200_000, 350)).collect();
    let skipped = Readings { flows_skipped: true, ..readings_at(base, vec![], 360) };
    let snap = s.tick(2 * S + S / 2, &skipped);
    assert_eq!((snap.peers[0].rtt.srtt_ms, snap.peers[0].flows), (None, 0));
    let snap = s.tick(3 * S, &readings_at(base, later, 370));
    assert_eq!((snap.peers[0].rtt.srtt_ms, snap.peers[0].flows), (Some(200.0), 10));
    let snap =
        s.tick(3 * S + S / 2, &Readings { flows_skipped: true, ..readings_at(base, vec![], 380) });
    assert_eq!(snap.peers[0].flows, 10);
    // Past the window they are gone.
    let snap = s.tick(15 * S, &readings_at(base, vec![], 400));
    assert_eq!(snap.peers[0].rtt, RttSnapshot::default());
}

#[test]
fn a_jobs_flows_show_others_queue_only_in_the_first_sample_of_a_burst() {
    let mut s = Sensors::new(Duration::from_secs(10));
    let base = stats(0, 0, 0, 0, 0);
    let (mut job, other) = (flow(1, 360_000, 150), flow(2, 200_000, 150));
    (job.1.burst_rtt_us, job.1.burst_ns) = (190_000, 120);
    s.tick(Duration::ZERO, &readings_at(base, vec![], 100));
    // No job reports yet: every flow's smoothed RTT is a sample of others' queue.
    let snap = s.tick(S, &readings_at(base, vec![job, other], 200));
    assert_eq!(snap.peers[0].rtt.cross_srtt_ms, snap.peers[0].rtt.srtt_ms);
    assert_eq!(snap.peers[0].rtt.cross_samples, 2);
    s.set_job_flows([job.0].into(), HashSet::new());
    (job.1.last_ns, job.1.burst_ns) = (250, 220);
    let other = flow(2, 200_000, 250);
    let snap = s.tick(2 * S, &readings_at(base, vec![job, other], 300));
    let rtt = snap.peers[0].rtt;
    assert_eq!((rtt.srtt_ms, rtt.cross_srtt_ms, rtt.cross_samples), (Some(280.0), Some(195.0), 2));
    // The job's flow sampled again inside the same burst: its queue is its own.
    job.1.last_ns = 350;
    let snap = s.tick(3 * S, &readings_at(base, vec![job, flow(2, 200_000, 350)], 400));
    assert_eq!(
        (snap.peers[0].rtt.cross_srtt_ms, snap.peers[0].rtt.cross_samples),
        (Some(200.0), 1)
    );
    let snap = s.tick(4 * S, &readings_at(base, vec![job], 500));
    assert_eq!((snap.peers[0].rtt.cross_srtt_ms, snap.peers[0].rtt.cross_samples), (None, 0));
}

/// Two links reaching peer "us" (id 1) over their own interfaces, 20 ms and 60 ms away, and a
/// third interface without flows; "us" is a row on every interface.
#[test]
fn each_interface_takes_the_rtt_samples_of_its_own_flows() {
    let mut s = Sensors::new(Duration::from_secs(10));
    let base = stats(0, 0, 0, 0, 0);
    let peers = vec![
        row("near0", 3, "us", 1, base),
        row("far0", 4, "us", 1, base),
        row("far0", 4, "other", 0, base),
        row("lan0", 5, "us", 1, base),
    ];
    let mut flows: Vec<_> = (0..10).map(|i| flow_on(3, 1, i, 20_000, 150)).collect();
    flows.extend((10..14).map(|i| flow_on(4, 1, i, 60_000, 150)));
    flows.push(flow_on(4, 0, 20, 90_000, 150));
    // A flow on an interface no row watches counts for nobody.
    flows.push(flow_on(9, 1, 30, 500_000, 150));
    let r = Readings { peers, flows, kernel_ns: 200, ..Readings::default() };
    let snap = s.tick(S, &r);
    let got: Vec<_> = snap
        .peers
        .iter()
        .map(|p| (p.link.as_str(), p.peer.as_str(), p.rtt.srtt_ms, p.rtt.samples, p.flows))
        .collect();
    assert_eq!(
        got,
        [
            ("near0", "us", Some(20.0), 10, 10),
            ("far0", "us", Some(60.0), 4, 4),
            ("far0", "other", Some(90.0), 1, 1),
            ("lan0", "us", None, 0, 0),
        ]
    );
}

#[test]
fn memory_does_not_follow_the_flow_count() {
    let mut s = Sensors::new(Duration::from_secs(10));
    let base = stats(0, 0, 0, 0, 0);
    let many: Vec<_> = (0..50_000).map(|i| flow(i, 180_000, 10)).collect();
    s.tick(Duration::ZERO, &readings_at(base, many, 20));
    // Per peer state only: nothing per flow survives the tick.
    assert_eq!(s.peers.len(), 1);
    assert_eq!(s.peers.values().next().map(|p| p.rtt.samples()), Some(50_000));
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

#[test]
fn cross_percentiles_leave_out_a_jobs_own_queue() {
    let mut s = Sensors::new(Duration::from_secs(10));
    let base = stats(0, 0, 0, 0, 0);
    s.tick(Duration::ZERO, &readings_at(base, vec![], 100));
    let mut job = flow(1, 180_000, 200);
    (job.1.burst_rtt_us, job.1.burst_ns) = (181_000, 150);
    s.set_job_flows([job.0].into(), HashSet::new());
    // Ten ticks of a burst: the job's flow queues behind itself up to 500 ms; the other flow
    // and the burst's first sample see the path's 180-185 ms.
    let mut snap = None;
    for t in 1..=10u64 {
        let at = t * 100 + 100;
        job.1.srtt_us = 180_000 + 32_000 * t as u32;
        job.1.last_ns = at - 10;
        job.1.burst_ns = if t == 1 { at - 20 } else { 0 };
        let other = flow(2, 180_000 + 500 * t as u32, at - 10);
        snap = Some(s.tick(t as u32 * S, &readings_at(base, vec![job, other], at)));
    }
    let rtt = snap.unwrap().peers[0].rtt;
    let (p99, cross_p99) = (rtt.p99_ms.unwrap(), rtt.cross_p99_ms.unwrap());
    assert!(p99 > 480.0 && cross_p99 < 186.0, "{rtt:?}");
    assert!(rtt.cross_p50_ms.is_some_and(|p| (180.0..186.0).contains(&p)), "{rtt:?}");
    // No job reports: every sample is another's, the percentiles are one.
    let mut s = Sensors::new(Duration::from_secs(10));
    s.tick(Duration::ZERO, &readings_at(base, vec![], 100));
    let rtt = s
        .tick(S, &readings_at(base, vec![flow(1, 300_000, 150), flow(2, 180_000, 150)], 200))
        .peers[0]
        .rtt;
    assert_eq!((rtt.cross_p50_ms, rtt.cross_p99_ms), (rtt.p50_ms, rtt.p99_ms));
}
