//! The summary's figures on synthetic runs whose loss falls linearly: targets, speedups,
//! utilization, the ladder, ceilings and the oracle. Apart from the code for its length.

use std::collections::BTreeMap;

use serde_json::json;

use super::*;

#[test]
fn the_h_sweeps_configurations_are_fixed_ones() {
    for name in ["static-bbr", "outer-expert", "outer-expert-h16", "outer-expert-h100"] {
        assert!(is_fixed(name), "{name}");
    }
    for name in ["adaptive", "adaptive-outer", "oracle", "co-located"] {
        assert!(!is_fixed(name), "{name}");
    }
}

/// The summary of configuration `name` in `summary`.
fn config<'a>(summary: &'a Value, name: &str) -> &'a Value {
    let configs = summary["configs"].as_array().unwrap();
    configs.iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no {name}"))
}

/// A run of `config` whose eval loss falls linearly from 3.0 by `per_s` nats a second over a
/// 100 s day (evals every 5 s), taking `steps_per_s` steps a second; one 100 s phase "calm"
/// (the warm-up before it).
fn run(config: &str, repeat: usize, per_s: f64, steps_per_s: f64) -> Run {
    let t0 = 1000.0;
    let steps: Vec<Value> = (0..(100.0 * steps_per_s) as u64)
        .map(|s| {
            let t = t0 + s as f64 / steps_per_s;
            json!({ "rank": 0, "step": s, "t_start": t, "t_end": t + 0.5 / steps_per_s,
                    "codec": "int8" })
        })
        .collect();
    let evals = (1..=20)
        .map(|i| {
            let t = i as f64 * 5.0;
            (t * steps_per_s, t, 3.0 - per_s * t)
        })
        .collect();
    let line = |t: f64, phase: &str| {
        json!({ "unix_ms": t * 1e3, "elapsed_s": t - t0 + 10.0, "phase": phase,
                "stats": { "bytes_in": 0 } })
    };
    let mut timeline = vec![line(t0 - 10.0, "warmup"), line(t0 - 10.0, "warmup")];
    for s in 0..=100 {
        timeline.push(line(t0 + f64::from(s), "calm"));
        timeline.push(line(t0 + f64::from(s), "calm"));
    }
    Run {
        config: config.into(),
        setup: None,
        repeat,
        pass_s: 110.0,
        pass_end: t0 + 100.0,
        failed: Vec::new(),
        ranks: vec![steps],
        evals,
        eval_noise: Some(json!({ "stdev": 0.01, "windows": 128, "sets": 8 })),
        timeline,
        decisions: BTreeMap::new(),
        transport: Value::Null,
        cc: "cubic".into(),
        applied: Value::Null,
        hosts: Vec::new(),
        t0,
    }
}

/// `n` repeats of each `(config, per_s, steps_per_s)` as [`run`]s, interleaved as the benchmark
/// runs them; each repeat's loss falls 1% faster than the one before, so repeats differ.
fn repeats(n: usize, configs: &[(&str, f64, f64)]) -> Vec<Run> {
    let mut runs = Vec::new();
    for r in 0..n {
        let jitter = 1.0 + 0.01 * r as f64;
        for (config, per_s, steps_per_s) in configs {
            runs.push(run(config, r, per_s * jitter, *steps_per_s));
        }
    }
    runs
}

#[test]
fn late_targets_speedups_utilization_and_the_oracle() {
    let runs = repeats(
        3,
        &[
            ("untuned", 0.002, 0.2),
            ("static", 0.010, 1.0),
            ("adaptive", 0.020, 2.0),
            ("colocated", 0.040, 4.0),
            ("fixed-int8", 0.010, 1.0),
            ("fixed-int4", 0.015, 1.4),
        ],
    );
    let s = summarize("training-day", &runs, &[]);
    // The static target: its median run's loss at 75 s, 3.0 - 0.0101 x 75.
    let target = s["targets"]["static"]["eval_loss"].as_f64().unwrap();
    assert!((target - (3.0 - 0.0101 * 75.0)).abs() < 1e-9, "{target}");
    // Adaptive gets there in half the time: 2x, and every run faster than every static run.
    let a = config(&s, "adaptive");
    let speedup = &a["targets"]["static"]["speedup"];
    assert!((speedup["median"].as_f64().unwrap() - 2.0).abs() < 0.01, "{speedup}");
    assert_eq!(speedup["verdict"], "faster");
    // Utilization against the co-located ceiling: half.
    let u = a["targets"]["static"]["utilization"]["median"].as_f64().unwrap();
    assert!((u - 0.5).abs() < 0.01, "{u}");
    // Untuned never reaches the static target within its day; it has its own.
    let un = config(&s, "untuned");
    assert_eq!(un["targets"]["static"]["reached"], 0);
    assert!(un["targets"]["static"]["speedup"].is_null());
    assert_eq!(un["targets"]["untuned"]["reached"], 3);
    // Equal configurations are not called faster.
    let int8 = config(&s, "fixed-int8");
    assert_eq!(int8["targets"]["static"]["speedup"]["verdict"], "within spread");
    // Per phase: steps/s and its share of the ceiling.
    let calm = &a["phases"][0];
    assert_eq!(calm["phase"], "calm");
    assert!((calm["share_of_colocated"].as_f64().unwrap() - 0.5).abs() < 0.02, "{calm}");
    // The oracle: int4 (1.4 steps/s, 1.5x the loss per second of int8 at fewer steps).
    assert_eq!(s["oracle"][0]["config"], "fixed-int4");
}

/// Two ranks per site are judged against four ranks co-located where those ran (they
/// share the cores alike), against two where they did not, and the report says which.
#[test]
fn two_ranks_per_site_have_their_own_ceiling() {
    let mut runs = Vec::new();
    for r in 0..3 {
        runs.push(run("static", r, 0.010, 1.0));
        runs.push(run("colocated", r, 0.040, 4.0));
        runs.push(run("adaptive-outer-2x", r, 0.015, 1.5));
    }
    let u = |s: &Value| {
        let c = config(s, "adaptive-outer-2x");
        (c["ceiling"].clone(), c["targets"]["static"]["utilization"]["median"].as_f64().unwrap())
    };
    let (ceiling, share) = u(&summarize("training-day", &runs, &[]));
    assert_eq!(ceiling, "colocated");
    assert!((share - 1.5 / 4.0).abs() < 0.01, "{share}");
    for r in 0..3 {
        runs.push(run("colocated-2x", r, 0.020, 2.0));
    }
    let (ceiling, share) = u(&summarize("training-day", &runs, &[]));
    assert_eq!(ceiling, "colocated-2x");
    assert!((share - 0.75).abs() < 0.01, "{share}");
}

/// The ladder: co-located's loss at 25, 50 and 75% of its day, speedups against static-bbr,
/// and the fixed configuration best in hindsight.
#[test]
fn a_ladder_of_targets_against_the_strongest_fixed_configuration() {
    let runs = repeats(
        3,
        &[
            ("static", 0.010, 1.0),
            ("static-bbr", 0.020, 2.0),
            ("adaptive", 0.030, 3.0),
            ("colocated", 0.040, 4.0),
        ],
    );
    let s = summarize("ref-day", &runs, &[]);
    for (rung, at) in [("rung-25", 25.0), ("rung-50", 50.0), ("rung-75", 75.0)] {
        let t = &s["targets"][rung];
        assert!((t["eval_loss"].as_f64().unwrap() - (3.0 - 0.0404 * at)).abs() < 1e-9, "{t}");
        assert_eq!(
            (t["of"].as_str(), t["speedup_against"].as_str()),
            (Some("colocated"), Some("static-bbr"))
        );
    }
    // Co-located's loss at 25 s of its day: adaptive needs 25 x 4/3 s, static-bbr 50 s.
    let a = config(&s, "adaptive");
    let sp = &a["targets"]["rung-25"]["speedup"];
    assert!((sp["median"].as_f64().unwrap() - 1.5).abs() < 0.02, "{sp}");
    assert_eq!(sp["verdict"], "faster");
    // The late rung is beyond static-bbr's day (3.0 - 0.0404 x 75 < 3.0 - 0.02 x 100).
    assert_eq!(config(&s, "static-bbr")["targets"]["rung-75"]["reached"], 0);
    assert!(a["targets"]["rung-75"]["speedup"].is_null());
    // Best in hindsight: no fixed configuration reaches the upper rungs in every run;
    // static-bbr reaches the first in half static's time.
    assert_eq!(s["best_fixed"]["name"], "static-bbr", "{}", s["best_fixed"]);
    assert_eq!(s["best_fixed"]["by"], "time to rung-25");
}

/// Where the configuration chosen in advance ran, the rungs are taken against it, and
/// co-located's own speedup is the headroom the report states.
#[test]
fn rungs_are_taken_against_the_configuration_chosen_in_advance_where_it_ran() {
    let runs = repeats(
        2,
        &[("static-bbr", 0.020, 2.0), (CHOSEN_IN_ADVANCE, 0.032, 3.0), ("colocated", 0.040, 4.0)],
    );
    let s = summarize("ref-reroute", &runs, &[]);
    assert_eq!(s["targets"]["rung-25"]["speedup_against"], CHOSEN_IN_ADVANCE);
    // Co-located's loss at 25 s of its day: the chosen configuration needs 25 x 40/32 s.
    let headroom = &config(&s, CEILING)["targets"]["rung-25"]["speedup"]["median"];
    assert!((headroom.as_f64().unwrap() - 1.25).abs() < 0.02, "{headroom}");
    let text = super::super::markdown::markdown(&s);
    assert!(text.contains("Headroom: co-located against outer-expert-h100, rung-25 1.2"), "{text}");
}

/// A configuration's setup is the one its runs recorded (a reference day's calibrated batch),
/// and the list's own where a record predates it.
#[test]
fn setup_as_the_runs_recorded_it() {
    let mut runs = repeats(1, &[("static-bbr", 0.010, 1.0), ("adaptive", 0.020, 2.0)]);
    runs[0].setup = Some("1 rank(s) per site, batch 14 per rank".into());
    let s = summarize("ref-fatpipe", &runs, &[]);
    assert_eq!(config(&s, "static-bbr")["setup"], "1 rank(s) per site, batch 14 per rank");
    let listed = config::all().into_iter().find(|c| c.name == "adaptive").unwrap().describe();
    assert_eq!(config(&s, "adaptive")["setup"], listed.as_str());
}
