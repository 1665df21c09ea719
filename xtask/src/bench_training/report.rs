//! Per configuration and per scenario phase: steps/s, step time p50/p99, WAN bytes per step (the
//! lab's counters), time to the target loss, final loss, failed collectives, decisions; the
//! oracle (per phase, the best fixed configuration); the markdown table.

use anyhow::bail;
use serde_json::{json, Value};

use super::{RunResult, WARMUP_PHASE};

/// A phase as the lab's timeline shows it: [start, end) in unix seconds, WAN bytes at each end.
struct Phase {
    name: String,
    start: f64,
    end: f64,
    bytes: (u64, u64),
}

fn wan_bytes(lines: &[&Value]) -> u64 {
    lines.iter().map(|v| v["stats"]["bytes_in"].as_u64().unwrap_or(0)).sum()
}

/// Phases from the lab's per-second lines (both directions per second), up to the end of the
/// scenario's pass.
fn phases(timeline: &[Value], pass_s: f64) -> Vec<Phase> {
    let mut seconds: Vec<(f64, String, u64)> = Vec::new();
    let within =
        timeline.iter().take_while(|v| v["elapsed_s"].as_f64().is_some_and(|e| e <= pass_s + 1.0));
    let within: Vec<Value> = within.cloned().collect();
    for pair in within.chunks(2) {
        let refs: Vec<&Value> = pair.iter().collect();
        let t = pair[0]["unix_ms"].as_f64().unwrap_or(0.0) / 1e3;
        let phase = pair[0]["phase"].as_str().unwrap_or("?").to_owned();
        seconds.push((t, phase, wan_bytes(&refs)));
    }
    let mut out: Vec<Phase> = Vec::new();
    for (t, name, bytes) in seconds {
        match out.last_mut() {
            Some(p) if p.name == name => {
                p.end = t;
                p.bytes.1 = bytes;
            }
            _ => {
                if let Some(p) = out.last_mut() {
                    p.end = t;
                    p.bytes.1 = bytes;
                }
                out.push(Phase { name, start: t, end: t, bytes: (bytes, bytes) });
            }
        }
    }
    out
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn t(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(f64::NAN)
}

/// Seconds from the first step's start to the first evaluation at or below `target`.
fn time_to(steps: &[Value], target: f64) -> Option<f64> {
    let first = t(steps.first()?, "t_start");
    steps
        .iter()
        .find(|s| s["eval_loss"].as_f64().is_some_and(|l| l <= target))
        .map(|s| t(s, "t_end") - first)
}

/// Steps taken until the first evaluation at or below `target` (that step included).
fn steps_to(steps: &[Value], target: f64) -> Option<usize> {
    steps.iter().position(|s| s["eval_loss"].as_f64().is_some_and(|l| l <= target)).map(|i| i + 1)
}

fn per_phase(r: &RunResult) -> Vec<Value> {
    phases(&r.timeline, r.pass_s)
        .iter()
        .filter(|p| p.name != WARMUP_PHASE && p.end > p.start)
        .map(|p| {
            let inside: Vec<&Value> = r
                .steps
                .iter()
                .filter(|s| (p.start..p.end).contains(&t(s, "t_end")))
                .collect();
            let mut times: Vec<f64> =
                inside.iter().map(|s| t(s, "t_end") - t(s, "t_start")).collect();
            times.sort_by(f64::total_cmp);
            let n = inside.len();
            let mut codecs: Vec<&str> = inside.iter().filter_map(|s| s["codec"].as_str()).collect();
            codecs.dedup();
            json!({
                "phase": p.name,
                "seconds": p.end - p.start,
                "steps": n,
                "steps_per_s": n as f64 / (p.end - p.start),
                "step_p50_s": percentile(&times, 0.5),
                "step_p99_s": percentile(&times, 0.99),
                "wan_bytes_per_step": if n > 0 { (p.bytes.1 - p.bytes.0) as f64 / n as f64 } else { f64::NAN },
                "codecs": codecs,
            })
        })
        .collect()
}

pub fn summarize(results: &[RunResult]) -> Value {
    // The last evaluation within the pass (the ranks stop at a sync point after it).
    let final_loss = |r: &RunResult| r.steps.iter().rev().find_map(|s| s["eval_loss"].as_f64());
    let untuned = results.iter().find(|r| r.config.name == "untuned");
    // The target: where the untuned run ended up.
    let target = untuned.and_then(final_loss);
    let time_to_target = |r: &RunResult| target.and_then(|l| time_to(&r.steps, l * (1.0 + 1e-9)));
    let base = untuned.and_then(time_to_target);
    let static_run = results.iter().find(|r| r.config.name == "static");
    let stat = static_run.and_then(time_to_target);
    // A second target over the whole day: where the hand-tuned run ended up. The first one is
    // often reached in the first calm phase, before the link changes at all.
    let day_target = static_run.and_then(final_loss);
    let time_to_day_target =
        |r: &RunResult| day_target.and_then(|l| time_to(&r.steps, l * (1.0 + 1e-9)));
    let stat_day = static_run.and_then(time_to_day_target);
    let configs: Vec<Value> = results
        .iter()
        .map(|r| {
            let ttt = time_to_target(r);
            let day = time_to_day_target(r);
            json!({
                "name": r.config.name,
                "setup": r.config.describe(),
                "steps": r.steps.len(),
                "final_eval_loss": final_loss(r),
                "loss_gap_pct": final_loss(r).zip(target).map(|(l, u)| (l - u) / u * 100.0),
                "time_to_target_s": ttt,
                "speedup_vs_untuned": ttt.zip(base).map(|(a, b)| b / a),
                "speedup_vs_static": ttt.zip(stat).map(|(a, b)| b / a),
                "steps_to_target": target.and_then(|l| steps_to(&r.steps, l * (1.0 + 1e-9))),
                "time_to_day_target_s": day,
                "day_speedup_vs_static": day.zip(stat_day).map(|(a, b)| b / a),
                "failed_collectives": r.failed,
                "decisions": r.decisions,
                "phases": per_phase(r),
            })
        })
        .collect();
    json!({
        "target_eval_loss": target,
        "day_target_eval_loss": day_target,
        "configs": configs,
        "oracle": oracle(results, &configs),
    })
}

/// Per phase, the fixed configuration that makes the most progress per second: its steps/s
/// weighed by how many steps it needs to reach the target against the fewest any fixed
/// configuration needed (a codec whose steps are fast but learn less is not a ceiling).
fn oracle(results: &[RunResult], configs: &[Value]) -> Vec<Value> {
    let candidates: Vec<&Value> = results
        .iter()
        .zip(configs)
        .filter(|(r, _)| r.config.oracle_candidate)
        .map(|(_, c)| c)
        .collect();
    let fewest =
        candidates.iter().filter_map(|c| c["steps_to_target"].as_f64()).fold(f64::NAN, f64::min);
    let quality = |c: &Value| c["steps_to_target"].as_f64().map_or(0.0, |n| fewest / n);
    let mut out = Vec::new();
    let Some(first) = candidates.first() else { return out };
    for (i, p) in first["phases"].as_array().into_iter().flatten().enumerate() {
        let rate = |c: &Value| c["phases"][i]["steps_per_s"].as_f64().unwrap_or(0.0);
        let progress = |c: &Value| rate(c) * quality(c);
        let best = candidates.iter().max_by(|a, b| progress(a).total_cmp(&progress(b)));
        // A phase in which no configuration took a step (an outage) has no best one.
        if let Some(best) = best.filter(|b| progress(b) > 0.0) {
            out.push(json!({
                "phase": p["phase"],
                "config": best["name"],
                "steps_per_s": rate(best),
                "quality": quality(best),
                "progress_per_s": progress(best),
            }));
        }
    }
    out
}

fn num(v: &Value, digits: usize) -> String {
    v.as_f64().filter(|x| x.is_finite()).map_or("-".into(), |x| format!("{x:.digits$}"))
}

pub fn markdown(s: &Value) -> String {
    let configs = s["configs"].as_array().cloned().unwrap_or_default();
    let mut out = format!(
        "Target: the untuned run's final eval loss, {}. Day target: the static run's, {}.\n\n\
         | configuration | steps | steps to target | time to target (s) | vs untuned | vs static | time to day target (s) | vs static | final eval loss | gap to untuned | failed collectives | decisions |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        num(&s["target_eval_loss"], 4),
        num(&s["day_target_eval_loss"], 4)
    );
    for c in &configs {
        out += &format!(
            "| {} | {} | {} | {} | {}x | {}x | {} | {}x | {} | {}% | {} | {} |\n",
            c["name"].as_str().unwrap_or("?"),
            c["steps"],
            num(&c["steps_to_target"], 0),
            num(&c["time_to_target_s"], 1),
            num(&c["speedup_vs_untuned"], 2),
            num(&c["speedup_vs_static"], 2),
            num(&c["time_to_day_target_s"], 1),
            num(&c["day_speedup_vs_static"], 2),
            num(&c["final_eval_loss"], 4),
            num(&c["loss_gap_pct"], 2),
            c["failed_collectives"].as_array().map_or(0, Vec::len),
            c["decisions"],
        );
    }
    out += "\nPer phase: steps/s, step time p50/p99 (s), WAN bytes per step (MB), codecs used.\n\n\
            | configuration | phase | steps/s | p50 | p99 | MB/step | codecs |\n\
            |---|---|---:|---:|---:|---:|---|\n";
    for c in &configs {
        for p in c["phases"].as_array().into_iter().flatten() {
            out += &format!(
                "| {} | {} | {} | {} | {} | {} | {} |\n",
                c["name"].as_str().unwrap_or("?"),
                p["phase"].as_str().unwrap_or("?"),
                num(&p["steps_per_s"], 3),
                num(&p["step_p50_s"], 2),
                num(&p["step_p99_s"], 2),
                p["wan_bytes_per_step"].as_f64().map_or("-".into(), |b| format!("{:.2}", b / 1e6)),
                p["codecs"].as_array().map_or(String::new(), |a| {
                    a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" ")
                }),
            );
        }
    }
    if let Some(oracle) = s["oracle"].as_array().filter(|o| !o.is_empty()) {
        out += "\nOracle (per phase, the fixed configuration with the most progress per second: \
                steps/s x fewest steps to target / its steps to target):\n\n\
                | phase | configuration | steps/s | quality | progress/s |\n|---|---|---:|---:|---:|\n";
        for o in oracle {
            out += &format!(
                "| {} | {} | {} | {} | {} |\n",
                o["phase"].as_str().unwrap_or("?"),
                o["config"].as_str().unwrap_or("?"),
                num(&o["steps_per_s"], 3),
                num(&o["quality"], 2),
                num(&o["progress_per_s"], 3)
            );
        }
    }
    out
}

/// CI's check of the quick form: adaptive faster than untuned in the congested phase, and its
/// loss no worse than untuned's (it trained at least as long).
pub fn check_quick(s: &Value) -> anyhow::Result<()> {
    let find = |name: &str| {
        s["configs"].as_array().and_then(|c| c.iter().find(|c| c["name"] == name)).cloned()
    };
    let (Some(u), Some(a)) = (find("untuned"), find("adaptive")) else {
        bail!("the quick benchmark needs the untuned and adaptive configurations");
    };
    let rate = |c: &Value| {
        c["phases"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["phase"] == "congested"))
            .and_then(|p| p["steps_per_s"].as_f64())
            .unwrap_or(0.0)
    };
    let (ru, ra) = (rate(&u), rate(&a));
    if ra <= ru {
        bail!("adaptive is not faster than untuned in the congested phase: {ra:.3} vs {ru:.3} steps/s");
    }
    let (lu, la) = (u["final_eval_loss"].as_f64(), a["final_eval_loss"].as_f64());
    match (lu, la) {
        (Some(lu), Some(la)) if la.is_finite() && la <= lu * 1.01 => {}
        _ => bail!("adaptive's loss diverged: final eval loss {la:?} vs untuned {lu:?}"),
    }
    if !a["failed_collectives"].as_array().is_some_and(Vec::is_empty) {
        bail!("adaptive had failed collectives: {}", a["failed_collectives"]);
    }
    println!(
        "bench-training --quick: adaptive {ra:.3} vs untuned {ru:.3} steps/s in the congested phase; \
         final eval loss {la:?} vs {lu:?}"
    );
    Ok(())
}
