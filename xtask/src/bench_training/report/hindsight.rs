//! Judgements made in hindsight over the configurations' summaries: the fixed configuration
//! best on the day, and per phase the fixed configuration that made the most progress (the
//! oracle). Separate because they read the finished per configuration JSON, not the runs.

use serde_json::{json, Value};

use super::{is_fixed, spread_json, Spread, Target, CEILING};

/// The fixed configuration best in hindsight on this day: the one that reached the highest
/// rung of the ladder soonest (every run of it reaching it), else the lowest loss at the day's
/// end.
pub(super) fn best_fixed(configs: &[Value], targets: &[Target]) -> Value {
    let fixed: Vec<&Value> =
        configs.iter().filter(|c| c["name"].as_str().is_some_and(is_fixed)).collect();
    for t in targets.iter().rev().filter(|t| t.source == CEILING) {
        let time = |c: &Value| {
            let r = &c["targets"][&t.key];
            Spread::from_json(&r["time_s"]).filter(|_| r["reached"] == c["runs"]).map(|s| s.median)
        };
        let best = fixed
            .iter()
            .filter_map(|c| Some((time(c)?, c["name"].as_str()?)))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((time_s, name)) = best {
            return json!({ "name": name, "by": format!("time to {}", t.key), "median": time_s });
        }
    }
    let loss = |c: &Value| Spread::from_json(&c["final_eval_loss"]).map(|s| s.median);
    fixed
        .iter()
        .filter_map(|c| Some((loss(c)?, c["name"].as_str()?)))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map_or(
            Value::Null,
            |(l, name)| json!({ "name": name, "by": "loss at the day's end", "median": l }),
        )
}

/// Per phase, the fixed configuration that makes the most progress per second: the median of
/// its steps/s weighed by how many steps it needs to the static target against the fewest any
/// fixed configuration needed (a codec whose steps are fast but learn less is not a ceiling).
/// Candidates that never reach the target are not judged; a phase without progress has none.
pub(super) fn oracle(configs: &[Value]) -> Vec<Value> {
    let candidates: Vec<&Value> =
        configs.iter().filter(|c| c["oracle_candidate"].as_bool() == Some(true)).collect();
    let steps = |c: &Value| {
        Spread::from_json(&c["targets"]["static"]["steps"])
            .filter(|_| c["targets"]["static"]["reached"] == c["runs"])
            .map(|s| s.median)
    };
    let fewest = candidates.iter().filter_map(|c| steps(c)).fold(f64::INFINITY, f64::min);
    let mut out = Vec::new();
    let Some(first) = candidates.first() else { return out };
    for p in first["phases"].as_array().into_iter().flatten() {
        let phase = &p["phase"];
        let rate = |c: &Value| {
            c["phases"]
                .as_array()
                .and_then(|ps| ps.iter().find(|q| &q["phase"] == phase))
                .and_then(|q| Spread::from_json(&q["steps_per_s"]))
        };
        let best = candidates
            .iter()
            .filter_map(|c| {
                let quality = fewest / steps(c)?;
                Some((c, rate(c)?.scaled(quality), quality))
            })
            .filter(|(_, progress, _)| progress.median > 0.0)
            .max_by(|a, b| a.1.median.total_cmp(&b.1.median));
        if let Some((c, progress, quality)) = best {
            out.push(json!({
                "phase": phase,
                "config": c["name"],
                "steps_per_s": spread_json(rate(c)),
                "quality": quality,
                "progress_per_s": progress.json(),
            }));
        }
    }
    out
}
