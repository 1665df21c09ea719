//! The sensing owner: the programs, the watched interfaces and peers, the RDMA ports, and the
//! sensors that turn what the programs count into one snapshot per tick.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use anyhow::Context;
use tracing::warn;

use super::{flow_reads, health::SensingHealth, linelog, losses, metrics::Metrics, RunOptions};
use crate::{
    board::{job_flows, job_reports::JobReport},
    control::Policy,
    kernel::{
        iface::{self, Iface},
        peers::PeerIds,
        probes::{self, monotonic_ns, Probes},
    },
    rdma,
    sense::sensors::{JobProgress, Readings, Sensors, Snapshot},
};

pub(super) struct Sensing {
    pub ifaces: Vec<Iface>,
    pub peers: PeerIds,
    /// (peer id, name) of every peer: the rows the programs count by.
    pub rows: Vec<(u32, String)>,
    pub probes: Probes,
    pub sensors: Sensors,
    /// When the flow table was last read and what reading it cost.
    flows_read: Option<(Instant, Duration)>,
    /// When the jobs' connections were last looked up between the once-a-second reads of the
    /// reports, and what that cost.
    owners_read: Option<(Instant, Duration)>,
    /// Flows in the table as of its latest read.
    pub flows_seen: u64,
    /// When the interfaces' addresses were last synced to the programs (retransmissions are
    /// attributed by local address, and addresses change: DHCP, failover).
    addrs_synced: Instant,
    /// RDMA ports on the watched interfaces, and when they were last discovered.
    pub ports: Vec<rdma::RdmaPort>,
    ports_found: Option<Instant>,
    pub health: SensingHealth,
    /// Watched interfaces that are gone now (ifaces.rs).
    pub missing: Vec<String>,
    losses: losses::LossReport,
    /// This process's network namespace (inode number; 0: unknown).
    own_netns: u32,
    /// The reporting jobs' own namespaces the programs act in (`job_namespaces`).
    job_namespaces: BTreeSet<probes::JobNetns>,
    /// `--record`: every snapshot, for replays.
    record: Option<linelog::LineLog>,
    /// Interfaces created again and re-attached, until the actuators are told (their DSCP
    /// rules name the old index).
    pub(super) recreated: Vec<Iface>,
}

/// What the programs counted in one tick, before the jobs' side is folded in.
pub(super) struct Counted {
    readings: Readings,
    /// When the counters were read, from the start.
    read_at: Duration,
}

impl Counted {
    /// Whether this tick read the flow table.
    pub fn read_flows(&self) -> bool {
        !self.readings.flows_skipped
    }
}

impl Sensing {
    pub fn new(
        ifaces: Vec<Iface>,
        peers: PeerIds,
        probes: Probes,
        policy: &Policy,
        give_up_after: Duration,
        own_netns: u32,
        record: Option<linelog::LineLog>,
    ) -> Self {
        Self {
            rows: peers.rows(),
            sensors: Sensors::new(Duration::from_nanos(policy.estimator.window.0)),
            ifaces,
            peers,
            probes,
            flows_read: None,
            owners_read: None,
            flows_seen: 0,
            addrs_synced: Instant::now(),
            ports: Vec::new(),
            ports_found: None,
            health: SensingHealth::new(give_up_after),
            missing: Vec::new(),
            losses: losses::LossReport::default(),
            own_netns,
            job_namespaces: BTreeSet::new(),
            record,
            recreated: Vec::new(),
        }
    }

    /// The counters at the tick's start, the flow table when due, the RDMA ports, and the
    /// interfaces and their addresses once a second.
    pub fn count(
        &mut self,
        tick: Duration,
        started: Instant,
        o: &RunOptions,
        metrics: &Metrics,
    ) -> anyhow::Result<Counted> {
        if self.addrs_synced.elapsed() >= Duration::from_secs(1) {
            self.addrs_synced = Instant::now();
            self.follow_interfaces(metrics)?;
            let addrs = iface::local_addrs(&self.ifaces).context("listing addresses")?;
            self.probes.sync_local_addrs(&addrs)?;
        }
        let kernel_ns = monotonic_ns();
        // The RDMA ports on the watched interfaces: found every 10 s (devices come and go),
        // their state and signal counters re-read every tick.
        if self.ports_found.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            // Only ports bound to a netdev of this namespace (rdma.rs: names alone mislead).
            let all = rdma::discover_here(&o.rdma_root).unwrap_or_else(|e| {
                warn!("{e}");
                Vec::new()
            });
            self.ports = all
                .into_iter()
                .filter(|p| self.ifaces.iter().any(|i| p.netdevs.contains(&i.name)))
                .map(|p| rdma::RdmaPort { other: Default::default(), ..p })
                .collect();
            self.ports_found = Some(Instant::now());
        } else {
            rdma::refresh(&o.rdma_root, &mut self.ports);
        }
        let mut readings = Readings { kernel_ns, ..Readings::default() };
        // Counters first, at the tick's start, so that every rate covers one tick's interval:
        // read after a full flow table (up to 63 ms), they made the next interval that much
        // shorter, and a bursty sender's short interval could hold none of its bursts (0 bit/s).
        self.probes.read_rows(&self.ifaces, &self.rows, &self.ports, &mut readings)?;
        let read_at = started.elapsed();
        if flow_reads::due(self.flows_read, tick) {
            let t = Instant::now();
            readings.flows = self.probes.flows()?;
            self.flows_read = Some((t, t.elapsed()));
            self.flows_seen = readings.flows.len() as u64;
        } else {
            readings.flows_skipped = true;
        }
        let present = (!readings.flows_skipped).then_some(readings.flows.len());
        let skipped = self.probes.skipped_runs();
        self.losses.update(&self.probes.losses()?, present, skipped, &metrics.datapath_lost);
        Ok(Counted { readings, read_at })
    }

    /// The interfaces created again since the last call (also after a failed count).
    pub fn take_recreated(&mut self) -> Vec<Iface> {
        std::mem::take(&mut self.recreated)
    }

    /// Whether a marked flow of unknown owner calls for looking the jobs' connections up before
    /// the once-a-second read of the reports: a job's new connection marked before then would
    /// give its marks to others. Within the same share of a core as the flow table's reads.
    pub fn owners_due(&mut self, counted: &Counted, tick: Duration) -> bool {
        let due = counted.read_flows()
            && self.sensors.unknown_owner(&counted.readings.flows)
            && flow_reads::due(self.owners_read, tick);
        if due {
            self.owners_read = Some((Instant::now(), Duration::ZERO));
        }
        due
    }

    /// Records what looking the owners up cost (see [`Self::owners_due`]).
    pub fn owners_looked_up(&mut self, cost: Duration) {
        if let Some((_, c)) = self.owners_read.as_mut() {
            *c = cost;
        }
    }

    /// The tick's snapshot, with the jobs' progress when it was read; recorded when asked.
    pub fn snapshot(
        &mut self,
        counted: &Counted,
        jobs: Option<Vec<JobProgress>>,
        metrics: &Metrics,
    ) -> anyhow::Result<Snapshot> {
        let mut snap = self.sensors.tick(counted.read_at, &counted.readings);
        // Only readings with jobs: a reading without any tells the judgments nothing.
        snap.jobs = jobs.filter(|j| !j.is_empty());
        if self.record.is_some() {
            linelog::append(&mut self.record, &serde_json::to_string(&snap)?, metrics);
        }
        Ok(snap)
    }

    /// The jobs' connections (their report files' owners) and, where the policy opts in, their
    /// own network namespaces: the marks their own bursts get are told from others'.
    pub fn set_jobs(
        &mut self,
        dir: &std::path::Path,
        reports: &[(String, JobReport)],
        policy: &Policy,
        metrics: &Metrics,
    ) {
        let names: Vec<String> = reports.iter().map(|(n, _)| n.clone()).collect();
        let owners = job_flows::report_owners(dir, &names);
        self.set_job_namespaces(reports, policy, metrics);
        let netns = self.job_namespaces.iter().map(|n| n.inum).collect();
        self.sensors.set_job_flows(job_flows::job_flows(&owners), netns);
    }

    fn set_job_namespaces(
        &mut self,
        reports: &[(String, JobReport)],
        policy: &Policy,
        metrics: &Metrics,
    ) {
        let want = if policy.job_namespaces && self.own_netns != 0 {
            let ifaces = &self.ifaces;
            let iface_of = |link: Option<&str>| {
                let l = match link {
                    Some(n) => policy.links.iter().find(|l| l.name == n),
                    None => policy.links.first(),
                }?;
                let name = l.interfaces.first()?;
                ifaces.iter().find(|i| &i.name == name).map(|i| i.ifindex)
            };
            job_flows::job_namespaces(reports.iter().map(|(_, r)| r), self.own_netns, iface_of)
        } else {
            Default::default()
        };
        if want == self.job_namespaces {
            return;
        }
        match self.probes.set_job_namespaces(&want) {
            Ok(()) => {
                let inums: Vec<u32> = want.iter().map(|n| n.inum).collect();
                tracing::info!(namespaces = ?inums, "the jobs' own network namespaces");
                metrics.jobs.namespaces(want.len());
                self.job_namespaces = want;
            }
            Err(e) => tracing::warn!("setting the jobs' network namespaces: {e}"),
        }
    }

    /// A reloaded policy's peers: the programs' peer table, the rows, and the sensors when the
    /// peers or the rate window changed. Err (with the running peers back) if the table could
    /// not be set.
    pub fn set_peers(
        &mut self,
        peers: PeerIds,
        window_changed: bool,
        window: Duration,
    ) -> Result<(), String> {
        let new_peers = peers.prefixes != self.peers.prefixes;
        if new_peers {
            if let Err(e) = self.probes.set_peers(&peers.prefixes) {
                // The trie may be half updated: put the running peers back.
                let back = self.probes.set_peers(&self.peers.prefixes);
                return Err(format!("setting the peers: {e}; restoring them: {back:?}"));
            }
        }
        // Also when only names changed (same ids and prefixes): rows and rules go by name.
        self.rows = peers.rows();
        self.peers = peers;
        // Peer ids may now name other peers, or the window changed: rates and RTT windows
        // start again from the next reading.
        if new_peers || window_changed {
            self.sensors = Sensors::new(window);
        }
        Ok(())
    }
}
