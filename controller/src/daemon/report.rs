//! What a tick reports: the Prometheus series and the status API's snapshot, and the series
//! a reload leaves behind.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use linkpilot_common::{MAX_FLOWS, MAX_PEERS};

use super::{
    status::{LinkStatus, PeerStatus, Status},
    Daemon,
};
use crate::{
    board::{job_flows, job_reports, tuner_stats},
    sense::sensors::{JobProgress, Snapshot},
};

/// A job's totals since the daemon first read it (never going down: a restarted rank's totals
/// start over in its own report, not here).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct JobTotals {
    steps: u64,
    step_s: f64,
    compute_s: f64,
    wire_bytes: u64,
}

impl Daemon {
    /// Metrics and the status API after a tick (`flows_read`: the flow table was read in it).
    pub(super) fn report(&mut self, snap: &Snapshot, flows: u64, flows_read: bool, work: Duration) {
        let m = &self.metrics;
        let held = self.core.held();
        m.outcome.update(self.core.policy().links.iter().map(|l| l.name.as_str()), &held);
        let codec_checks = self.core.codec_checks();
        m.codec.update(&codec_checks);
        let states: Vec<String> =
            self.core.policy().states.iter().map(|s| s.name.clone()).collect();
        let signals = self.core.signals();
        let mut links = Vec::new();
        for (link, state, k) in self.core.current() {
            let s = signals.iter().find(|(l, _)| *l == link).map(|(_, s)| *s).unwrap_or_default();
            m.link(link, &states, state, &k, &s);
            let (id, reason) = self
                .last
                .iter()
                .find(|(l, _, _)| l == link)
                .map(|(_, id, r)| (*id, r.clone()))
                .unwrap_or_default();
            links.push(LinkStatus {
                link: link.to_owned(),
                state: state.to_owned(),
                knobs: k,
                signals: s,
                decision_id: id,
                reason,
            });
        }
        m.snapshot(snap, flows_read);
        let (sysctls, roce) = (self.act.sysctls.as_ref(), self.act.roce.as_ref());
        let released = [
            ("sysctl", sysctls.map_or(0, |s| s.released().len())),
            ("roce_tc", roce.map_or(0, |r| r.released().len())),
        ];
        m.actuators(self.act.ledger.entries(), &released);
        m.map("flows", flows, u64::from(MAX_FLOWS));
        m.map("peers", self.peers.names.len() as u64, u64::from(MAX_PEERS));
        m.ticks.inc();
        m.tick_duration.observe(work.as_secs_f64());
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        m.last_tick.set(now.as_secs_f64());
        let reload = |r: &str| {
            m.reloads.get(&vec![("result".to_owned(), r.to_owned())]).map_or(0, |c| c.get())
        };
        let Ok(mut st) = self.status.lock() else { return };
        let last_reload_error = st.last_reload_error.take();
        *st = Status {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            pid: std::process::id(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            policy: self.o.policy.display().to_string(),
            policy_sha256: self.policy_sha256.clone(),
            starting: false,
            dry_run: self.o.dry_run,
            observe_only: self.observe_only.then(|| super::OBSERVE_ONLY.to_owned()),
            interfaces: self.ifaces.iter().map(|i| i.name.clone()).collect(),
            interfaces_missing: self.missing.clone(),
            tick_ms: self.core.policy().tick.0 as f64 / 1e6,
            ticks: m.ticks.get(),
            last_tick_work_ms: work.as_secs_f64() * 1e3,
            reloads_applied: reload("applied"),
            reloads_rejected: reload("rejected"),
            last_reload_error,
            sensing_errors: self.health.total,
            sensing_failing_ticks: 0,
            last_sensing_error: self.health.last_error.clone(),
            flows,
            flows_capacity: u64::from(MAX_FLOWS),
            sysctls_released: sysctls.map(|s| s.released().to_vec()).unwrap_or_default(),
            sysctls_unmanaged: sysctls.map(|s| s.unmanaged().to_vec()).unwrap_or_default(),
            roce_tc_released: roce.map(|r| r.released().to_vec()).unwrap_or_default(),
            actuators: self.act.ledger.entries().to_vec(),
            links,
            nccl_tuner: self.tuner.clone(),
            jobs: self.job_status.clone(),
            job_reports_refused: self.job_refused.clone(),
            transport: self.transport_status.clone(),
            verdicts: self.verdicts.clone(),
            codec_checks,
            pending_judgments: self.core.pending_judgments(),
            held,
            peers: snap
                .peers
                .iter()
                .map(|p| PeerStatus {
                    interface: p.link.clone(),
                    peer: p.peer.clone(),
                    srtt_ms: p.rtt.srtt_ms,
                    p99_ms: p.rtt.p99_ms,
                    rx_bps: p.rx_bps,
                    tx_bps: p.tx_bps,
                    ce_fraction: p.ce_fraction,
                    job_ce_share: p.job_ce_share,
                    job_ece_share: p.job_ece_share,
                    retrans_per_s: p.retrans_per_s,
                    flows: p.flows,
                })
                .collect(),
        };
    }

    /// Training processes' tuner counters and job reports: a directory listing and a read per
    /// process, at most once a second; the jobs' progress when they were read.
    pub(super) fn read_training_side(&mut self) -> Option<Vec<JobProgress>> {
        if self.tuner_read.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return None;
        }
        self.tuner_read = Some(Instant::now());
        self.tuner = tuner_stats::scan(&self.o.tuner_stats, !self.o.dry_run);
        self.metrics.tuner(&self.tuner);
        match super::transport::status(&self.transport_path, &self.core, &self.peers, &self.probes)
        {
            Ok(t) => {
                self.metrics.transport.update(&t.links);
                self.transport_status = t;
            }
            Err(e) => tracing::warn!("reading the transport profiles' counters: {e}"),
        }
        Some(self.read_jobs())
    }

    /// The training jobs' reports: read, differenced, shown in the metrics; each job's
    /// progress since it was first read.
    fn read_jobs(&mut self) -> Vec<JobProgress> {
        let mut malformed = Vec::new();
        let reports = job_reports::scan(&self.o.job_reports, !self.o.dry_run, |file, why| {
            malformed.push((why, file.to_owned()));
        });
        // Their owners' connections, so that the marks their own bursts get are told from
        // others'.
        self.set_job_flows(&reports);
        let links = &self.core.policy().links;
        let link_bps = |name: Option<&str>| {
            let l = match name {
                Some(n) => links.iter().find(|l| l.name == n),
                None => links.first(),
            }?;
            Some((l.name.clone(), l.capacity_bps))
        };
        let mut reading = self.jobs.update(Instant::now(), reports, link_bps);
        reading.refused.extend(malformed);
        self.metrics.jobs.update(&reading);
        self.job_refused = reading.refused.iter().map(|(why, f)| format!("{f}: {why}")).collect();
        self.job_totals.retain(|job, _| reading.jobs.iter().any(|j| &j.job == job));
        let progress = reading
            .jobs
            .iter()
            .map(|j| {
                let t = self.job_totals.entry(j.job.clone()).or_default();
                if let Some(a) = reading.added.get(&j.job) {
                    t.steps += a.steps;
                    t.step_s += a.step_s;
                    t.compute_s += a.compute_s;
                    t.wire_bytes += a.wire_bytes;
                }
                JobProgress {
                    job: j.job.clone(),
                    link: j.link.clone().unwrap_or_default(),
                    rank_steps: t.steps,
                    step_seconds: t.step_s,
                    codec: j.codec.clone(),
                    kind: j.kind.clone(),
                    compute_seconds: t.compute_s,
                    wire_bytes: t.wire_bytes,
                    processes: j.ranks.len() as u32,
                }
            })
            .collect();
        self.job_status = reading.jobs;
        progress
    }

    /// The jobs' connections, looked up again between the reads of their reports (a marked
    /// flow of unknown owner appeared): the reports' owners and their established connections;
    /// what is wrong with a report is said by the next read.
    pub(super) fn look_up_job_flows(&mut self) {
        let reports = job_reports::scan(&self.o.job_reports, !self.o.dry_run, |_, _| {});
        self.set_job_flows(&reports);
    }

    fn set_job_flows(&mut self, reports: &[(String, job_reports::JobReport)]) {
        let names: Vec<String> = reports.iter().map(|(n, _)| n.clone()).collect();
        let owners = job_flows::report_owners(&self.o.job_reports, &names);
        self.set_job_namespaces(reports);
        let netns = self.job_namespaces.iter().map(|n| n.inum).collect();
        self.sensors.set_job_flows(job_flows::job_flows(&owners), netns);
    }

    /// The jobs' own network namespaces to the programs, where the policy opts in.
    fn set_job_namespaces(&mut self, reports: &[(String, job_reports::JobReport)]) {
        let policy = self.core.policy();
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
                self.metrics.jobs.namespaces(want.len());
                self.job_namespaces = want;
            }
            Err(e) => tracing::warn!("setting the jobs' network namespaces: {e}"),
        }
    }

    /// Removes the metric series of links, states and peers the running policy no longer has.
    pub(super) fn forget_series(&self) {
        let p = self.core.policy();
        let links: Vec<String> = p.links.iter().map(|l| l.name.clone()).collect();
        let states: Vec<String> = p.states.iter().map(|s| s.name.clone()).collect();
        let rows: Vec<(String, String)> = (self.ifaces.iter())
            .flat_map(|i| self.rows.iter().map(|(_, peer)| (i.name.clone(), peer.clone())))
            .collect();
        self.metrics.retain(&links, &states, &rows);
    }
}
