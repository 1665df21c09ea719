//! Replays: a trace of snapshots (JSON lines, the format `watch --snapshots` prints and the
//! daemon records) through the core, giving the decision timeline, the plans and, optionally, a
//! plot.

use std::io::BufRead;

use super::{
    codec::Check,
    decide::{Core, Decision},
    estimator::Signals,
    plan::Plan,
    policy::Policy,
};
use crate::sense::sensors::Snapshot;

/// What a replay produced.
pub struct Replay {
    pub decisions: Vec<Decision>,
    /// (link, signals) after every snapshot.
    pub signals: Vec<(String, Signals)>,
    /// (at_ms, link, state index, knobs) after every snapshot, for plotting.
    pub timeline: Vec<(u64, String, usize, super::Knobs)>,
    /// `compression = "auto"`'s predictions as the jobs' measured wait judged them.
    pub codec_checks: Vec<Check>,
    /// The plan after every snapshot: what the daemon would have applied.
    pub plans: Vec<Plan>,
}

/// A trace line that is not a snapshot.
#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct TraceError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

/// Reads a JSON-lines trace; blank lines are skipped, anything else must be a snapshot, and
/// time must not go backwards.
pub fn read_trace(r: impl BufRead, file: &str) -> Result<Vec<Snapshot>, TraceError> {
    let mut out: Vec<Snapshot> = Vec::new();
    for (i, line) in r.lines().enumerate() {
        let err = |message: String| TraceError { file: file.to_owned(), line: i + 1, message };
        let line = line.map_err(|e| err(format!("reading: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        let snap: Snapshot =
            serde_json::from_str(&line).map_err(|e| err(format!("not a snapshot: {e}")))?;
        if let Some(prev) = out.last() {
            if snap.at_ms < prev.at_ms {
                return Err(err(format!(
                    "time goes backwards: at_ms {} after {}",
                    snap.at_ms, prev.at_ms
                )));
            }
        }
        out.push(snap);
    }
    Ok(out)
}

/// Runs `trace` through a fresh core for `policy`.
pub fn run(policy: &Policy, trace: &[Snapshot]) -> Replay {
    let mut core = Core::new(policy.clone());
    let mut replay = Replay {
        decisions: Vec::new(),
        signals: Vec::new(),
        timeline: Vec::new(),
        codec_checks: Vec::new(),
        plans: Vec::new(),
    };
    for snap in trace {
        let ds = core.step(snap);
        replay.decisions.extend(ds);
        replay.codec_checks.extend(core.take_codec_checks());
        for (link, state, knobs) in core.current() {
            let idx = policy.states.iter().position(|s| s.name == state).unwrap_or(0);
            replay.timeline.push((snap.at_ms, link.to_owned(), idx, knobs));
        }
        for (link, s) in core.signals() {
            replay.signals.push((link.to_owned(), s));
        }
        replay.plans.push(core.plan());
    }
    replay
}

/// One line of the human timeline.
pub fn timeline_line(d: &Decision) -> String {
    let changes =
        if d.changes.is_empty() { "initial knobs".to_owned() } else { d.changes.join(", ") };
    format!(
        "{:>10.3}s  #{:<4} {:<10} {:<10} {changes}\n{:>18}{}",
        d.at_ms as f64 / 1e3,
        d.id,
        d.link,
        d.state,
        "",
        d.reason
    )
}
