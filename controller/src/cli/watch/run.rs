//! `linkpilot watch`: loads and attaches the programs on the named interfaces and prints rates
//! (a table, JSON lines with or without the flow table, or the sensors' snapshots) every
//! second until a count, Ctrl-C or SIGTERM; detaches on the way out.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use ipnet::IpNet;
use linkpilot_common::IfaceStats;
use tokio::signal::unix::{signal, SignalKind};
use tracing::warn;

use super::{
    dscp_rules, peer_row, rates, table_header, table_row, DscpArg, FlowSample, PeerTotals, Sample,
};
use crate::kernel::{
    checks,
    iface::{self, Iface},
    peers::PeerIds,
    probes::Probes,
};
use crate::sense::sensors::{Readings, Sensors};

/// What `watch` prints.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Table,
    Json { flows: bool },
    Snapshots,
}

pub async fn run(
    names: &[String],
    output: Output,
    peers: &[(String, IpNet)],
    dscp: &[DscpArg],
    rdma_root: &std::path::Path,
    count: Option<u64>,
) -> anyhow::Result<()> {
    let ifaces = names.iter().map(|n| Iface::resolve(n)).collect::<Result<Vec<_>, _>>()?;
    let peer_ids = PeerIds::assign(peers.iter().map(|(n, net)| (n.as_str(), *net)))?;
    let rules = dscp_rules(dscp, &ifaces, &peer_ids)?;
    let offsets = checks::preflight(true)?;
    // Signal handlers first, so a Ctrl-C during attach still detaches cleanly.
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;

    let mut probes = Probes::load_for(offsets, ifaces.len() as u32)?;
    let _datapath_log = crate::kernel::datapath_log::forward_from(&mut probes)
        .context("reading the programs' log")?;
    probes.set_peers(&peer_ids.prefixes)?;
    probes.set_dscp_rules(&rules)?;
    probes
        .sync_local_addrs(&iface::local_addrs(&ifaces).context("listing interface addresses")?)?;
    for iface in &ifaces {
        probes.watch(iface)?;
    }
    probes.attach_tracepoints()?;
    tracing::info!(ifaces = ?names, "watching; Ctrl-C or SIGTERM to stop");

    let mut prev = vec![IfaceStats::default(); ifaces.len()];
    // Peer rows: configured peers by id, then "other" (id 0).
    let peer_rows = peer_ids.rows();
    let mut prev_peers: Vec<Vec<PeerTotals>> = ifaces
        .iter()
        .map(|_| peer_rows.iter().map(|(_, n)| PeerTotals::new(n, &Default::default())).collect())
        .collect();
    let mut last_read = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.tick().await;
    let mut ticks = 0u64;
    if output == Output::Table {
        println!("{}", table_header());
    }
    let started = Instant::now();
    let mut sensors = Sensors::new(Duration::from_secs(10));
    loop {
        let stop = tokio::select! {
            _ = ticker.tick() => false,
            _ = sigterm.recv() => true,
            _ = sigint.recv() => true,
        };
        // Addresses can change while we watch; retransmissions are attributed by address.
        match iface::local_addrs(&ifaces) {
            Ok(addrs) => probes.sync_local_addrs(&addrs)?,
            Err(e) => warn!("listing interface addresses: {e}"),
        }
        let now = Instant::now();
        let elapsed = now - last_read;
        last_read = now;
        ticks += 1;
        let last = stop || count.is_some_and(|c| ticks >= c);
        if output == Output::Snapshots {
            let kernel_ns = crate::kernel::probes::monotonic_ns();
            let mut readings =
                Readings { kernel_ns, flows: probes.flows()?, ..Readings::default() };
            let ports = crate::rdma::discover_here(rdma_root).unwrap_or_else(|e| {
                warn!("{e}");
                Vec::new()
            });
            probes.read_rows(&ifaces, &peer_rows, &ports, &mut readings)?;
            println!("{}", serde_json::to_string(&sensors.tick(started.elapsed(), &readings))?);
            if last {
                break;
            }
            continue;
        }
        // The flow table is read once per tick, not once per interface.
        let all_flows =
            if output == (Output::Json { flows: true }) { probes.flows()? } else { Vec::new() };
        for (i, iface) in ifaces.iter().enumerate() {
            let totals = probes.stats(iface.ifindex)?;
            let r = rates(&prev[i], &totals, elapsed);
            prev[i] = totals;
            let peers = peer_rows
                .iter()
                .map(|(id, name)| {
                    Ok(PeerTotals::new(name, &probes.peer_stats(iface.ifindex, *id)?))
                })
                .collect::<Result<Vec<_>, crate::kernel::probes::ProbeError>>()?;
            let peer_rows: Vec<String> = prev_peers[i]
                .iter()
                .zip(&peers)
                .map(|(a, b)| peer_row(a, b, elapsed.as_secs_f64()))
                .collect();
            prev_peers[i] = peers.clone();
            if let Output::Json { flows: list_flows } = output {
                let flows = list_flows.then(|| {
                    all_flows
                        .iter()
                        .filter(|(_, f)| f.ifindex == iface.ifindex)
                        .map(|(k, f)| FlowSample::new(k, f))
                        .collect()
                });
                let sample = Sample {
                    flows,
                    unix_ms: SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_millis(),
                    iface: iface.name.clone(),
                    ifindex: iface.ifindex,
                    interval_s: elapsed.as_secs_f64(),
                    rates: r,
                    totals,
                    peers,
                    last,
                };
                println!("{}", serde_json::to_string(&sample)?);
            } else {
                println!("{}", table_row(&iface.name, &r));
                for row in peer_rows {
                    println!("{row}");
                }
            }
        }
        if last {
            break;
        }
    }
    drop(probes);
    tracing::info!("detached");
    Ok(())
}
