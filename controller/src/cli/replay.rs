//! `linkpilot replay`: a recorded trace through a fresh core, printed as a timeline or JSON
//! lines, optionally plotted.

use anyhow::Context as _;

use crate::control::{replay, Policy};

/// What `linkpilot replay` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// The decisions as a timeline, then the judged codec predictions.
    Timeline,
    /// The same as JSON lines.
    Json,
    /// The plan after every snapshot, a JSON line each: what the daemon applies and its status
    /// API shows (`plan`).
    Plans,
}

/// `linkpilot replay`: a trace file through a fresh core, printed as a timeline, JSON lines or
/// plans, optionally plotted.
pub fn run_file(
    trace: &std::path::Path,
    policy: &std::path::Path,
    plot: Option<&std::path::Path>,
    output: Output,
) -> anyhow::Result<()> {
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
    if output == Output::Plans {
        for p in &r.plans {
            println!("{}", serde_json::to_string(p)?);
        }
        return plot_to(&r, &policy, plot);
    }
    let json = output == Output::Json;
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
    plot_to(&r, &policy, plot)
}

fn plot_to(
    r: &replay::Replay,
    policy: &Policy,
    plot: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    if let Some(path) = plot {
        super::plot::plot(r, policy, path)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
