//! Which state each host's daemon held in each phase of the day: its decision log (wall-clock
//! times) cut by the lab's phases. A policy that escalates on its own job's traffic shows here
//! as a worse state held through a calm phase.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::{
    runs::{Phase, Run},
    stats::Spread,
};

/// Before a daemon's first decision there is no state; its time is reported under this name.
const UNDECIDED: &str = "-";

/// Per state: seconds held in one phase, one value per run.
type PhaseStates = BTreeMap<String, Vec<f64>>;

/// One host's (unix seconds, state) of each decision, in time order. The benchmark's policies
/// have one link, so a host's decisions are one timeline.
fn timeline(decisions: &[Value]) -> Vec<(f64, &str)> {
    let mut d: Vec<(f64, &str)> = decisions
        .iter()
        .filter_map(|d| Some((d["unix_ms"].as_f64()? / 1e3, d["state"].as_str()?)))
        .collect();
    d.sort_by(|a, b| a.0.total_cmp(&b.0));
    d
}

/// Seconds of `p` spent in each state, from one host's [`timeline`].
fn seconds_in(d: &[(f64, &str)], p: &Phase) -> BTreeMap<String, f64> {
    let mut state = d.iter().rev().find(|(t, _)| *t <= p.start).map_or(UNDECIDED, |x| x.1);
    let mut since = p.start;
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    for &(t, next) in d.iter().filter(|(t, _)| *t > p.start && *t < p.end) {
        *out.entry(state.to_owned()).or_default() += t - since;
        (state, since) = (next, t);
    }
    *out.entry(state.to_owned()).or_default() += p.end - since;
    out
}

/// Per host, per phase (in the day's order), per state: seconds over `runs` (a run that never
/// held a state counts 0 s for it), as `{"host": [{"phase", "states": {"state": spread}}]}`.
pub fn summarize(runs: &[&Run]) -> Value {
    // host -> phases in the day's order
    let mut acc: BTreeMap<String, Vec<(String, PhaseStates)>> = BTreeMap::new();
    for (i, r) in runs.iter().enumerate() {
        for (host, decisions) in &r.decisions {
            let phases = acc.entry(host.clone()).or_default();
            let d = timeline(decisions);
            for p in r.phases() {
                let at = match phases.iter().position(|(n, _)| *n == p.name) {
                    Some(at) => at,
                    None => {
                        phases.push((p.name.clone(), BTreeMap::new()));
                        phases.len() - 1
                    }
                };
                let states = &mut phases[at].1;
                for (state, s) in seconds_in(&d, &p) {
                    let v = states.entry(state).or_default();
                    v.resize(i, 0.0);
                    v.push(s);
                }
            }
        }
    }
    let n = runs.len();
    let mut out = Map::new();
    for (host, phases) in acc {
        let mut per_phase = Vec::new();
        for (phase, states) in phases {
            let row: Map<String, Value> = states
                .into_iter()
                .map(|(state, mut v)| {
                    v.resize(n, 0.0);
                    (state, Spread::of(v).map_or(Value::Null, |s| s.json()))
                })
                .collect();
            per_phase.push(json!({ "phase": phase, "states": row }));
        }
        out.insert(host, Value::Array(per_phase));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(start: f64, end: f64) -> Phase {
        Phase { name: "calm".into(), start, end, bytes: (0, 0) }
    }

    #[test]
    fn a_phase_is_cut_at_each_decision_and_starts_in_the_state_held_before_it() {
        let d = vec![
            json!({"unix_ms": 105_000.0, "state": "healthy"}),
            json!({"unix_ms": 95_000.0, "state": "congested"}),
            json!({"unix_ms": 130_000.0, "state": "congested"}),
        ];
        let d = timeline(&d);
        let s = seconds_in(&d, &phase(100.0, 160.0));
        assert_eq!(s.get("congested"), Some(&(5.0 + 30.0)));
        assert_eq!(s.get("healthy"), Some(&25.0));
        let before = seconds_in(&d, &phase(90.0, 100.0));
        assert_eq!(before.get(UNDECIDED), Some(&5.0), "{before:?}");
        assert_eq!(before.get("congested"), Some(&5.0), "{before:?}");
    }
}
