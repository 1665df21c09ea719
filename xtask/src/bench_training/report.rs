//! One scenario's runs summarized over their repeats: targets late in the day, time and steps to
//! them, speedups with their spread and verdict, compute utilization against the co-located
//! ceiling, quality at the day's budget, per phase rates and codecs, the per-phase oracle, the
//! transport in force. Every figure is a median with its range.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::{
    config::{self, Placement},
    runs::Run,
    stats::{slope_at, Speedup, Spread},
};
use hindsight::{best_fixed, oracle};
use noise::{eval_noise, time_resolution};
use phases::phase_rates;
use transport::transport_of;

mod hindsight;
mod noise;
mod phases;
#[cfg(test)]
mod tests;
mod transport;

/// Where a baseline's target loss is read: this share of its day, so the configurations
/// compared reach it late, not in the first calm phase.
pub const TARGET_AT: f64 = 0.75;
/// The baselines a target is taken from, in the order reported.
const BASELINES: &[&str] = &["untuned", "static"];
pub const CEILING: &str = "colocated";
/// The ladder of targets: the co-located ceiling's loss at these shares of its day, so that
/// early, middle and late progress are each judged (a single late target of a slow baseline
/// falls inside the first calm phase of a fast configuration's day).
pub const LADDER: &[f64] = &[0.25, 0.5, 0.75];
/// What a rung's speedup is taken against: the strongest fixed configuration an expert
/// deploys without us.
pub const STRONGEST_FIXED: &str = "static-bbr";
/// Every H steps, the fixed configuration chosen in advance: H 100 was best on ref-day (the H
/// sweep in BENCHMARKS.md), and runs unchanged on the other reference days. Where it ran, the
/// rungs' speedups are taken against it, and co-located's own speedup is the headroom: what
/// any configuration could gain without outrunning the ceiling's steps.
pub const CHOSEN_IN_ADVANCE: &str = "outer-expert-h100";
/// Configurations that set everything once: "the best fixed configuration in hindsight" of a
/// day is one of these.
fn is_fixed(name: &str) -> bool {
    matches!(name, "untuned" | "static" | "static-bbr" | "outer-static" | "outer-expert")
        || name.starts_with("fixed-")
        || name.starts_with("outer-expert-h")
}

/// A target loss: where it was read (`source` at `at` of its day) and what its speedups are
/// taken against.
struct Target {
    key: String,
    source: String,
    at: f64,
    loss: f64,
    against: String,
}

/// The baselines' late targets, then the ladder's rungs where the ceiling ran.
fn targets_of(runs: &[Run]) -> Vec<Target> {
    let mut out: Vec<Target> = BASELINES
        .iter()
        .filter_map(|b| {
            let loss = target(runs, b, TARGET_AT)?;
            Some(Target {
                key: (*b).into(),
                source: (*b).into(),
                at: TARGET_AT,
                loss,
                against: (*b).into(),
            })
        })
        .collect();
    let against = if runs.iter().any(|r| r.config == CHOSEN_IN_ADVANCE) {
        CHOSEN_IN_ADVANCE
    } else {
        STRONGEST_FIXED
    };
    for at in LADDER {
        if let Some(loss) = target(runs, CEILING, *at) {
            out.push(Target {
                key: format!("rung-{:.0}", at * 100.0),
                source: CEILING.into(),
                at: *at,
                loss,
                against: against.into(),
            });
        }
    }
    out
}

/// A configuration's ceiling: the co-located run with as many ranks per site (they share this
/// machine's cores alike), where one was run; else [`CEILING`].
fn ceiling_of(all: &[config::Config], runs: &[Run], name: &str) -> String {
    let per_site = all.iter().find(|c| c.name == name).map_or(1, |c| c.per_site);
    all.iter()
        .find(|c| c.placement == Placement::Colocated && c.per_site == per_site)
        .map(|c| c.name.clone())
        .filter(|n| runs.iter().any(|r| &r.config == n))
        .unwrap_or_else(|| CEILING.to_owned())
}
/// Step counts at which loss per step is compared.
const AT_STEPS: &[f64] = &[100.0, 200.0, 300.0];

fn runs_of<'a>(runs: &'a [Run], name: &str) -> Vec<&'a Run> {
    runs.iter().filter(|r| r.config == name).collect()
}

fn spread_json(s: Option<Spread>) -> Value {
    s.map_or(Value::Null, |s| s.json())
}

/// A target: the median over a baseline's runs of the loss it had reached at `at` of its day.
fn target(runs: &[Run], baseline: &str, at: f64) -> Option<f64> {
    Spread::of(runs_of(runs, baseline).iter().filter_map(|r| r.loss_at_fraction(at)))
        .map(|s| s.median)
}

/// Times to `loss` over a configuration's runs, and how many of them reached it in the day.
fn times_to(runs: &[&Run], loss: f64) -> (Option<Spread>, usize) {
    let times: Vec<f64> = runs.iter().filter_map(|r| r.time_to(loss)).collect();
    let n = times.len();
    (Spread::of(times), n)
}

/// `failures`: the runs that did not finish (`{"config", "repeat", "error"}`), reported with
/// their configuration.
pub fn summarize(scenario: &str, runs: &[Run], failures: &[Value]) -> Value {
    let names = config_order(runs);
    let targets = targets_of(runs);
    let all = config::all();
    let mut configs = Vec::new();
    for name in &names {
        let mine = runs_of(runs, name);
        let ceiling_name = ceiling_of(&all, runs, name);
        let ceiling_rate = phase_rates(&runs_of(runs, &ceiling_name));
        let mut per_target = Map::new();
        for t in &targets {
            let (b, loss) = (&t.against, &t.loss);
            let (time, reached) = times_to(&mine, *loss);
            let steps = Spread::of(mine.iter().filter_map(|r| r.steps_to(*loss)));
            let whole = |name: &str| {
                let of = runs_of(runs, name);
                let (t, n) = times_to(&of, *loss);
                t.filter(|_| n == of.len())
            };
            let (base, ceiling) = (whole(b), whole(&ceiling_name));
            // All repeats must reach a target for a speedup: a run that never got there took
            // longer than the day, which no ratio can state.
            let complete = reached == mine.len();
            per_target.insert(
                t.key.clone(),
                json!({
                    "time_s": spread_json(time),
                    "reached": reached,
                    "steps": spread_json(steps),
                    "speedup": match (base, time) {
                        (Some(base), Some(time)) if complete => Speedup::of(base, time).json(),
                        _ => Value::Null,
                    },
                    "utilization": match (ceiling, time) {
                        (Some(c), Some(time)) if complete => {
                            let u = Speedup::of(c, time);
                            json!({ "median": u.median, "min": u.min, "max": u.max })
                        }
                        _ => Value::Null,
                    },
                }),
            );
        }
        let mut decisions: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for r in &mine {
            for (host, d) in &r.decisions {
                decisions.entry(host.clone()).or_default().push(d.len() as f64);
            }
        }
        let rates = phase_rates(&mine);
        let phases: Vec<Value> = rates
            .iter()
            .map(|(phase, p)| {
                let share = ceiling_rate
                    .iter()
                    .find(|(n, _)| n == phase)
                    .and_then(|(_, c)| Some(p.rate?.median / c.rate?.median));
                json!({
                    "phase": phase,
                    "steps_per_s": spread_json(p.rate),
                    "share_of_colocated": share,
                    "step_p50_s": p.p50.map(|s| s.median),
                    "step_p99_s": p.p99.map(|s| s.median),
                    "wan_bytes_per_step": p.bytes.map(|s| s.median),
                    "codecs": p.codecs,
                })
            })
            .collect();
        let loss_at_steps: Map<String, Value> = AT_STEPS
            .iter()
            .filter_map(|n| {
                let s = Spread::of(mine.iter().filter_map(|r| r.loss_at_steps(*n)))?;
                (s.n == mine.len()).then(|| (format!("{n}"), s.json()))
            })
            .collect();
        let known = config::all().into_iter().find(|c| &c.name == name);
        configs.push(json!({
            "name": name,
            // As run: the list's own description does not know a calibrated batch.
            "setup": mine.iter().find_map(|r| r.setup.clone()).or_else(|| known.as_ref().map(|c| c.describe())),
            "oracle_candidate": known.as_ref().is_some_and(|c| c.oracle_candidate),
            "runs": mine.len(),
            "ceiling": ceiling_name,
            "failed_runs": failures.iter().filter(|f| f["config"] == name.as_str()).cloned().collect::<Vec<_>>(),
            "steps": spread_json(Spread::of(mine.iter().map(|r| r.steps().count() as f64))),
            "final_eval_loss": spread_json(Spread::of(mine.iter().filter_map(|r| r.final_loss()))),
            "targets": per_target,
            "loss_at_steps": loss_at_steps,
            "failed_collectives": mine.iter().flat_map(|r| r.failed.clone()).collect::<Vec<_>>(),
            "codec_disagreements": mine.iter().map(|r| r.codec_disagreements().len()).sum::<usize>(),
            "decisions": decisions
                .into_iter()
                .map(|(h, v)| (h, spread_json(Spread::of(v))))
                .collect::<Map<String, Value>>(),
            "phases": phases,
            "states": super::states::summarize(&mine),
            "transport": transport_of(&mine),
        }));
    }
    json!({
        "scenario": scenario,
        "policies_tuned_on_it": config::TUNED_ON.contains(&scenario),
        "host_cc": runs.first().map(|r| r.cc.clone()),
        "repeats": names.iter().map(|n| runs_of(runs, n).len()).max().unwrap_or(0),
        "targets": targets
            .iter()
            .map(|t| {
                let v = json!({
                    "eval_loss": t.loss,
                    "of": t.source,
                    "at_share_of_day": t.at,
                    "speedup_against": t.against,
                });
                (t.key.clone(), v)
            })
            .collect::<Map<String, Value>>(),
        "eval_noise": eval_noise(runs),
        "time_resolution_s": time_resolution(
            runs,
            targets.iter().find(|t| t.key == "static").map(|t| t.loss),
        ),
        "best_fixed": best_fixed(&configs, &targets),
        "configs": configs,
        "oracle": oracle(&configs),
    })
}

/// Configurations in the benchmark's order, then any other that left runs.
fn config_order(runs: &[Run]) -> Vec<String> {
    let mut names: Vec<String> = config::all()
        .into_iter()
        .map(|c| c.name)
        .filter(|n| runs.iter().any(|r| &r.config == n))
        .collect();
    for r in runs {
        if !names.contains(&r.config) {
            names.push(r.config.clone());
        }
    }
    names
}
