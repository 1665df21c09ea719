//! `linkpilot bench-sensors`: what one sensors tick costs with a full flow table — reading the
//! kernel's table (batched vs aya's per-entry iteration) and turning it into a snapshot — and
//! how much memory the sensors hold once their RTT windows are full.

use std::time::{Duration, Instant};

use linkpilot_common::{v4_mapped, FlowKey, FlowState, PeerStats, AF_INET};

use crate::{
    kernel::checks,
    kernel::probes::{monotonic_ns, Probes},
    sense::sensors::{PeerReading, Readings, Sensors},
};

/// Resident set size of this process, bytes.
fn rss() -> u64 {
    crate::daemon::metrics::process_figures().map_or(0, |(rss, _)| rss)
}

fn median_ms(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
}

/// `flows` flows spread over `peers` peers of one link, each with an RTT sample.
fn synthetic_flows(flows: u32, peers: u32) -> Vec<(FlowKey, FlowState)> {
    (0..flows)
        .map(|i| {
            let [a, b, c, d] = (0xc612_0000u32 + i / 60_000).to_be_bytes(); // 198.18.x.y
            let key = FlowKey {
                family: AF_INET,
                local_port: (1024 + i % 60_000) as u16,
                remote_port: 5201,
                _pad: 0,
                local: v4_mapped([198, 18, 1, 10]),
                remote: v4_mapped([a, b, c, d]),
            };
            let state = FlowState {
                srtt_us: 180_000 + i % 20_000,
                min_srtt_us: 180_000,
                rtt_samples: 1,
                ifindex: 1,
                peer: 1 + i % peers,
                ..FlowState::default()
            };
            (key, state)
        })
        .collect()
}

/// Measures and prints.
pub fn run(flows: u32, peers: u32, ticks: u32) -> anyhow::Result<()> {
    checks::check_privileges()?;
    let (offsets, _) = checks::kernel_offsets(true);
    let mut probes = Probes::load(offsets)?;
    let rss_start = rss();
    probes.insert_flows(&synthetic_flows(flows, peers))?;
    let memlock = probes.flows_memlock().unwrap_or(0);
    println!("{flows} flows over {peers} peers; flow table memlock {:.1} MiB", mib(memlock));

    let time = |f: &mut dyn FnMut() -> anyhow::Result<usize>| -> anyhow::Result<Vec<Duration>> {
        (0..5)
            .map(|_| {
                let t = Instant::now();
                let n = f()?;
                anyhow::ensure!(n == flows as usize, "read {n} flows of {flows}");
                Ok(t.elapsed())
            })
            .collect()
    };
    let iterated = median_ms(time(&mut || Ok(probes.flows_iterated()?.len()))?);
    let batched = median_ms(time(&mut || Ok(probes.flows()?.len()))?);
    println!("read the flow table: aya iteration {iterated:.1} ms, batched {batched:.1} ms");

    // Ticks at 10 Hz: every flow has a fresh sample each tick (the worst case for the RTT
    // windows), so after 10 s of virtual time every window is at its cap.
    let mut sensors = Sensors::new(Duration::from_secs(10));
    let peer_rows: Vec<_> = (1..=peers)
        .map(|p| PeerReading {
            link: "eth0".to_owned(),
            ifindex: 1,
            peer: format!("p{p}"),
            id: p,
            stats: PeerStats::default(),
        })
        .collect();
    let mut read = Vec::new();
    let mut compute = Vec::new();
    let rss_before_ticks = rss();
    for tick in 0..ticks {
        let t = Instant::now();
        let kernel_ns = monotonic_ns();
        let mut table = probes.flows()?;
        read.push(t.elapsed());
        for (_, f) in &mut table {
            f.last_ns = kernel_ns; // as if the tracepoint had just updated every flow
        }
        let readings = Readings {
            peers: peer_rows.clone(),
            flows: table,
            nic: Vec::new(),
            kernel_ns,
            flows_skipped: false,
        };
        let t = Instant::now();
        let snap = sensors.tick(Duration::from_millis(100 * u64::from(tick)), &readings);
        compute.push(t.elapsed());
        std::hint::black_box(snap);
    }
    println!(
        "tick ({ticks} at 10 Hz, all flows fresh): read {:.1} ms + sensors {:.1} ms (medians)",
        median_ms(read),
        median_ms(compute)
    );
    println!(
        "RSS: {:.1} MiB at start, {:.1} MiB before ticking, {:.1} MiB after {ticks} ticks",
        mib(rss_start),
        mib(rss_before_ticks),
        mib(rss())
    );
    Ok(())
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}
