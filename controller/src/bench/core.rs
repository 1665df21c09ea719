//! `linkpilot bench-control`: what one tick of the control core costs for many links and
//! peers (64 x 1,000 by default), with signals that move every tick so estimators and
//! thresholds do real work.

use std::time::{Duration, Instant};

use crate::{
    control::{
        decide::Core,
        policy::{Link, Policy, SHIPPED},
    },
    sense::sensors::{PeerSnapshot, RttSnapshot, Snapshot},
};

/// The default policy with `links` links of `peers` named peers each (interfaces eth0..).
fn policy(links: usize, peers: usize) -> Policy {
    let mut p = Policy::parse(SHIPPED[0].1, "default").expect("the shipped default policy");
    p.links = (0..links)
        .map(|l| Link {
            name: format!("link{l}"),
            interfaces: vec![format!("eth{l}")],
            capacity_bps: Some(10e9),
            peers: (0..peers).map(|i| (format!("p{i}"), vec![])).collect(),
        })
        .collect();
    p
}

fn snapshot(links: usize, peers: usize, tick: u64) -> Snapshot {
    let wobble = (tick % 50) as f64 / 50.0;
    let rows = (0..links)
        .flat_map(|l| {
            (0..peers).map(move |i| PeerSnapshot {
                link: format!("eth{l}"),
                peer: format!("p{i}"),
                rx_pps: 1000.0,
                tx_pps: 1000.0,
                ce_fraction: 0.02 * wobble,
                retrans_per_s: 5.0 * wobble,
                goodput_bps: 1e7,
                rtt: RttSnapshot {
                    srtt_ms: Some(180.0 + 40.0 * wobble),
                    min_ms: Some(180.0),
                    p50_ms: Some(181.0),
                    p99_ms: Some(190.0 + 100.0 * wobble),
                    samples: 100,
                    cross_srtt_ms: Some(180.0 + 40.0 * wobble),
                    cross_samples: 2,
                    cross_p50_ms: Some(181.0),
                    cross_p99_ms: Some(190.0 + 100.0 * wobble),
                },
                flows: 2,
                ..PeerSnapshot::default()
            })
        })
        .collect();
    Snapshot { at_ms: tick * 100, interval_ms: 100, peers: rows, links: vec![], jobs: None }
}

/// Measures and prints.
pub fn run(links: usize, peers: usize, ticks: u64) -> anyhow::Result<()> {
    let mut core = Core::new(policy(links, peers));
    let (mut rows, mut decide) = (Vec::new(), Vec::new());
    let mut decisions = 0;
    for tick in 0..ticks {
        // Built outside the timed region, just before it, as the daemon's sensors would.
        let s = snapshot(links, peers, tick);
        let t = Instant::now();
        let aggs = core.aggregate(&s);
        rows.push(t.elapsed());
        let t = Instant::now();
        decisions += core.step_aggregates(s.at_ms, &aggs).len();
        decide.push(t.elapsed());
    }
    let stats = |mut v: Vec<Duration>| {
        v.sort();
        let q = |f: f64| v[((v.len() - 1) as f64 * f) as usize].as_secs_f64() * 1e3;
        format!("median {:.3} ms, p99 {:.3} ms", q(0.5), q(0.99))
    };
    println!("{links} links x {peers} peers, {ticks} ticks, {decisions} decisions");
    println!("  rows -> links (sum over {} named rows): {}", links * peers, stats(rows));
    println!("  estimators, states and knobs of {links} links:  {}", stats(decide));
    Ok(())
}
