//! The training jobs' series (`linkpilot_job_*`, label `training_job`: Prometheus keeps `job`
//! for its scrape job): counters of what the jobs'
//! processes on this host reported (summed over them: per step, divide by
//! `job_rank_steps_total`), and the last window's figures as gauges. A job whose processes are
//! all gone has its series removed; at most [`MAX_JOBS`] jobs are shown (names are anyone's).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{atomic::AtomicU64, Arc, Mutex},
};

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::{family, labels, metric, Labels, F64};
use crate::daemon::jobs::Reading;

/// Jobs with series at once; the rest are left out (status still lists them).
pub const MAX_JOBS: usize = 32;

type FCounter = Counter<f64, AtomicU64>;

#[derive(Clone)]
pub struct JobMetrics {
    ranks: Family<Labels, Gauge>,
    rank_steps: Family<Labels, Counter>,
    seconds: Vec<(&'static str, Family<Labels, FCounter>)>,
    wire_bytes: Family<Labels, Counter>,
    failed: Family<Labels, Counter>,
    window: Vec<(&'static str, Family<Labels, F64>)>,
    codec: Family<Labels, Gauge>,
    refused: Family<Labels, Counter>,
    namespaces: Gauge,
    /// Jobs with series, and the codec each one's `job_codec` series names.
    shown: Arc<Mutex<BTreeMap<String, String>>>,
}

impl JobMetrics {
    pub fn register(r: &mut Registry) -> Self {
        let seconds = [
            ("job_step_seconds", "Wall time of the job's steps, summed over its processes here"),
            ("job_compute_seconds", "Step time not waiting for communication"),
            ("job_comm_wait_seconds", "Step time waiting for communication no compute hid"),
        ]
        .map(|(n, h)| (n, family(r, n, h)))
        .to_vec();
        let window = [
            ("job_comm_share", "Exposed communication wait over step time, last 10 s"),
            ("job_steps_per_second", "Steps per second, last 10 s"),
            ("job_wire_bytes_per_step", "Bytes this host's processes sent per step, last 10 s"),
            ("job_achieved_bytes_per_second", "Bytes per second sent, last 10 s"),
            ("job_link_share", "Achieved rate over the nominal capacity of the job's link"),
            ("job_loss", "The lowest local rank's training loss, when reported"),
            ("job_sync_every_steps", "Steps between cross-site syncs (synchronizer jobs)"),
        ]
        .map(|(n, h)| (n, family(r, n, h)))
        .to_vec();
        let refused: Family<Labels, Counter> = family(
            r,
            "job_reports_refused",
            "Job reports refused: malformed (a bad file) or implausible (a change no process \
             could make; that process starts over)",
        );
        for reason in ["malformed", "implausible"] {
            let _ = refused.get_or_create(&labels(&[("reason", reason)]));
        }
        let namespaces = metric(
            r,
            "job_namespaces",
            "Reporting jobs' own network namespaces the programs act in (policy job_namespaces)",
        );
        Self {
            namespaces,
            ranks: family(r, "job_ranks", "The job's processes reporting on this host"),
            rank_steps: family(r, "job_rank_steps", "Steps, summed over the job's processes here"),
            seconds,
            wire_bytes: family(r, "job_wire_bytes", "Bytes the job's processes put on the wire"),
            failed: family(r, "job_failed_collectives", "Collectives or exchanges that failed"),
            window,
            codec: family(r, "job_codec", "1 for the codec the job's exchanges use"),
            refused,
            shown: Arc::default(),
        }
    }

    /// How many of the jobs' own network namespaces the programs act in.
    pub fn namespaces(&self, n: usize) {
        self.namespaces.set(n as i64);
    }

    /// One read of the job-report directory.
    pub fn update(&self, reading: &Reading) {
        for (why, _) in &reading.refused {
            let reason = if why.starts_with("implausible") { "implausible" } else { "malformed" };
            self.refused.get_or_create(&labels(&[("reason", reason)])).inc();
        }
        let Ok(mut shown) = self.shown.lock() else { return };
        let now: BTreeSet<&str> =
            reading.jobs.iter().take(MAX_JOBS).map(|j| j.job.as_str()).collect();
        shown.retain(|job, codec| {
            let keep = now.contains(job.as_str());
            if !keep {
                self.forget(job, codec);
            }
            keep
        });
        for j in reading.jobs.iter().filter(|j| now.contains(j.job.as_str())) {
            let l = labels(&[("training_job", &j.job)]);
            self.ranks.get_or_create(&l).set(j.ranks.len() as i64);
            // Every counter from a job's first read, at 0 until a second read adds to it: a
            // rate needs two samples of a series, and a series born late has one less.
            let a = reading.added.get(&j.job).cloned().unwrap_or_default();
            self.rank_steps.get_or_create(&l).inc_by(a.steps);
            for ((_, f), v) in self.seconds.iter().zip([a.step_s, a.compute_s, a.wait_s]) {
                f.get_or_create(&l).inc_by(v);
            }
            self.wire_bytes.get_or_create(&l).inc_by(a.wire_bytes);
            self.failed.get_or_create(&l).inc_by(a.failed);
            let values = [
                j.comm_share,
                j.steps_per_s,
                j.wire_bytes_per_step,
                j.achieved_bps.map(|b| b / 8.0),
                j.link_share,
                j.loss,
                j.sync_every.map(f64::from),
            ];
            for ((_, f), v) in self.window.iter().zip(values) {
                match v {
                    Some(v) => {
                        f.get_or_create(&l).set(v);
                    }
                    None => {
                        f.remove(&l);
                    }
                }
            }
            if let Some(was) = shown.insert(j.job.clone(), j.codec.clone()) {
                if was != j.codec {
                    self.codec.remove(&labels(&[("training_job", &j.job), ("codec", &was)]));
                }
            }
            self.codec
                .get_or_create(&labels(&[("training_job", &j.job), ("codec", &j.codec)]))
                .set(1);
        }
    }

    fn forget(&self, job: &str, codec: &str) {
        let l = labels(&[("training_job", job)]);
        self.ranks.remove(&l);
        self.rank_steps.remove(&l);
        self.wire_bytes.remove(&l);
        self.failed.remove(&l);
        for (_, f) in &self.seconds {
            f.remove(&l);
        }
        for (_, f) in &self.window {
            f.remove(&l);
        }
        self.codec.remove(&labels(&[("training_job", job), ("codec", codec)]));
    }
}
