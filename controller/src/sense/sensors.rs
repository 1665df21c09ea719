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
use crate::{
    rdma::RdmaPort,
    sense::{
        job_marks::{Added, JobMarks, MarkSplit},
        rtt_window::RttWindow,
    },
};

const NIC_RETRANS_EVENTS: [&str; 4] =
    ["local_ack_timeout_err", "packet_seq_err", "implied_nak_seq_err", "roce_adp_retrans"];

struct PeerState {
    prev: Option<PeerStats>,
    rtt: RttWindow,
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
    /// NIC counters at the previous tick, by (link, device, port, counter).
    nic_prev: HashMap<(String, String, u32, String), u64>,
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
            nic_prev: HashMap::new(),
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
        let mut cross: HashMap<(u32, u32), (u64, usize)> = HashMap::new();
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
                    let e = cross.entry(row).or_default();
                    (e.0, e.1) = (e.0 + u64::from(us), e.1 + 1);
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
            let (cross_sum, cross_samples) = cross.remove(&(*ifindex, *id)).unwrap_or_default();
            let cross_ms =
                (cross_samples > 0).then(|| cross_sum as f64 / cross_samples as f64 / 1e3);
            for &us in &samples {
                state.rtt.push(now, us);
            }
            state.rtt.expire(now);
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
                    cross_samples,
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
        let links = self.nic(&r.nic, &per_s);
        Snapshot {
            at_ms: now.as_millis() as u64,
            interval_ms: interval.as_millis() as u64,
            peers: out,
            links,
            jobs: None,
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
    use std::collections::BTreeMap;

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
        Readings {
            peers: vec![row("eth0", 1, "us", 1, s)],
            flows,
            kernel_ns,
            ..Readings::default()
        }
    }

    fn readings(s: PeerStats, flows: Vec<(FlowKey, FlowState)>) -> Readings {
        readings_at(s, flows, 0)
    }

    /// A flow to peer 1 on interface 1 last updated at kernel time `last_ns`.
    fn flow(port: u16, srtt_us: u32, last_ns: u64) -> (FlowKey, FlowState) {
        flow_on(1, 1, port, srtt_us, last_ns)
    }

    fn flow_on(
        ifindex: u32,
        peer: u32,
        port: u16,
        srtt_us: u32,
        last_ns: u64,
    ) -> (FlowKey, FlowState) {
        let k = FlowKey { family: 2, local_port: port, remote_port: 5201, ..FlowKey::default() };
        let f =
            FlowState { srtt_us, rtt_samples: 1, last_ns, ifindex, peer, ..FlowState::default() };
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
        let skipped =
            Readings { flows_skipped: true, ..readings(stats(5000, 4500, 60, 0, 0), vec![]) };
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
        let (rtt, near) = (snap.peers[0].rtt, |a: Option<f64>, b: f64| {
            a.is_some_and(|a| (a - b).abs() <= b * 0.005)
        });
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
        let snap = s.tick(
            3 * S + S / 2,
            &Readings { flows_skipped: true, ..readings_at(base, vec![], 380) },
        );
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
        assert_eq!(
            (rtt.srtt_ms, rtt.cross_srtt_ms, rtt.cross_samples),
            (Some(280.0), Some(195.0), 2)
        );
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
