//! The training side's owner: the tuner plugins' counters, the jobs' reports and each job's
//! totals, and what the sock_ops program has done for their connections. Read at most once a
//! second; the jobs' progress goes into that tick's snapshot.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use super::{
    jobs::{Added, JobStatus, Jobs},
    metrics::Metrics,
    sensing::Sensing,
    transport::{self, TransportPath, TransportStatus},
    RunOptions,
};
use crate::{
    board::{
        job_reports,
        tuner_stats::{self, TunerProcess},
    },
    control::{Plan, Policy},
    sense::sensors::JobProgress,
};

#[derive(Default)]
pub(super) struct TrainingSide {
    /// The tuner plugin's counters of each training process, and when they were last read.
    pub tuner: Vec<TunerProcess>,
    tuner_read: Option<Instant>,
    /// The training jobs' reports, as of the latest read (with the tuner's, once a second).
    jobs: Jobs,
    pub job_status: Vec<JobStatus>,
    pub job_refused: Vec<String>,
    /// Each job's totals since it was first read (what the core judges and sizes codecs by).
    /// Each job's totals since the daemon first read it (never going down: a restarted rank's
    /// totals start over in its own report, not here).
    job_totals: BTreeMap<String, Added>,
    /// What the sock_ops program has done, as of the latest read (once a second).
    pub transport_status: TransportStatus,
}

impl TrainingSide {
    /// Tuner counters, the transport's figures and the job reports, at most once a second;
    /// the jobs' progress when they were read. `plan` is the one in place.
    pub fn read(
        &mut self,
        o: &RunOptions,
        policy: &Policy,
        plan: &Plan,
        path: &TransportPath,
        sense: &mut Sensing,
        metrics: &Metrics,
    ) -> Option<Vec<JobProgress>> {
        if self.tuner_read.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return None;
        }
        self.tuner_read = Some(Instant::now());
        self.tuner = tuner_stats::scan(&o.tuner_stats, !o.dry_run);
        metrics.tuner(&self.tuner);
        match transport::status(path, plan, &sense.peers, &sense.probes) {
            Ok(t) => {
                metrics.transport.update(&t.links);
                self.transport_status = t;
            }
            Err(e) => tracing::warn!("reading the transport profiles' counters: {e}"),
        }
        Some(self.read_jobs(o, policy, sense, metrics))
    }

    /// The training jobs' reports: read, differenced, shown in the metrics; each job's
    /// progress since it was first read.
    fn read_jobs(
        &mut self,
        o: &RunOptions,
        policy: &Policy,
        sense: &mut Sensing,
        metrics: &Metrics,
    ) -> Vec<JobProgress> {
        let mut malformed = Vec::new();
        let reports = job_reports::scan(&o.job_reports, !o.dry_run, |file, why| {
            malformed.push((why, file.to_owned()));
        });
        sense.set_jobs(&o.job_reports, &reports, policy, metrics);
        let links = &policy.links;
        let link_bps = |name: Option<&str>| {
            let l = match name {
                Some(n) => links.iter().find(|l| l.name == n),
                None => links.first(),
            }?;
            Some((l.name.clone(), l.capacity_bps))
        };
        let mut reading = self.jobs.update(Instant::now(), reports, link_bps);
        reading.refused.extend(malformed);
        metrics.jobs.update(&reading);
        self.job_refused = reading.refused.iter().map(|(why, f)| format!("{f}: {why}")).collect();
        self.job_totals.retain(|job, _| reading.jobs.iter().any(|j| &j.job == job));
        let progress = reading
            .jobs
            .iter()
            .map(|j| {
                let t = self.job_totals.entry(j.job.clone()).or_default();
                if let Some(a) = reading.added.get(&j.job) {
                    *t += a.clone();
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
    pub fn look_up_job_flows(
        &self,
        o: &RunOptions,
        policy: &Policy,
        sense: &mut Sensing,
        metrics: &Metrics,
    ) {
        let reports = job_reports::scan(&o.job_reports, !o.dry_run, |_, _| {});
        sense.set_jobs(&o.job_reports, &reports, policy, metrics);
    }
}
