//! `cargo xtask bench-training`: real DDP training (torch, gloo on CPU) across the WAN lab, each
//! configuration a fresh run over the same scenario: untuned, the reference case's static
//! hand-tuning, linkpilot adaptive (the daemon on both sites, the hook following its board), and
//! fixed codecs with tuned buffers from which the per-phase oracle is taken. Results in
//! `target/bench-training/` (JSON, a markdown table, SVG plots).

mod config;
mod plot;
mod report;

use std::{
    fs,
    io::{BufRead, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use serde_json::Value;

use crate::{
    lab::{self, Host, Lab, Reaped},
    run::{status, workspace_root},
};
pub use config::Config;

const LAB_NAME: &str = "bt";
/// The lab's first phase, in which the ranks start; not reported.
pub const WARMUP_PHASE: &str = "warmup";

pub struct Args {
    pub quick: bool,
    pub scenario: Option<String>,
    pub configs: Option<Vec<String>>,
    pub keep: bool,
}

/// What one configuration's run left: rank 0's step lines, the lab's timeline, the decisions.
pub struct RunResult {
    pub config: Config,
    pub steps: Vec<Value>,
    pub failed: Vec<String>,
    pub timeline: Vec<Value>,
    pub decisions: usize,
    /// Seconds of one pass of the scenario: what came after it is not reported.
    pub pass_s: f64,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if !lab::is_root() {
        bail!("the benchmark builds network namespaces and runs the daemon: run it as root");
    }
    crate::setup::run()?;
    status(
        "build",
        Command::new(env!("CARGO")).args(["build", "-p", "linkpilot", "-p", "linkpilot-lab"]),
    )?;
    let scenario = args
        .scenario
        .clone()
        .unwrap_or_else(|| if args.quick { "training-quick" } else { "training-day" }.to_owned());
    let configs = config::select(args.quick, args.configs.as_deref())?;
    let out = workspace_root().join("target/bench-training");
    if args.keep {
        for c in &configs {
            let _ = fs::remove_dir_all(out.join(&c.name));
        }
    } else {
        let _ = fs::remove_dir_all(&out);
    }
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let secs = lab::pass_seconds(&scenario)?;
    let capacity = lab::top_rate(&scenario)?;
    println!(
        "bench-training: {} configuration(s) over {scenario} ({secs:.0} s each); results in {}",
        configs.len(),
        out.display()
    );
    let mut results = Vec::new();
    let fresh: Vec<String> = configs.iter().map(|c| c.name.clone()).collect();
    for c in configs {
        println!("== {}: {}", c.name, c.describe());
        let dir = out.join(&c.name);
        fs::create_dir_all(&dir)?;
        let r = run_config(&c, &scenario, secs, capacity, &dir)
            .with_context(|| format!("configuration {} (logs in {})", c.name, dir.display()))?;
        println!(
            "   {} steps in the pass, last eval loss {}, {} decisions, {} failed collectives",
            r.steps.len(),
            r.steps.iter().rev().find_map(|s| s["eval_loss"].as_f64()).unwrap_or(f64::NAN),
            r.decisions,
            r.failed.len()
        );
        results.push(r);
    }
    if args.keep {
        results = with_kept(results, &fresh, &scenario, &out)?;
    }
    let summary = report::summarize(&results);
    fs::write(out.join("results.json"), serde_json::to_string_pretty(&summary)?)?;
    let table = report::markdown(&summary);
    fs::write(out.join("results.md"), &table)?;
    plot::step_times(&results, &out.join("step-time.svg"))?;
    plot::loss(&results, &out.join("loss.svg"))?;
    println!("\n{table}");
    println!(
        "results: {0}/results.json, {0}/results.md, {0}/step-time.svg, {0}/loss.svg",
        out.display()
    );
    if args.quick {
        report::check_quick(&summary)?;
    }
    Ok(())
}

fn run_config(
    c: &Config,
    scenario: &str,
    secs: f64,
    capacity: Option<f64>,
    dir: &Path,
) -> anyhow::Result<RunResult> {
    // The lab outlives the pass so that the ranks' last steps (they stop at a sync point after
    // the pass) still have a link; steps that end after the pass are not reported.
    let running = Lab::start(dir, scenario, LAB_NAME, c.per_site, secs.ceil() as u64 + 90)?;
    let started = Instant::now();
    let mut daemons = Vec::new();
    if let Some(policy) = &c.policy {
        for h in &running.hosts {
            daemons.push(start_daemon(policy, h, capacity, dir)?);
        }
    }
    // Train until the scenario's pass ends (the ranks agree on the last step among themselves).
    let left = secs - started.elapsed().as_secs_f64() - 2.0;
    let hosts = running.hosts.clone();
    let mut ranks: Vec<RankProc> = hosts
        .iter()
        .enumerate()
        .map(|(r, h)| start_rank(c, r, &hosts, h, left, dir))
        .collect::<anyhow::Result<_>>()?;
    let deadline = Instant::now() + Duration::from_secs_f64(left + 180.0);
    let mut steps = Vec::new();
    let mut done = Value::Null;
    let mut failed = Vec::new();
    while let Some(v) = ranks[0].next(deadline) {
        if v.get("done").is_some() {
            done = v;
            break;
        }
        if let Some(f) = v.get("failed") {
            failed.push(f.to_string());
        } else if v.get("step").is_some() {
            steps.push(v);
        }
    }
    for (r, p) in ranks.iter_mut().enumerate() {
        match p.process.wait_until(deadline) {
            Some(s) if s.success() => {}
            Some(s) if s.code() == Some(3) => failed.push(format!("rank {r}: a collective failed")),
            Some(s) => bail!("rank {r} failed ({s}); its log: {}", p.log.display()),
            None => bail!("rank {r} did not finish in time; its log: {}", p.log.display()),
        }
    }
    if done.is_null() && failed.is_empty() {
        bail!("rank 0 printed no result; its log: {}", ranks[0].log.display());
    }
    drop(ranks);
    drop(daemons);
    let timeline = running.timeline.lock().map(|t| t.clone()).unwrap_or_default();
    drop(running);
    let decisions =
        fs::read_to_string(dir.join("hk0-decisions.jsonl")).map(|t| t.lines().count()).unwrap_or(0);
    fs::write(dir.join("steps.jsonl"), steps.iter().map(|v| format!("{v}\n")).collect::<String>())?;
    let run = serde_json::json!({ "scenario": scenario, "pass_s": secs, "failed": failed });
    fs::write(dir.join("run.json"), run.to_string())?;
    fs::write(
        dir.join("lab.jsonl"),
        timeline.iter().map(|v| format!("{v}\n")).collect::<String>(),
    )?;
    Ok(RunResult { config: c.clone(), steps, failed, timeline, decisions, pass_s: secs })
}

/// `linkpilot run` in `host`'s namespace with the policy for its site; every file it writes is
/// in `dir`, prefixed with the host.
fn start_daemon(
    policy: &config::Policy,
    host: &Host,
    capacity: Option<f64>,
    dir: &Path,
) -> anyhow::Result<Reaped> {
    let tag = host_tag(host);
    let policy_file = dir.join(format!("{tag}-policy.toml"));
    fs::write(&policy_file, policy.for_site(&host.site, capacity)?)?;
    let p = |f: &str| dir.join(format!("{tag}-{f}")).display().to_string();
    let child = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", host.netns))
        .arg(lab::bin("linkpilot"))
        .args(["run", "--policy", &policy_file.display().to_string()])
        .args(["--board", &p("knobs"), "--env-file", &p("nccl.env")])
        .args(["--sysctl-state", &p("sysctl-originals.json"), "--lock", &p("lock")])
        .args(["--roce-tc-state", &p("roce-tc-originals.json")])
        .args(["--decision-log", &p("decisions.jsonl"), "--status-socket", &p("status.sock")])
        .args(["--metrics-addr", "off", "--tuner-stats", &p("tuner")])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(fs::File::create(p("daemon.log"))?)
        .spawn()
        .context("starting linkpilot run")?;
    let daemon = Reaped(child, "linkpilot run");
    // Up once the board exists (written before the first tick's decision is published).
    let start = Instant::now();
    while !Path::new(&p("knobs")).exists() {
        if start.elapsed() > Duration::from_secs(30) {
            bail!("the daemon on {} did not come up; see {}", host.netns, p("daemon.log"));
        }
        thread::sleep(Duration::from_millis(100));
    }
    Ok(daemon)
}

fn host_tag(h: &Host) -> String {
    h.netns.rsplit('-').next().unwrap_or(&h.netns).to_owned()
}

struct RankProc {
    process: Reaped,
    lines: mpsc::Receiver<Value>,
    log: PathBuf,
}

impl RankProc {
    fn next(&mut self, deadline: Instant) -> Option<Value> {
        let left = deadline.checked_duration_since(Instant::now())?;
        self.lines.recv_timeout(left).ok()
    }
}

fn start_rank(
    c: &Config,
    rank: usize,
    hosts: &[Host],
    host: &Host,
    seconds: f64,
    dir: &Path,
) -> anyhow::Result<RankProc> {
    let tag = host_tag(host);
    let script = workspace_root().join("python/benchmarks/train_lm.py");
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/run/netns/{}", host.netns))
        .arg(crate::python::python())
        .arg(script)
        .args(["--rank", &rank.to_string(), "--world", &hosts.len().to_string()])
        .args(["--master", &format!("{}:29500", hosts[0].ipv4), "--iface", "eth0"])
        .args(["--duration", &format!("{seconds:.0}"), "--sync-every", "3", "--eval-every", "5"])
        .args(c.rank_args(&dir.join(format!("{tag}-knobs")), &dir.join(format!("{tag}-nccl.env"))))
        .env("PYTHONUNBUFFERED", "1")
        .env("OMP_NUM_THREADS", "1")
        .stdout(Stdio::piped())
        .stderr(fs::File::create(dir.join(format!("rank{rank}.log")))?);
    let mut child = cmd.spawn().context("starting a training rank")?;
    let stdout = child.stdout.take().context("rank stdout")?;
    let (tx, lines) = mpsc::channel();
    let mut raw = fs::File::create(dir.join(format!("rank{rank}.jsonl")))?;
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = writeln!(raw, "{line}");
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if tx.send(v).is_err() {
                    break;
                }
            }
        }
    });
    Ok(RankProc {
        process: Reaped(child, "a training rank"),
        lines,
        log: dir.join(format!("rank{rank}.log")),
    })
}

/// `results` and, in the benchmark's order, every other configuration whose earlier run over
/// `scenario` left its files in `out`.
fn with_kept(
    results: Vec<RunResult>,
    fresh: &[String],
    scenario: &str,
    out: &Path,
) -> anyhow::Result<Vec<RunResult>> {
    let mut fresh_results: Vec<Option<RunResult>> = results.into_iter().map(Some).collect();
    let mut all = Vec::new();
    for c in config::all() {
        if let Some(i) = fresh.iter().position(|n| *n == c.name) {
            all.extend(fresh_results[i].take());
            continue;
        }
        let dir = out.join(&c.name);
        let Ok(run) = fs::read_to_string(dir.join("run.json")) else { continue };
        let run: Value = serde_json::from_str(&run)
            .with_context(|| format!("{}: not a run record", dir.join("run.json").display()))?;
        if run["scenario"] != scenario {
            println!("   not reporting {}: its run was over {}", c.name, run["scenario"]);
            continue;
        }
        let lines = |f: &str| -> anyhow::Result<Vec<Value>> {
            let path = dir.join(f);
            let text =
                fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            text.lines()
                .map(|l| serde_json::from_str(l).with_context(|| format!("{}", path.display())))
                .collect()
        };
        let decisions = fs::read_to_string(dir.join("hk0-decisions.jsonl"))
            .map(|t| t.lines().count())
            .unwrap_or(0);
        println!("   reporting {} from its earlier run", c.name);
        all.push(RunResult {
            steps: lines("steps.jsonl")?,
            timeline: lines("lab.jsonl")?,
            failed: run["failed"]
                .as_array()
                .map(|a| a.iter().filter_map(|f| f.as_str().map(str::to_owned)).collect())
                .unwrap_or_default(),
            decisions,
            pass_s: run["pass_s"].as_f64().unwrap_or(0.0),
            config: c,
        });
    }
    Ok(all)
}
