//! Tables of means over rounds (each rate against "none" of the same run) and the raw JSON.

use serde_json::{json, Value};

use super::{Ctx, Sample};

fn mean(xs: impl Iterator<Item = f64>) -> Option<f64> {
    let (n, s) = xs.fold((0usize, 0.0), |(n, s), x| (n + 1, s + x));
    (n > 0).then(|| s / n as f64)
}

fn fmt(x: f64) -> String {
    let x = x + 0.0; // no "-0.000"
    match x.abs() {
        a if a >= 1e4 => format!("{x:.0}"),
        a if a >= 10.0 => format!("{x:.1}"),
        _ => format!("{x:.3}"),
    }
}

/// Program figures of one configuration over its rounds: (events/s, ns per event) per name.
fn programs(of: &[&Sample]) -> Vec<(String, f64, f64)> {
    let mut names: Vec<&String> = of.iter().flat_map(|s| s.progs.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|n| {
            let ds: Vec<_> = of.iter().filter_map(|s| s.progs.get(n)).collect();
            let cnt: f64 = ds.iter().map(|d| d.net_cnt()).sum();
            let time: f64 = ds.iter().map(|d| d.net_time_ns()).sum();
            let secs: f64 = ds.iter().map(|d| d.seconds).sum();
            (n.clone(), cnt / secs.max(1e-9), if cnt > 0.0 { time / cnt } else { f64::NAN })
        })
        .collect()
}

/// Units per second of the primary metric, for costs per unit (bulk: per MB).
fn unit_rate(metric: &str, v: f64) -> (f64, &'static str) {
    match metric {
        "gbit_s" => (v * 1e9 / 8.0 / 1e6, "MB"),
        "txn_s" => (v, "txn"),
        "conn_s" => (v, "conn"),
        _ => (v, "unit"),
    }
}

pub fn print(samples: &[Sample]) {
    let mut tests: Vec<(&str, &str)> = samples.iter().map(|s| (s.part, s.test)).collect();
    tests.dedup();
    let mut seen = Vec::new();
    for (part, test) in tests {
        if seen.contains(&(part, test)) {
            continue;
        }
        seen.push((part, test));
        let of = |c: &str| -> Vec<&Sample> {
            samples.iter().filter(|s| s.part == part && s.test == test && s.config == c).collect()
        };
        let Some(first) = samples.iter().find(|s| s.part == part && s.test == test) else {
            continue;
        };
        let names: Vec<&str> = first.metrics.iter().map(|m| m.0).collect();
        let means = |c: &str| -> Vec<Option<f64>> {
            let ss = of(c);
            (0..names.len())
                .map(|i| mean(ss.iter().filter_map(|s| s.metrics.get(i).map(|m| m.1))))
                .collect()
        };
        // The configurations of this part, in the order they were measured.
        let mut configs: Vec<&str> = Vec::new();
        for s in samples.iter().filter(|s| s.part == part && s.test == test) {
            if !configs.contains(&s.config.as_str()) {
                configs.push(&s.config);
            }
        }
        let none = means("none").first().copied().flatten();
        println!("\n### {part} / {test}\n");
        println!("| config | rounds | {} | vs none |", names.join(" | "));
        println!("|---|--:|{}--:|", "--:|".repeat(names.len()));
        for &c in &configs {
            let m = means(c);
            let cells: Vec<String> = m.iter().map(|x| x.map_or("-".into(), fmt)).collect();
            let vs = match (m.first().copied().flatten(), none) {
                (Some(x), Some(n)) if n > 0.0 => {
                    format!("x{:.3} ({:+.1}%)", x / n, (x / n - 1.0) * 100.0)
                }
                _ => "-".into(),
            };
            println!("| {c} | {} | {} | {vs} |", of(c).len(), cells.join(" | "));
        }
        let with: Vec<&str> = configs.into_iter().filter(|&c| c != "none").collect();
        println!("\n| config | program | events/s | ns/event (bpf_stats) |\n|---|---|--:|--:|");
        for &c in &with {
            for (p, rate, ns) in programs(&of(c)) {
                println!("| {c} | {p} | {} | {} |", fmt(rate), fmt(ns));
            }
        }
        if part == "tracepoints" {
            let rows: Vec<_> = with.iter().map(|&c| (c, of(c))).collect();
            tracepoint_costs(&rows, names[0], none);
        }
    }
}

/// The tracepoints' total cost per event from the rate difference, against their own run time:
/// what is left is the tracepoint (perf-event) layer's cost.
fn tracepoint_costs(rows: &[(&str, Vec<&Sample>)], metric: &str, none: Option<f64>) {
    let Some(none) = none else { return };
    println!(
        "\n| config | added ns/unit | tracepoint events/unit | classifier ns/unit | total ns/event | own ns/event | layer ns/event |\n|---|--:|--:|--:|--:|--:|--:|"
    );
    for (name, ss) in rows {
        let Some(rate) = mean(ss.iter().filter_map(|s| s.metrics.first().map(|m| m.1))) else {
            continue;
        };
        let (r_with, unit) = unit_rate(metric, rate);
        let (r_none, _) = unit_rate(metric, none);
        let added = 1e9 / r_with - 1e9 / r_none;
        let progs = programs(ss);
        let tp: Vec<_> = progs.iter().filter(|p| !p.0.starts_with("lp_tc_")).collect();
        let tc: f64 = progs
            .iter()
            .filter(|p| p.0.starts_with("lp_tc_") && p.2.is_finite())
            .map(|p| p.1 * p.2)
            .sum::<f64>()
            / r_with;
        let events: f64 = tp.iter().map(|p| p.1).sum::<f64>() / r_with;
        let own_ns: f64 = tp.iter().filter(|p| p.2.is_finite()).map(|p| p.1 * p.2).sum::<f64>()
            / tp.iter().map(|p| p.1).sum::<f64>().max(1e-9);
        let total = (added - tc) / events.max(1e-9);
        println!(
            "| {name} | {} per {unit} | {} | {} | {} | {} | {} |",
            fmt(added),
            fmt(events),
            fmt(tc),
            fmt(total),
            fmt(own_ns),
            fmt(total - own_ns)
        );
    }
}

pub fn json(ctx: &Ctx, samples: &[Sample]) -> Value {
    json!({
        "rounds": ctx.rounds,
        "seconds": ctx.secs,
        "configs": ctx.configs.iter().map(|c| json!({
            "name": c.name, "bin": c.bin.as_ref().map(|b| b.display().to_string()),
        })).collect::<Vec<_>>(),
        "samples": samples.iter().map(|s| json!({
            "part": s.part, "test": s.test, "config": s.config, "round": s.round,
            "metrics": s.metrics.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "programs": s.progs.iter().map(|(k, d)| (k.clone(), d.json())).collect::<serde_json::Map<_, _>>(),
        })).collect::<Vec<_>>(),
    })
}
