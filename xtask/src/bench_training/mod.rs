//! `cargo xtask bench-training`: real DDP training (torch, gloo on CPU) across the WAN lab, each
//! configuration a fresh run over the same scenario, repeated with the configurations
//! interleaved round-robin so that the machine's drift hits all alike: untuned, the reference
//! case's static hand-tuning, linkpilot adaptive (the daemon on both sites, the hook following
//! its board), the same ranks co-located (the ceiling), and fixed codecs with tuned buffers from
//! which the per-phase oracle is taken. Results in `target/bench-training/<scenario>/` (JSON, a
//! markdown table, SVG plots); each run's files in `<config>/r<repeat>/`.

mod calibrate;
mod check;
mod config;
mod markdown;
mod plot;
mod report;
mod run;
mod runs;
mod states;
pub mod stats;
pub mod transport;

use std::{fs, path::Path};

use anyhow::{bail, Context as _};

use crate::{lab, run::workspace_root};

#[derive(clap::Args)]
pub struct Args {
    /// The short form CI runs: training-quick, static-bbr vs adaptive, a hook that ignores
    /// its board and the shipped policy pinned to no compression, once, no checkpoint
    /// evaluated; fails unless adaptive's ranks follow the boards through a codec change
    /// (and the ignoring hook fails that check), and adaptive is faster than static-bbr
    /// when congested (and the pinned policy is not).
    #[arg(long)]
    pub quick: bool,
    /// Runs per configuration, interleaved round-robin (default: 3; quick: 1).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=20))]
    pub repeats: Option<u16>,
    /// Lab scenarios (built-in names or files; default: training-day and the held-out
    /// training-holdout; quick: training-quick).
    #[arg(long = "scenario", value_delimiter = ',')]
    pub scenarios: Option<Vec<String>>,
    /// A subset of configurations, e.g. untuned,adaptive (default: each scenario's set).
    #[arg(long, value_delimiter = ',')]
    pub configs: Option<Vec<String>>,
    /// Keep the earlier runs of configurations not run now and report them too (to re-run
    /// one configuration after a policy change).
    #[arg(long, requires = "configs")]
    pub keep: bool,
    /// Go on with an interrupted benchmark of the same plan (scenarios, configurations,
    /// repeats): keeps every run that finished and runs the others.
    #[arg(long, conflicts_with = "keep")]
    pub resume: bool,
    /// Only summarize the runs already in target/bench-training.
    #[arg(long, conflicts_with_all = ["repeats", "configs", "keep", "resume"])]
    pub report_only: bool,
    /// Held-out windows per evaluation of a checkpoint (the quick form evaluates none).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=512))]
    pub eval_windows: u32,
    /// The congestion control every lab host starts with (default cubic, the common
    /// distribution default); results of another go to target/bench-training-CC.
    #[arg(long)]
    pub cc: Option<String>,
    /// Batch per rank on the reference regime's days (default: calibrated on this machine so
    /// that one step's compute is the regime's 1.10 s; the regime was scaled at 32).
    #[arg(long, value_parser = clap::value_parser!(u32).range(4..=64))]
    pub reference_batch: Option<u32>,
}

/// Runs that failed, one JSON line each, in a scenario's results directory.
const FAILURES: &str = "failed-runs.jsonl";

/// Repeats of the full run: the least that gives a median and a range.
const FULL_REPEATS: usize = 3;

pub fn run(args: Args) -> anyhow::Result<()> {
    let cc = args.cc.clone().unwrap_or_else(|| transport::DEFAULT_CC.to_owned());
    // Runs with another host default are another benchmark: their own results directory.
    let out = workspace_root().join(if cc == transport::DEFAULT_CC {
        "target/bench-training".to_owned()
    } else {
        format!("target/bench-training-{cc}")
    });
    let scenarios: Vec<String> = args.scenarios.clone().unwrap_or_else(|| {
        if args.quick {
            vec![config::QUICK_SCENARIO.to_owned()]
        } else {
            config::FULL_SCENARIOS.iter().map(|s| (*s).to_owned()).collect()
        }
    });
    if !args.report_only {
        transport::check_cc(&cc)?;
        transport::restore_interrupted()?;
        measure(&args, &scenarios, &out, &cc)?;
    }
    for scenario in &scenarios {
        let dir = out.join(scenario_dir(scenario));
        let runs = runs::load_all(&dir)?;
        if runs.is_empty() {
            bail!("no runs of {scenario} in {}", dir.display());
        }
        let failures: Vec<serde_json::Value> = fs::read_to_string(dir.join(FAILURES))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let mut summary = report::summarize(scenario, &runs, &failures);
        if let Some(c) = calibrate::saved(&dir) {
            summary["calibration"] = serde_json::to_value(c)?;
        }
        fs::write(dir.join("results.json"), serde_json::to_string_pretty(&summary)?)?;
        let table = markdown::markdown(&summary);
        fs::write(dir.join("results.md"), &table)?;
        plot::step_times(&runs, &dir.join("step-time.svg"))?;
        plot::loss(&runs, &dir.join("loss.svg"))?;
        println!("\n{table}");
        println!("results: {0}/results.json, results.md, step-time.svg, loss.svg", dir.display());
        if args.quick {
            check::quick(&runs)?;
        }
    }
    Ok(())
}

/// A scenario's results directory: its name, or a file's stem.
fn scenario_dir(scenario: &str) -> String {
    Path::new(scenario).file_stem().and_then(|s| s.to_str()).unwrap_or(scenario).to_owned()
}

fn measure(args: &Args, scenarios: &[String], out: &Path, cc: &str) -> anyhow::Result<()> {
    if !lab::is_root() {
        bail!("the benchmark builds network namespaces and runs the daemon: run it as root");
    }
    crate::setup::run()?;
    crate::build_ebpf::debug_binaries()?;
    let repeats =
        args.repeats.map(usize::from).unwrap_or(if args.quick { 1 } else { FULL_REPEATS });
    // The quick form's checks judge steps and codecs, not loss: no checkpoint is evaluated
    // (eval_checkpoints.py has tests of its own).
    let eval = (!args.quick).then_some(run::Eval { windows: args.eval_windows, noise_sets: 8 });
    struct Plan {
        scenario: String,
        configs: Vec<config::Config>,
        pass_s: f64,
        capacity: Option<f64>,
    }
    let mut plans = Vec::new();
    for scenario in scenarios {
        let mut configs = config::select(scenario, args.quick, args.configs.as_deref())?;
        let dir = out.join(scenario_dir(scenario));
        if args.keep {
            for c in &configs {
                let _ = fs::remove_dir_all(dir.join(&c.name));
            }
            // The failures of the configurations run again go with their old runs.
            let kept: String = fs::read_to_string(dir.join(FAILURES))
                .unwrap_or_default()
                .lines()
                .filter(|l| {
                    serde_json::from_str::<serde_json::Value>(l)
                        .is_ok_and(|v| !configs.iter().any(|c| v["config"] == c.name.as_str()))
                })
                .map(|l| format!("{l}\n"))
                .collect();
            let _ = fs::write(dir.join(FAILURES), kept);
        } else if args.resume {
            // A failed run left no run.json: it is run again now, its old failure forgotten.
            let _ = fs::remove_file(dir.join(FAILURES));
        } else {
            let _ = fs::remove_dir_all(&dir);
        }
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        if config::REFERENCE_REGIME.contains(&scenario.as_str()) {
            let reuse = args.keep || args.resume;
            let c = calibrate::load_or_measure(&dir, reuse, args.reference_batch)?;
            configs = config::at_reference_batch(configs, c.batch);
        }
        plans.push(Plan {
            scenario: scenario.clone(),
            pass_s: lab::pass_seconds(scenario)?,
            capacity: lab::top_rate(scenario)?,
            configs,
        });
    }
    let total: usize = plans.iter().map(|p| p.configs.len()).sum::<usize>() * repeats;
    println!(
        "bench-training: {total} run(s): {repeats} repeat(s) of {}; results in {}",
        plans
            .iter()
            .map(|p| format!(
                "{} configuration(s) over {} ({:.0} s)",
                p.configs.len(),
                p.scenario,
                p.pass_s
            ))
            .collect::<Vec<_>>()
            .join(" and "),
        out.display()
    );
    let mut n = 0;
    let mut errors = Vec::new();
    for repeat in 0..repeats {
        for p in &plans {
            for c in &p.configs {
                n += 1;
                println!(
                    "== [{n}/{total}] {} {} repeat {}: {}",
                    p.scenario,
                    c.name,
                    repeat + 1,
                    c.describe()
                );
                let dir =
                    out.join(scenario_dir(&p.scenario)).join(&c.name).join(format!("r{repeat}"));
                if args.resume && dir.join("run.json").exists() {
                    println!("   finished before: kept");
                    continue;
                }
                let spec = run::Spec {
                    config: c,
                    scenario: &p.scenario,
                    repeat,
                    pass_s: p.pass_s,
                    capacity: p.capacity,
                    eval,
                    cc,
                    dir: dir.clone(),
                };
                match run::run(&spec).and_then(|()| runs::Run::load(&dir)) {
                    Ok(r) => println!(
                        "   {} steps in the pass, final eval loss {}, decisions {:?}, {} failed collective(s)",
                        r.steps().count(),
                        r.final_loss().map_or("-".into(), |l| format!("{l:.4}")),
                        r.decisions.iter().map(|(h, d)| format!("{h} {}", d.len())).collect::<Vec<_>>(),
                        r.failed.len()
                    ),
                    // CI's short form stops at the first; a long run reports the others.
                    Err(e) if args.quick => {
                        return Err(e).with_context(|| format!("configuration {} (files in {})", c.name, dir.display()));
                    }
                    Err(e) => {
                        println!("   FAILED: {e:#} (files in {})", dir.display());
                        let _ = fs::remove_file(dir.join("run.json"));
                        // Reported beside the runs that did finish, never dropped silently.
                        let line = serde_json::json!({
                            "config": c.name, "repeat": repeat, "error": format!("{e:#}"),
                        });
                        let failures = out.join(scenario_dir(&p.scenario)).join(FAILURES);
                        let mut f = fs::OpenOptions::new().create(true).append(true).open(&failures)?;
                        std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes())?;
                        errors.push(format!("{} {} repeat {}: {e:#}", p.scenario, c.name, repeat + 1));
                    }
                }
            }
        }
    }
    if !errors.is_empty() {
        println!(
            "bench-training: {} run(s) failed and are left out:\n  {}",
            errors.len(),
            errors.join("\n  ")
        );
    }
    Ok(())
}
