//! A state's thresholds read against the signals: whether they hold, and the words a decision
//! gives for them. Apart from the walk of the ladder, which only asks these questions.

use crate::control::{
    estimator::Signals,
    policy::{higher_is_worse, Thresholds},
};

/// The signal's value, or `None` when it is not measured (no RTT yet; goodput of an idle link).
fn value(signal: &str, s: &Signals) -> Option<f64> {
    match signal {
        "rtt_inflation" => s.rtt_ms.map(|_| s.rtt_inflation),
        "cross_rtt_inflation" => s.cross_rtt_ms.map(|_| s.cross_rtt_inflation),
        "rtt_p99" => s.rtt_p99_ms,
        "jitter" => s.rtt_p99_ms.map(|_| s.jitter_ms),
        "cross_jitter" => s.cross_jitter_ms,
        "ce_fraction" => Some(s.ce_fraction),
        "cross_ce_fraction" => Some(s.cross_ce_fraction),
        "retrans" => Some(s.retrans),
        "cnp_rate" => Some(s.cnp_per_s),
        "goodput_below" => s.active.then_some(s.goodput_fraction),
        "unanswered" => Some(s.unanswered_ms),
        _ => None,
    }
}

fn show(signal: &str, v: f64) -> String {
    match signal {
        "rtt_p99" | "jitter" | "cross_jitter" | "unanswered" => format!("{v:.1}ms"),
        "cnp_rate" => format!("{v:.0}/s"),
        _ => format!("{:.2}%", v * 100.0),
    }
}

/// Whether any condition of `t` holds.
pub(super) fn any_entered(t: &Thresholds, s: &Signals) -> bool {
    t.values().any(|(sig, thr)| {
        value(sig, s).is_some_and(|v| if higher_is_worse(sig) { v >= thr } else { v < thr })
    })
}

/// Whether every condition of `t` is back on the healthy side (unmeasured counts as healthy).
pub(super) fn all_exited(t: &Thresholds, s: &Signals) -> bool {
    t.values().all(|(sig, thr)| {
        value(sig, s).is_none_or(|v| if higher_is_worse(sig) { v < thr } else { v >= thr })
    })
}

/// The conditions of `t` that hold ("ce_fraction 3.10% >= 1%").
pub(super) fn entered(t: &Thresholds, s: &Signals) -> Vec<String> {
    t.conditions()
        .into_iter()
        .filter_map(|(sig, thr, written)| {
            let v = value(sig, s)?;
            let worse = if higher_is_worse(sig) { v >= thr } else { v < thr };
            let op = if higher_is_worse(sig) { ">=" } else { "<" };
            worse.then(|| format!("{sig} {} {op} {written}", show(sig, v)))
        })
        .collect()
}

/// Whether every exit condition of `t` holds: each signal is back on the healthy side of its
/// threshold (an unmeasured signal is not holding the state).
pub(super) fn exited(t: &Thresholds, s: &Signals) -> Option<Vec<String>> {
    t.conditions()
        .into_iter()
        .map(|(sig, thr, written)| match value(sig, s) {
            None => Some(format!("{sig} unmeasured")),
            Some(v) => {
                let healthy = if higher_is_worse(sig) { v < thr } else { v >= thr };
                let op = if higher_is_worse(sig) { "<" } else { ">=" };
                healthy.then(|| format!("{sig} {} {op} {written}", show(sig, v)))
            }
        })
        .collect()
}
