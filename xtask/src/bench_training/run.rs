//! One run: a configuration over a scenario, once. The lab, the daemons on its hosts, the ranks;
//! the ranks stop together after the scenario's pass (a stop file, no round trip); then their
//! checkpoints are evaluated off the clock. Everything lands in the run's directory, which
//! [`super::load`] reads back.

use std::{
    fs,
    io::{BufRead, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context as _};
use serde_json::{json, Value};

use super::{
    config::{Config, Placement},
    transport,
};
use crate::{
    lab::{self, Host, Lab, Reaped},
    run::workspace_root,
};

const LAB_NAME: &str = "bt";
/// Rank 0 saves its parameters this often; every configuration's loss curve gets the same
/// time resolution.
const CHECKPOINT_EVERY_S: f64 = 4.0;
/// The stop file puts the last step this far past the furthest step any rank has reported,
/// plus what [`LAG_BUDGET_S`] of steps come to. A rank begins a step only after finishing the one
/// before, which needs every rank's gradients for it, and it reports that step before it reads
/// the stop file again: so no rank has begun step m+2 unless its report of m+1 is still on its
/// way to the benchmark. Each further step of margin is one more step the benchmark may be late.
const STOP_MARGIN: u64 = 2;
const LAG_BUDGET_S: f64 = 1.0;
/// After the pass, the ranks get this long to reach the stop step; a step that outlasts it (a
/// collapsed window after the pass) is cut short: nothing after the pass is reported.
const GRACE_S: f64 = 30.0;

/// How the run's checkpoints are evaluated (none: the ranks save none).
#[derive(Clone, Copy, Debug)]
pub struct Eval {
    pub windows: u32,
    pub noise_sets: u32,
}

pub struct Spec<'a> {
    pub config: &'a Config,
    pub scenario: &'a str,
    pub repeat: usize,
    pub pass_s: f64,
    pub capacity: Option<f64>,
    /// None: no checkpoint saved or evaluated (the quick form judges steps and codecs only).
    pub eval: Option<Eval>,
    /// The congestion control every host starts with.
    pub cc: &'a str,
    pub dir: PathBuf,
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64()
}

/// Runs `spec` and leaves its files in `spec.dir`: run.json, steps.jsonl (every rank's lines),
/// evals.jsonl, lab.jsonl, transport.json, and per host the daemon's decisions and log.
pub fn run(spec: &Spec) -> anyhow::Result<()> {
    let c = spec.config;
    let dir = &spec.dir;
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // The lab outlives the pass so that the ranks' last steps still have a link; steps that
    // end after the pass are not reported.
    let running = Lab::start(
        &lab::bin("linkpilot-lab"),
        dir,
        spec.scenario,
        LAB_NAME,
        c.per_site,
        spec.pass_s.ceil() as u64 + 120,
    )?;
    let started = Instant::now();
    let mut globals = transport::Globals::apply(c.policy.as_ref(), spec.cc)?;
    transport::pin_defaults(&running.hosts, spec.cc)?;
    let mut daemons = Vec::new();
    if let Some(policy) = &c.policy {
        for h in &running.hosts {
            daemons.push(start_daemon(policy, h, spec.capacity, dir)?);
        }
    }
    let hosts = running.hosts.clone();
    let stop_file = dir.join("stop");
    let (tx, lines) = mpsc::channel();
    let world = hosts.len();
    let mut ranks: Vec<Reaped> = (0..world)
        .map(|r| start_rank(c, r, &hosts, &stop_file, dir, spec.eval.is_some(), tx.clone()))
        .collect::<anyhow::Result<_>>()?;
    drop(tx);
    // The pass ends when the lab's clock says so: its first line gives the scenario's start.
    let mut pass_end: Option<f64> = None;
    let deadline = started + Duration::from_secs_f64(spec.pass_s + 240.0);
    let mut all = Vec::new();
    let mut furthest = 0u64;
    let mut last_step_s = 1.0;
    let mut stop_at = None;
    let mut cut = None;
    let mut done = 0;
    let mut transport = json!({});
    while done < world {
        if Instant::now() >= deadline {
            bail!("the ranks did not finish in time; their logs are in {}", dir.display());
        }
        if cut.is_none() && pass_end.is_some_and(|end| unix_now() >= end + GRACE_S) {
            // A rank that already died (not the failure exit, 3, that reports a failed
            // collective) fails the run: the others are only waiting for it.
            for (r, p) in ranks.iter_mut().enumerate() {
                if let Ok(Some(s)) = p.0.try_wait() {
                    if !s.success() && s.code() != Some(3) {
                        bail!(
                            "rank {r} died ({s}) and the others waited; its log: {}",
                            dir.join(format!("rank{r}.log")).display()
                        );
                    }
                }
            }
            // Every rank still stepping is stopped now; their lines so far stand.
            for p in &mut ranks {
                let _ = p.0.kill();
            }
            cut = Some(furthest);
            break;
        }
        match lines.recv_timeout(Duration::from_millis(100)) {
            Ok(v) => {
                if v.get("done").is_some() || v.get("failed").is_some() {
                    done += 1;
                }
                if let Some(s) = v["step"].as_u64() {
                    furthest = furthest.max(s);
                    last_step_s = v["step_s"].as_f64().unwrap_or(last_step_s);
                    if s == 0 && v["rank"] == 0 && transport.get("at_first_step").is_none() {
                        transport["at_first_step"] = transport::read_back(&hosts);
                    }
                }
                all.push(v);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if pass_end.is_none() {
            pass_end = running.timeline.lock().ok().and_then(|t| {
                let v = t.first()?;
                Some(v["unix_ms"].as_f64()? / 1e3 - v["elapsed_s"].as_f64()? + spec.pass_s)
            });
        }
        // Once the pass is over, every rank stops a few steps on. The lines already received
        // are all in `furthest`: the channel is drained before the stop is written.
        if stop_at.is_none() && pass_end.is_some_and(|end| unix_now() >= end) {
            while let Ok(v) = lines.try_recv() {
                if v.get("done").is_some() || v.get("failed").is_some() {
                    done += 1;
                }
                furthest = furthest.max(v["step"].as_u64().unwrap_or(0));
                all.push(v);
            }
            let k = furthest + STOP_MARGIN + (LAG_BUDGET_S / last_step_s.max(0.05)).ceil() as u64;
            let partial = dir.join("stop.partial");
            fs::write(&partial, k.to_string())?;
            fs::rename(&partial, &stop_file)?;
            stop_at = Some(k);
            transport["at_pass_end"] = transport::read_back(&hosts);
        }
    }
    for (r, p) in ranks.iter_mut().enumerate() {
        match p.wait_until(deadline) {
            Some(s) if s.success() || s.code() == Some(3) || cut.is_some() => {}
            Some(s) => bail!(
                "rank {r} failed ({s}); its log: {}",
                dir.join(format!("rank{r}.log")).display()
            ),
            None => bail!(
                "rank {r} did not exit; its log: {}",
                dir.join(format!("rank{r}.log")).display()
            ),
        }
    }
    drop(ranks);
    // What the ranks printed last (their readers end at the pipes' close).
    while let Ok(v) = lines.recv_timeout(Duration::from_secs(5)) {
        all.push(v);
    }
    drop(daemons);
    let applied = std::mem::take(&mut globals.applied);
    drop(globals);
    let timeline = running.timeline.lock().map(|t| t.clone()).unwrap_or_default();
    drop(running);
    let failed: Vec<String> = all
        .iter()
        .filter_map(|v| v.get("failed").map(|f| format!("rank {}: {f}", v["rank"])))
        .collect();
    write_lines(&dir.join("steps.jsonl"), &all)?;
    write_lines(&dir.join("lab.jsonl"), &timeline)?;
    fs::write(dir.join("transport.json"), serde_json::to_string_pretty(&transport)?)?;
    let evals = match spec.eval {
        Some(eval) => evaluate(&dir.join("checkpoints"), eval)?,
        None => Vec::new(),
    };
    write_lines(&dir.join("evals.jsonl"), &evals)?;
    let record = json!({
        "config": c.name, "setup": c.describe(), "scenario": spec.scenario,
        "repeat": spec.repeat, "pass_s": spec.pass_s, "pass_end_unix": pass_end, "cc": spec.cc,
        "stop_at_step": stop_at, "cut_after_step": cut, "failed": failed, "applied_in_initial_namespace": applied,
        "hosts": hosts.iter().map(|h| h.netns.clone()).collect::<Vec<_>>(),
    });
    fs::write(dir.join("run.json"), serde_json::to_string_pretty(&record)?)?;
    Ok(())
}

fn write_lines(path: &Path, lines: &[Value]) -> anyhow::Result<()> {
    let text: String = lines.iter().map(|v| format!("{v}\n")).collect();
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// The checkpoints' eval losses and the eval's noise (`eval_checkpoints.py`), deleting each
/// checkpoint once evaluated.
fn evaluate(checkpoints: &Path, eval: Eval) -> anyhow::Result<Vec<Value>> {
    let script = workspace_root().join("python/benchmarks/eval_checkpoints.py");
    let out = Command::new(crate::python::python())
        .arg(script)
        .arg("--dir")
        .arg(checkpoints)
        .args(["--windows", &eval.windows.to_string()])
        .args(["--noise-sets", &eval.noise_sets.to_string(), "--delete"])
        .output()
        .context("running eval_checkpoints.py")?;
    if !out.status.success() {
        bail!(
            "evaluating {}: {}",
            checkpoints.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str(l).with_context(|| format!("eval_checkpoints.py printed {l:?}"))
        })
        .collect()
}

/// `linkpilot run` in `host`'s namespace with the policy for its site; every file it writes is
/// in `dir`, prefixed with the host.
fn start_daemon(
    policy: &super::config::Policy,
    host: &Host,
    capacity: Option<f64>,
    dir: &Path,
) -> anyhow::Result<Reaped> {
    let tag = host_tag(host);
    let policy_file = dir.join(format!("{tag}-policy.toml"));
    fs::write(&policy_file, policy.for_site(&host.site, capacity)?)?;
    let p = |f: &str| dir.join(format!("{tag}-{f}")).display().to_string();
    let child = lab::linkpilot_run(&lab::bin("linkpilot"), &host.netns, &policy_file, &p)
        // The snapshots it decided from, for `linkpilot replay`.
        .args(["--decision-log", &p("decisions.jsonl"), "--record", &p("trace.jsonl")])
        .args(["--metrics-addr", "off"])
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

/// "hk0", "us1": a host's name within the lab.
pub fn host_tag(h: &Host) -> String {
    h.netns.rsplit('-').next().unwrap_or(&h.netns).to_owned()
}

fn start_rank(
    c: &Config,
    rank: usize,
    hosts: &[Host],
    stop_file: &Path,
    dir: &Path,
    checkpoints: bool,
    lines: mpsc::Sender<Value>,
) -> anyhow::Result<Reaped> {
    // Wan: rank r on the r-th host (HK hosts first); colocated: every rank on the first host.
    let (host, master, iface) = match c.placement {
        Placement::Wan => (&hosts[rank], hosts[0].ipv4.as_str(), "eth0"),
        Placement::Colocated => (&hosts[0], "127.0.0.1", "lo"),
    };
    let world = match c.placement {
        Placement::Wan => hosts.len(),
        Placement::Colocated => 2 * usize::from(c.per_site),
    };
    let tag = host_tag(host);
    let script = workspace_root().join("python/benchmarks/train_lm.py");
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/run/netns/{}", host.netns))
        .arg(crate::python::python())
        .arg(script)
        .args(["--rank", &rank.to_string(), "--world", &world.to_string()])
        .args(["--master", &format!("{master}:29500"), "--iface", iface])
        .arg("--stop-file")
        .arg(stop_file)
        .args(["--eval-every", "0", "--all-ranks-report"])
        .args(c.rank_args(&dir.join(format!("{tag}-knobs")), &dir.join(format!("{tag}-nccl.env"))))
        .env("PYTHONUNBUFFERED", "1")
        .env("OMP_NUM_THREADS", "1")
        // Its job report goes to its host's daemon, as on a cluster (none without a daemon).
        .env("LINKPILOT_JOBS", dir.join(format!("{tag}-jobs")))
        .stdout(Stdio::piped())
        .stderr(fs::File::create(dir.join(format!("rank{rank}.log")))?);
    if checkpoints {
        cmd.args(["--checkpoint-every-s", &CHECKPOINT_EVERY_S.to_string(), "--checkpoint-dir"])
            .arg(dir.join("checkpoints"));
    }
    let mut child = cmd.spawn().context("starting a training rank")?;
    let stdout = child.stdout.take().context("rank stdout")?;
    let mut raw = fs::File::create(dir.join(format!("rank{rank}.jsonl")))?;
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = writeln!(raw, "{line}");
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if lines.send(v).is_err() {
                    break;
                }
            }
        }
    });
    Ok(Reaped(child, "a training rank"))
}
