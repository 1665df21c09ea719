//! A finished run read back from its directory, and what one run measures: its loss curve made
//! monotone, its time and steps to a loss, its phases as the lab's clock cut them, the codecs
//! every rank reported per phase, and the decisions of every host's daemon.

use std::{collections::BTreeMap, fs, path::Path};

use anyhow::Context as _;
use serde_json::Value;

use super::stats::{first_at_or_below, nonincreasing, value_at};

/// The lab's first phase, in which the ranks start; not reported.
pub const WARMUP_PHASE: &str = "warmup";

pub struct Run {
    pub config: String,
    /// The configuration as it ran (its batch is the calibrated one on a reference day).
    pub setup: Option<String>,
    pub repeat: usize,
    /// The scenario's pass: its length and its end (unix seconds).
    pub pass_s: f64,
    pub pass_end: f64,
    pub failed: Vec<String>,
    /// Every rank's step lines, by rank.
    pub ranks: Vec<Vec<Value>>,
    /// (steps done, seconds since the first step began, eval loss), within the pass.
    pub evals: Vec<(f64, f64, f64)>,
    pub eval_noise: Option<Value>,
    pub timeline: Vec<Value>,
    /// Per host ("hk0", "us0"...): its daemon's decisions.
    pub decisions: BTreeMap<String, Vec<Value>>,
    pub transport: Value,
    /// The congestion control every host started with.
    pub cc: String,
    /// Global sysctls the benchmark set in the initial namespace for the run.
    pub applied: Value,
    /// The lab's hosts ("hk0", "us0"...), HK first: rank r ran on the r-th (across the WAN).
    pub hosts: Vec<String>,
    /// Unix seconds at which rank 0's first step began.
    pub t0: f64,
}

fn json_lines(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("{}: {l:?}", path.display())))
        .collect()
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(f64::NAN)
}

impl Run {
    pub fn load(dir: &Path) -> anyhow::Result<Self> {
        let record: Value = serde_json::from_str(
            &fs::read_to_string(dir.join("run.json"))
                .with_context(|| format!("reading {}", dir.join("run.json").display()))?,
        )?;
        let mut ranks: Vec<Vec<Value>> = Vec::new();
        for v in json_lines(&dir.join("steps.jsonl"))? {
            if v.get("step").is_none() || v.get("t_end").is_none() {
                continue;
            }
            let r = v["rank"].as_u64().unwrap_or(0) as usize;
            if ranks.len() <= r {
                ranks.resize(r + 1, Vec::new());
            }
            ranks[r].push(v);
        }
        for r in &mut ranks {
            r.sort_by_key(|v| v["step"].as_u64());
        }
        let t0 = ranks.first().and_then(|r| r.first()).map_or(f64::NAN, |v| f(v, "t_start"));
        let pass_end = record["pass_end_unix"].as_f64().unwrap_or(f64::NAN);
        let mut evals = Vec::new();
        let mut eval_noise = None;
        for v in json_lines(&dir.join("evals.jsonl"))? {
            if let Some(n) = v.get("eval_noise") {
                eval_noise = Some(n.clone());
            } else if f(&v, "t_end") <= pass_end {
                evals.push((f(&v, "steps"), f(&v, "t_end") - t0, f(&v, "eval_loss")));
            }
        }
        let mut decisions = BTreeMap::new();
        for e in fs::read_dir(dir)?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(host) = name.strip_suffix("-decisions.jsonl") {
                decisions.insert(host.to_owned(), json_lines(&e.path())?);
            }
        }
        let transport = fs::read_to_string(dir.join("transport.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        Ok(Self {
            config: record["config"].as_str().unwrap_or("?").to_owned(),
            setup: record["setup"].as_str().map(str::to_owned),
            repeat: record["repeat"].as_u64().unwrap_or(0) as usize,
            pass_s: record["pass_s"].as_f64().unwrap_or(f64::NAN),
            pass_end,
            failed: record["failed"]
                .as_array()
                .map(|a| a.iter().filter_map(|f| f.as_str().map(str::to_owned)).collect())
                .unwrap_or_default(),
            ranks,
            evals,
            eval_noise,
            timeline: json_lines(&dir.join("lab.jsonl"))?,
            decisions,
            transport,
            cc: record["cc"].as_str().unwrap_or("cubic").to_owned(),
            applied: record["applied_in_initial_namespace"].clone(),
            hosts: record["hosts"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(|n| n.rsplit('-').next().unwrap_or(n).to_owned())
                        .collect()
                })
                .unwrap_or_default(),
            t0,
        })
    }

    /// Rank 0's steps that ended within the pass.
    pub fn steps(&self) -> impl Iterator<Item = &Value> {
        self.ranks.first().into_iter().flatten().filter(|s| f(s, "t_end") <= self.pass_end)
    }

    /// Seconds from the first step's start to the end of the pass: the run's day.
    pub fn day_s(&self) -> f64 {
        self.pass_end - self.t0
    }

    /// The eval loss against seconds of training, made non-increasing.
    pub fn curve_by_time(&self) -> Vec<(f64, f64)> {
        let fit = nonincreasing(&self.evals.iter().map(|e| e.2).collect::<Vec<_>>());
        self.evals.iter().zip(fit).map(|(e, l)| (e.1, l)).collect()
    }

    /// The eval loss against steps taken, made non-increasing.
    pub fn curve_by_steps(&self) -> Vec<(f64, f64)> {
        let fit = nonincreasing(&self.evals.iter().map(|e| e.2).collect::<Vec<_>>());
        self.evals.iter().zip(fit).map(|(e, l)| (e.0, l)).collect()
    }

    /// The loss reached at `fraction` of the day.
    pub fn loss_at_fraction(&self, fraction: f64) -> Option<f64> {
        value_at(&self.curve_by_time(), fraction * self.day_s())
    }

    pub fn time_to(&self, target: f64) -> Option<f64> {
        first_at_or_below(&self.curve_by_time(), target)
    }

    pub fn steps_to(&self, target: f64) -> Option<f64> {
        first_at_or_below(&self.curve_by_steps(), target)
    }

    pub fn loss_at_steps(&self, steps: f64) -> Option<f64> {
        value_at(&self.curve_by_steps(), steps)
    }

    /// Quality at the day's budget: the median of the last three evaluations in the pass.
    pub fn final_loss(&self) -> Option<f64> {
        let mut last: Vec<f64> = self.evals.iter().rev().take(3).map(|e| e.2).collect();
        last.sort_by(f64::total_cmp);
        last.get(last.len() / 2).copied()
    }

    /// How far single evaluations scatter around the run's monotone curve: the stdev of the
    /// residuals over the second half of the day, the noise a target crossing meets in one run.
    pub fn curve_jitter(&self) -> Option<f64> {
        let fit = self.curve_by_time();
        let half = self.day_s() / 2.0;
        let r: Vec<f64> = self
            .evals
            .iter()
            .zip(&fit)
            .filter(|(e, _)| e.1 >= half)
            .map(|(e, f)| e.2 - f.1)
            .collect();
        if r.len() < 3 {
            return None;
        }
        let mean = r.iter().sum::<f64>() / r.len() as f64;
        Some((r.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (r.len() - 1) as f64).sqrt())
    }

    pub fn eval_noise_stdev(&self) -> Option<f64> {
        self.eval_noise.as_ref().and_then(|n| n["stdev"].as_f64())
    }

    /// The phases the lab's clock cut the pass into (the warm-up left out).
    pub fn phases(&self) -> Vec<Phase> {
        phases(&self.timeline, self.pass_end)
            .into_iter()
            .filter(|p| p.name != WARMUP_PHASE && p.end > p.start)
            .collect()
    }

    /// What the run did in `p`: rank 0's steps ending there and the codecs of every rank's.
    pub fn in_phase(&self, p: &Phase) -> PhaseRun {
        let inside = |s: &&Value| (p.start..p.end).contains(&f(s, "t_end"));
        let steps: Vec<&Value> = self.steps().filter(inside).collect();
        let mut times: Vec<f64> = steps.iter().map(|s| f(s, "t_end") - f(s, "t_start")).collect();
        times.sort_by(f64::total_cmp);
        let mut codecs: BTreeMap<String, usize> = BTreeMap::new();
        for rank in &self.ranks {
            for s in rank.iter().filter(inside) {
                *codecs.entry(s["codec"].as_str().unwrap_or("?").to_owned()).or_default() += 1;
            }
        }
        let n = steps.len();
        PhaseRun {
            steps_per_s: n as f64 / (p.end - p.start),
            p50_s: percentile(&times, 0.5),
            p99_s: percentile(&times, 0.99),
            wan_bytes_per_step: if n > 0 {
                p.bytes.1.saturating_sub(p.bytes.0) as f64 / n as f64
            } else {
                f64::NAN
            },
            codecs,
        }
    }

    /// Steps at which the ranks reported different codecs (they must agree on every step).
    pub fn codec_disagreements(&self) -> Vec<u64> {
        let Some(first) = self.ranks.first() else { return Vec::new() };
        let mut out = Vec::new();
        for s in first {
            let step = s["step"].as_u64();
            for other in &self.ranks[1..] {
                if let Some(o) = other.iter().find(|o| o["step"].as_u64() == step) {
                    if o["codec"] != s["codec"] {
                        out.extend(step);
                    }
                }
            }
        }
        out
    }
}

pub struct PhaseRun {
    pub steps_per_s: f64,
    pub p50_s: f64,
    pub p99_s: f64,
    pub wan_bytes_per_step: f64,
    /// Steps per codec, counted over every rank's reports.
    pub codecs: BTreeMap<String, usize>,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// A phase as the lab's timeline shows it: [start, end) in unix seconds, WAN bytes at each end.
pub struct Phase {
    pub name: String,
    pub start: f64,
    pub end: f64,
    pub bytes: (u64, u64),
}

/// Phases from the lab's per-second lines, up to the pass's end. The lab prints one line per
/// direction each second, each with its own clock reading: lines less than half a second apart
/// are one second's, and a second missing a direction's line is left out.
fn phases(timeline: &[Value], pass_end: f64) -> Vec<Phase> {
    let mut seconds: Vec<Vec<&Value>> = Vec::new();
    for v in timeline {
        match seconds.last_mut() {
            Some(sec) if (f(v, "elapsed_s") - f(sec[0], "elapsed_s")).abs() < 0.5 => sec.push(v),
            _ => seconds.push(vec![v]),
        }
    }
    let mut out: Vec<Phase> = Vec::new();
    for sec in seconds.iter().filter(|s| s.len() == 2) {
        let t = f(sec[0], "unix_ms") / 1e3;
        if t > pass_end + 1.0 {
            break;
        }
        let name = sec[0]["phase"].as_str().unwrap_or("?").to_owned();
        let bytes: u64 = sec.iter().map(|v| v["stats"]["bytes_in"].as_u64().unwrap_or(0)).sum();
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

/// Every run under `dir` (`<config>/r<repeat>/`), in configuration then repeat order.
pub fn load_all(dir: &Path) -> anyhow::Result<Vec<Run>> {
    let mut runs = Vec::new();
    let Ok(configs) = fs::read_dir(dir) else { return Ok(runs) };
    for c in configs.flatten().filter(|e| e.path().is_dir()) {
        for r in fs::read_dir(c.path())?.flatten() {
            if r.path().join("run.json").exists() {
                runs.push(Run::load(&r.path())?);
            }
        }
    }
    runs.sort_by(|a, b| (&a.config, a.repeat).cmp(&(&b.config, b.repeat)));
    Ok(runs)
}
