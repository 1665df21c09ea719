//! Per job, what the network costs its steps: the training processes' reports
//! (`board::job_reports`) read once a second, each process's totals differenced over the last
//! [`WINDOW`], and summed over the job's processes on this host. A change between two reads
//! that no process could have made (more step time than wall time passed, more bytes than
//! any link carries, a total that went down) is refused and that process starts over from its
//! new totals: a restarted rank, or a hostile file, never shows as a negative or absurd rate.

use std::{
    collections::{BTreeMap, VecDeque},
    time::Instant,
};

use serde::{Deserialize, Serialize};

use crate::{board::job_reports::JobReport, control::knobs::bytes};

/// Rates are taken over this much of each process's recent reports.
pub const WINDOW: std::time::Duration = std::time::Duration::from_secs(10);
/// Step time a process may add beyond the wall time between two reads: it rewrites its file at
/// most 4 times a second, so one read may see up to a step's worth more than the last.
const STEP_SLACK_S: f64 = 60.0;
/// More than any link carries (1 Tbit/s), per second between two reads.
const MAX_BYTES_PER_S: f64 = 125e9;
/// More steps than any process takes per second.
const MAX_STEPS_PER_S: f64 = 10_000.0;

/// One job on this host, as `linkpilot status` shows it. Rates and per-step figures are over
/// the last [`WINDOW`] (None until a process reported twice with a step between).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobStatus {
    pub job: String,
    pub kind: String,
    pub world: u32,
    /// This host's processes reporting for it, and their ranks.
    pub ranks: Vec<u32>,
    /// The furthest process's step count.
    pub steps: u64,
    pub steps_per_s: Option<f64>,
    /// Per step, averaged over the processes: wall time, compute, communication no compute hid.
    pub step_s: Option<f64>,
    pub compute_s: Option<f64>,
    pub wait_s: Option<f64>,
    /// wait over step time.
    pub comm_share: Option<f64>,
    /// Bytes this host's processes put on the wire per step, and per second (bits).
    pub wire_bytes_per_step: Option<f64>,
    pub achieved_bps: Option<f64>,
    /// The policy link the job's traffic takes, its nominal rate, and achieved over it.
    pub link: Option<String>,
    pub link_bps: Option<f64>,
    pub link_share: Option<f64>,
    pub codec: String,
    pub sync_every: Option<u32>,
    /// The lowest local rank's latest loss, when it reports one.
    pub loss: Option<f64>,
    pub failed: u64,
}

/// Totals a report adds since the previous accepted one, for the metrics' counters; summed,
/// a job's totals.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Added {
    pub steps: u64,
    pub step_s: f64,
    pub compute_s: f64,
    pub wait_s: f64,
    pub wire_bytes: u64,
    pub failed: u64,
}

/// What one read of the directory gave: the jobs, the counters' increments per job, and the
/// reports refused (reason, file).
#[derive(Debug, Default)]
pub struct Reading {
    pub jobs: Vec<JobStatus>,
    pub added: BTreeMap<String, Added>,
    pub refused: Vec<(String, String)>,
}

/// Each reporting process's recent reports, by file name.
#[derive(Default)]
pub struct Jobs {
    seen: BTreeMap<String, VecDeque<(Instant, JobReport)>>,
}

/// Why the change from `a` (read at `ta`) to `b` (at `tb`) cannot be one process's, if it cannot.
fn implausible(ta: Instant, a: &JobReport, tb: Instant, b: &JobReport) -> Option<String> {
    let dt = tb.saturating_duration_since(ta).as_secs_f64();
    if a.job != b.job || a.rank != b.rank || a.world != b.world {
        return Some("the job or rank changed".into());
    }
    if b.steps < a.steps
        || b.step_s < a.step_s
        || b.compute_s < a.compute_s
        || b.wait_s < a.wait_s
        || b.wire_bytes < a.wire_bytes
        || b.failed < a.failed
    {
        return Some("a total went down".into());
    }
    if b.step_s - a.step_s > dt + STEP_SLACK_S {
        return Some(format!("{:.1} s of steps in {dt:.1} s", b.step_s - a.step_s));
    }
    if (b.steps - a.steps) as f64 > MAX_STEPS_PER_S * (dt + 1.0) {
        return Some(format!("{} steps in {dt:.1} s", b.steps - a.steps));
    }
    if (b.wire_bytes - a.wire_bytes) as f64 > MAX_BYTES_PER_S * (dt + 1.0) {
        return Some(format!("{} bytes in {dt:.1} s", b.wire_bytes - a.wire_bytes));
    }
    None
}

impl std::ops::AddAssign for Added {
    fn add_assign(&mut self, x: Added) {
        self.steps += x.steps;
        self.step_s += x.step_s;
        self.compute_s += x.compute_s;
        self.wait_s += x.wait_s;
        self.wire_bytes += x.wire_bytes;
        self.failed += x.failed;
    }
}

fn added(a: &JobReport, b: &JobReport) -> Added {
    Added {
        steps: b.steps - a.steps,
        step_s: b.step_s - a.step_s,
        compute_s: b.compute_s - a.compute_s,
        wait_s: b.wait_s - a.wait_s,
        wire_bytes: b.wire_bytes - a.wire_bytes,
        failed: b.failed - a.failed,
    }
}

impl Jobs {
    /// Takes one read of the directory (`reports` by file name, at `now`); `link_bps` gives a
    /// policy link's nominal rate by name (None: the policy's first link).
    pub fn update(
        &mut self,
        now: Instant,
        reports: Vec<(String, JobReport)>,
        link_bps: impl Fn(Option<&str>) -> Option<(String, Option<f64>)>,
    ) -> Reading {
        let mut out = Reading::default();
        let mut live = BTreeMap::new();
        for (file, r) in reports {
            let mut history = self.seen.remove(&file).unwrap_or_default();
            if let Some((t, last)) = history.back() {
                if let Some(why) = implausible(*t, last, now, &r) {
                    out.refused.push((format!("implausible: {why}"), file.clone()));
                    history.clear();
                } else {
                    *out.added.entry(r.job.clone()).or_default() += added(last, &r);
                }
            }
            history.push_back((now, r));
            // Keeps the newest report at least WINDOW old, so the window is always spanned.
            while history.len() > 2 && now.duration_since(history[1].0) >= WINDOW {
                history.pop_front();
            }
            live.insert(file, history);
        }
        // Files that are gone (their process ended) are forgotten.
        self.seen = live;
        out.jobs = self.summarize(link_bps);
        out
    }

    fn summarize(
        &self,
        link_bps: impl Fn(Option<&str>) -> Option<(String, Option<f64>)>,
    ) -> Vec<JobStatus> {
        let mut jobs: BTreeMap<&str, Vec<&VecDeque<(Instant, JobReport)>>> = BTreeMap::new();
        for h in self.seen.values() {
            if let Some((_, r)) = h.back() {
                jobs.entry(r.job.as_str()).or_default().push(h);
            }
        }
        jobs.into_iter()
            .map(|(job, mut procs)| {
                procs.sort_by_key(|h| h.back().map(|(_, r)| r.rank));
                let newest: Vec<&JobReport> =
                    procs.iter().filter_map(|h| h.back()).map(|(_, r)| r).collect();
                let first = newest[0];
                let (mut d, mut span) = (Added::default(), 0f64);
                for h in &procs {
                    let ((ta, a), (tb, b)) = (&h[0], &h[h.len() - 1]);
                    span = span.max(tb.duration_since(*ta).as_secs_f64());
                    d += added(a, b);
                }
                let n = procs.len() as f64;
                let per_step = |v: f64| (d.steps > 0).then(|| v / d.steps as f64);
                let achieved = (span > 0.0).then(|| d.wire_bytes as f64 * 8.0 / span);
                let link = link_bps(first.link.as_deref());
                JobStatus {
                    job: job.to_owned(),
                    kind: first.kind.clone(),
                    world: first.world,
                    ranks: newest.iter().map(|r| r.rank).collect(),
                    steps: newest.iter().map(|r| r.steps).max().unwrap_or(0),
                    steps_per_s: (span > 0.0).then(|| d.steps as f64 / n / span),
                    step_s: per_step(d.step_s),
                    compute_s: per_step(d.compute_s),
                    wait_s: per_step(d.wait_s),
                    comm_share: (d.step_s > 0.0).then(|| d.wait_s / d.step_s),
                    wire_bytes_per_step: per_step(d.wire_bytes as f64 * n),
                    achieved_bps: achieved,
                    link_share: achieved
                        .zip(link.as_ref().and_then(|(_, c)| *c))
                        .map(|(a, c)| a / c),
                    link_bps: link.as_ref().and_then(|(_, c)| *c),
                    link: link.map(|(l, _)| l),
                    codec: first.codec.clone(),
                    sync_every: first.sync_every,
                    loss: first.loss,
                    failed: newest.iter().map(|r| r.failed).fold(0, u64::saturating_add),
                }
            })
            .collect()
    }
}

/// The jobs' section of `linkpilot status`: where each job's step time goes.
pub fn render(jobs: &[JobStatus], refused: &[String]) -> String {
    if jobs.is_empty() && refused.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "\njobs (last {} s)\n  {:<16} {:<6} {:>6} {:>8} {:>8} {:>8} {:>8} {:>6} {:>10} {:>12} {:>6} {:<10}\n",
        WINDOW.as_secs(),
        "JOB",
        "KIND",
        "RANKS",
        "STEPS",
        "STEP/s",
        "STEP",
        "WAIT",
        "COMM",
        "WIRE/STEP",
        "ACHIEVED",
        "LINK%",
        "CODEC"
    );
    let f = |v: Option<f64>, scale: f64, digits: usize, unit: &str| {
        v.map_or("-".to_owned(), |v| format!("{:.*}{unit}", digits, v * scale))
    };
    for j in jobs {
        let codec = match j.sync_every {
            Some(h) => format!("{}, H={h}", j.codec),
            None => j.codec.clone(),
        };
        out += &format!(
            "  {:<16} {:<6} {:>6} {:>8} {:>8} {:>8} {:>8} {:>6} {:>10} {:>12} {:>6} {:<10}\n",
            j.job,
            j.kind,
            format!("{}/{}", j.ranks.len(), j.world),
            j.steps,
            f(j.steps_per_s, 1.0, 2, ""),
            f(j.step_s, 1.0, 3, "s"),
            f(j.wait_s, 1.0, 3, "s"),
            f(j.comm_share, 100.0, 0, "%"),
            j.wire_bytes_per_step.map_or("-".to_owned(), |b| bytes(b as u64)),
            f(j.achieved_bps, 1e-6, 1, "Mb/s"),
            f(j.link_share, 100.0, 1, "%"),
            codec
        );
        if j.failed > 0 || j.loss.is_some() {
            let loss = j.loss.map_or(String::new(), |l| format!("loss {l:.4}"));
            out += &format!("    {} failed collectives; {loss}\n", j.failed);
        }
    }
    for r in refused {
        out += &format!("  refused report {r}\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn report(rank: u32, steps: u64, wait_s: f64, compute_s: f64, wire: u64) -> JobReport {
        JobReport {
            version: 1,
            job: "lm".into(),
            rank,
            world: 4,
            kind: "ddp".into(),
            link: None,
            steps,
            step_s: compute_s + wait_s,
            compute_s,
            wait_s,
            wire_bytes: wire,
            failed: 0,
            codec: "int8".into(),
            sync_every: None,
            loss: Some(2.0 + f64::from(rank)),
            netns: None,
            netns_cookie: None,
        }
    }

    fn wan(_: Option<&str>) -> Option<(String, Option<f64>)> {
        Some(("wan".into(), Some(200e6)))
    }

    /// Two ranks, a step every 0.5 s (0.2 s of it waiting), 1 MB a step each: the window's
    /// figures, and the counters' increments equal to what the files added.
    #[test]
    fn two_ranks_make_one_job_with_the_windows_rates() {
        let t0 = Instant::now();
        let mut jobs = Jobs::default();
        let mut last = Reading::default();
        let mut added = Added::default();
        for s in 0..=30u64 {
            let now = t0 + Duration::from_secs(s);
            let files = (0..2)
                .map(|r| {
                    let steps = 2 * s;
                    let rep = report(r, steps, 0.2 * steps as f64, 0.3 * steps as f64, steps << 20);
                    (format!("{}-00000000000000a{r}", 100 + r), rep)
                })
                .collect();
            last = jobs.update(now, files, wan);
            if let Some(a) = last.added.get("lm") {
                added += a.clone();
            }
        }
        assert!(last.refused.is_empty());
        assert_eq!((added.steps, added.wire_bytes), (120, 120 << 20));
        let j = &last.jobs[0];
        assert_eq!((j.job.as_str(), j.ranks.clone(), j.steps, j.world), ("lm", vec![0, 1], 60, 4));
        let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 1e-9 * b.max(1.0);
        assert!(close(j.steps_per_s, 2.0), "{j:?}");
        assert!(close(j.step_s, 0.5) && close(j.wait_s, 0.2) && close(j.compute_s, 0.3));
        assert!(close(j.comm_share, 0.4));
        // Each step, both ranks send 1 MiB: 2 MiB on this host; 2 steps a second.
        assert!(close(j.wire_bytes_per_step, 2.0 * (1 << 20) as f64));
        assert!(close(j.achieved_bps, 4.0 * (1 << 20) as f64 * 8.0));
        assert!(close(j.link_share, 4.0 * (1 << 20) as f64 * 8.0 / 200e6));
        assert_eq!((j.link.as_deref(), j.loss), (Some("wan"), Some(2.0)));
    }

    /// A restarted rank (totals from zero) and a file claiming more step time than the wall
    /// clock allows: refused, and that process counts again from its new totals.
    #[test]
    fn impossible_changes_are_refused_and_start_over() {
        let t0 = Instant::now();
        let mut jobs = Jobs::default();
        let name = "7-0123456789abcdef".to_owned();
        let at = |s| t0 + Duration::from_secs(s);
        jobs.update(at(0), vec![(name.clone(), report(0, 100, 10.0, 20.0, 1000))], wan);
        let r = jobs.update(at(1), vec![(name.clone(), report(0, 3, 0.1, 0.2, 10))], wan);
        assert_eq!(r.refused, vec![("implausible: a total went down".to_owned(), name.clone())]);
        assert!(r.added.is_empty() && r.jobs[0].steps_per_s.is_none());
        let r = jobs.update(at(2), vec![(name.clone(), report(0, 5, 0.1, 500.2, 20))], wan);
        assert!(r.refused[0].0.contains("500.0 s of steps in 1.0 s"), "{:?}", r.refused);
        let r = jobs.update(at(3), vec![(name.clone(), report(0, 6, 0.2, 500.4, u64::MAX))], wan);
        assert!(r.refused[0].0.contains("bytes in 1.0 s"), "{:?}", r.refused);
        let r = jobs.update(at(4), vec![(name.clone(), report(0, 7, 0.3, 500.6, u64::MAX))], wan);
        assert!(r.refused.is_empty());
        assert_eq!((r.added["lm"].steps, r.added["lm"].wire_bytes), (1, 0));
        // Gone: forgotten.
        assert!(jobs.update(at(5), vec![], wan).jobs.is_empty());
    }

    #[test]
    fn the_status_table_says_where_the_step_goes() {
        let j = JobStatus {
            job: "lm".into(),
            kind: "outer".into(),
            world: 4,
            ranks: vec![0, 1],
            steps: 120,
            steps_per_s: Some(2.0),
            step_s: Some(0.5),
            wait_s: Some(0.2),
            comm_share: Some(0.4),
            wire_bytes_per_step: Some(2097152.0),
            achieved_bps: Some(33.5e6),
            link_share: Some(0.1675),
            codec: "int8".into(),
            sync_every: Some(16),
            loss: Some(2.5),
            ..JobStatus::default()
        };
        let text = render(&[j], &["9-0123456789abcdef: version 2".into()]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "jobs (last 10 s)");
        let row: Vec<&str> = lines[3].split_whitespace().collect();
        assert_eq!(
            row,
            ["lm", "outer", "2/4", "120", "2.00", "0.500s", "0.200s", "40%", "2MiB", "33.5Mb/s"]
                .into_iter()
                .chain(["16.8%", "int8,", "H=16"])
                .collect::<Vec<_>>()
        );
        assert_eq!(lines[4].trim(), "0 failed collectives; loss 2.5000");
        assert_eq!(lines[5].trim(), "refused report 9-0123456789abcdef: version 2");
        assert_eq!(render(&[], &[]), "");
    }
}
