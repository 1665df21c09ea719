//! The evaluations' own noise: the loss's stdev over disjoint window sets and the curve's
//! jitter, and what they mean in seconds at the static target. Separate because it judges the
//! measurement, not a configuration.

use serde_json::{json, Value};

use super::{runs_of, slope_at, spread_json, Run, Spread};

/// The eval's own noise: per run, the stdev of the last checkpoint's loss over disjoint window
/// sets.
pub(super) fn eval_noise(runs: &[Run]) -> Value {
    let windows = runs.iter().find_map(|r| r.eval_noise.as_ref()?["windows"].as_u64());
    json!({
        "stdev": spread_json(Spread::of(runs.iter().filter_map(Run::eval_noise_stdev))),
        "curve_jitter": spread_json(Spread::of(runs.iter().filter_map(Run::curve_jitter))),
        "windows": windows,
        "sets": runs.iter().find_map(|r| r.eval_noise.as_ref()?["sets"].as_u64()),
    })
}

/// What the eval's noise means in time at the static target: noise / |slope| of each static
/// run's curve there, for the window-sampling noise and for the curve's own jitter. A time
/// difference below these is not resolved by the evaluations.
pub(super) fn time_resolution(runs: &[Run], target: Option<f64>) -> Value {
    let Some(target) = target else { return Value::Null };
    let per_run = |noise: fn(&Run) -> Option<f64>| {
        let v = runs_of(runs, "static").into_iter().filter_map(move |r| {
            let t = r.time_to(target)?;
            let slope = slope_at(&r.curve_by_time(), t)?;
            (slope < 0.0).then(|| noise(r).map(|n| n / -slope)).flatten()
        });
        spread_json(Spread::of(v))
    };
    json!({
        "window_sampling": per_run(Run::eval_noise_stdev),
        "curve_jitter": per_run(Run::curve_jitter),
    })
}
