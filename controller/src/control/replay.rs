//! Replays: a trace of snapshots (JSON lines, the format `watch --snapshots` prints and the
//! daemon records) through the core, giving the decision timeline and, optionally, a plot.

use std::io::BufRead;

use super::{
    codec::Check,
    decide::{Core, Decision},
    estimator::Signals,
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

/// `linkpilot replay`: a trace file through a fresh core, printed as a timeline or JSON lines,
/// optionally plotted.
pub fn run_file(
    trace: &std::path::Path,
    policy: &std::path::Path,
    plot: Option<&std::path::Path>,
    json: bool,
) -> anyhow::Result<()> {
    use crate::control::{replay, Policy};
    use anyhow::Context as _;
    let mut policy = Policy::load(policy)?;
    let file = std::fs::File::open(trace)
        .with_context(|| format!("opening the trace {}", trace.display()))?;
    let snaps = replay::read_trace(std::io::BufReader::new(file), &trace.display().to_string())?;
    // `@default-route` meant the recording host's WAN interface: the trace's only one.
    let default = crate::kernel::iface::DEFAULT_ROUTE;
    if policy.names_interface(default) {
        let mut links: Vec<&str> =
            snaps.iter().flat_map(|s| s.peers.iter().map(|p| p.link.as_str())).collect();
        links.sort_unstable();
        links.dedup();
        match links.as_slice() {
            [one] => policy.rename_interface(default, one),
            _ => anyhow::bail!(
                "the policy watches {default:?} and the trace has interfaces {links:?}: name \
                 the interface in the policy"
            ),
        }
    }
    let r = replay::run(&policy, &snaps);
    for d in &r.decisions {
        if json {
            println!("{}", serde_json::to_string(d)?);
        } else {
            println!("{}", replay::timeline_line(d));
        }
    }
    // The judged codec predictions follow the decisions (JSON lines: `{"codec_check": ...}`).
    for c in &r.codec_checks {
        if json {
            println!("{}", serde_json::json!({ "codec_check": c }));
        } else {
            let at = c.judged_at_ms.unwrap_or(c.at_ms) as f64 / 1e3;
            println!("{at:>10.3}s  codec {}", c.describe());
        }
    }
    if let Some(path) = plot {
        crate::control::plot::plot(&r, &policy, path)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
