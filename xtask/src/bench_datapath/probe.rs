//! The programs under test: `linkpilot watch` attached in a namespace (or `linkpilot run` with a
//! policy, for the sock_ops program), the kernel's bpf_stats switched on around it, and our
//! programs' run counts and times as bpftool reports them.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::Duration,
};

use anyhow::{bail, Context as _};
use linkpilot_common::{maps::PROGRAM_NAMES, transport::PROG_SOCK_OPS};
use serde_json::Value;

use crate::lab::Reaped;

const STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Where and how `watch` attaches.
pub struct Attach {
    pub netns: String,
    pub iface: String,
    /// NAME=CIDR
    pub peer: String,
}

/// `kernel.bpf_stats_enabled=1` while alive; the old value comes back on drop.
pub struct StatsOn(String);

impl StatsOn {
    pub fn enable() -> anyhow::Result<Self> {
        let old = fs::read_to_string(STATS).with_context(|| format!("reading {STATS}"))?;
        fs::write(STATS, "1").with_context(|| format!("writing {STATS}"))?;
        Ok(Self(old.trim().to_owned()))
    }
}

impl Drop for StatsOn {
    fn drop(&mut self) {
        if let Err(e) = fs::write(STATS, &self.0) {
            eprintln!("could not restore {STATS} to {}: {e}", self.0);
        }
    }
}

/// A `linkpilot watch` (or `run`) that has attached its programs; stopped (and so detached) on
/// drop.
pub struct Watch {
    process: Reaped,
}

impl Watch {
    /// `linkpilot run` with `policy` in the namespace, its files beside `log`; returns once
    /// its board exists (written after every program is attached and the first tick decided).
    pub fn start_daemon(bin: &Path, at: &Attach, policy: &str, log: &Path) -> anyhow::Result<Self> {
        let dir = log.with_extension("d");
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let p = |f: &str| dir.join(f).display().to_string();
        fs::write(p("policy.toml"), policy)?;
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", at.netns))
            .arg(bin)
            .args(["run", "--policy", &p("policy.toml"), "--board", &p("knobs")])
            .args(["--env-file", &p("nccl.env"), "--sysctl-state", &p("sysctl.json")])
            .args(["--lock", &p("lock"), "--roce-tc-state", &p("roce-tc.json")])
            .args(["--decision-log", &p("decisions.jsonl"), "--status-socket", &p("status.sock")])
            .args(["--metrics-addr", "off", "--tuner-stats", &p("tuner")])
            .args(["--job-reports", &p("jobs")])
            .stdout(Stdio::null())
            .stderr(fs::File::create(log).with_context(|| format!("creating {}", log.display()))?)
            .spawn()
            .with_context(|| format!("starting {} run", bin.display()))?;
        let mut process = Reaped(child, "linkpilot run");
        let t = std::time::Instant::now();
        while !dir.join("knobs").exists() {
            if t.elapsed() > Duration::from_secs(20) || process.0.try_wait()?.is_some() {
                let text = fs::read_to_string(log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(5).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                bail!("{} run did not come up within 20 s:\n{}", bin.display(), tail.join("\n"));
            }
            thread::sleep(Duration::from_millis(100));
        }
        Ok(Self { process })
    }

    /// Starts the watch and returns once it printed its first line (it prints only after
    /// attaching every program), or fails with the tail of its log.
    pub fn start(bin: &Path, at: &Attach, log: &Path) -> anyhow::Result<Self> {
        let mut child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", at.netns))
            .arg(bin)
            .args(["watch", "--iface", &at.iface, "--peer", &at.peer])
            .stdout(Stdio::piped())
            .stderr(fs::File::create(log).with_context(|| format!("creating {}", log.display()))?)
            .spawn()
            .with_context(|| format!("starting {} watch", bin.display()))?;
        let stdout = child.stdout.take();
        let mut process = Reaped(child, "linkpilot watch");
        let (tx, rx) = mpsc::channel();
        if let Some(out) = stdout {
            // Drains the once-a-second table so the pipe never fills.
            thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
        }
        if rx.recv_timeout(Duration::from_secs(20)).is_err() {
            let exited = process.0.try_wait().ok().flatten();
            let text = fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(5).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!(
                "{} watch did not attach within 20 s ({}); its log {}:\n{}",
                bin.display(),
                exited.map_or("still running".into(), |s| s.to_string()),
                log.display(),
                tail.join("\n")
            );
        }
        Ok(Self { process })
    }

    /// Ids of the BPF programs this process holds (from its fds), to tell them from other
    /// processes' programs of the same name.
    pub fn prog_ids(&self) -> anyhow::Result<BTreeSet<u64>> {
        let pid = self.process.0.id();
        let mut ids = BTreeSet::new();
        for fd in fs::read_dir(format!("/proc/{pid}/fd")).context("listing the watch's fds")? {
            let name = fd?.file_name();
            let info = fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", name.to_string_lossy()))
                .unwrap_or_default();
            ids.extend(
                info.lines()
                    .filter_map(|l| l.strip_prefix("prog_id:"))
                    .filter_map(|v| v.trim().parse::<u64>().ok()),
            );
        }
        if ids.is_empty() {
            bail!("linkpilot (pid {pid}) holds no BPF programs");
        }
        Ok(ids)
    }
}

/// Run count and run time (ns) per program name, summed over its instances.
pub type Counters = BTreeMap<String, (u64, u64)>;

/// Our programs among `ids`, from `bpftool prog show --json` (it omits the figures while zero).
pub fn snapshot(ids: &BTreeSet<u64>) -> anyhow::Result<Counters> {
    let out = Command::new("bpftool")
        .args(["prog", "show", "--json"])
        .stderr(Stdio::null())
        .output()
        .context("running bpftool prog show")?;
    if !out.status.success() {
        bail!("bpftool prog show --json failed ({})", out.status);
    }
    let all: Value = serde_json::from_slice(&out.stdout).context("bpftool's JSON")?;
    let mut got = Counters::new();
    for p in all.as_array().into_iter().flatten() {
        let (Some(id), Some(name)) = (p["id"].as_u64(), p["name"].as_str()) else { continue };
        // The kernel keeps 15 characters of a program's name.
        let ours =
            PROGRAM_NAMES.iter().chain([&PROG_SOCK_OPS]).find(|n| n.get(..15).unwrap_or(n) == name);
        if let (true, Some(ours)) = (ids.contains(&id), ours) {
            let e = got.entry((*ours).to_owned()).or_default();
            e.0 += p["run_cnt"].as_u64().unwrap_or(0);
            e.1 += p["run_time_ns"].as_u64().unwrap_or(0);
        }
    }
    Ok(got)
}

/// One program over one measurement: raw deltas, and for tracepoints the background (what ran
/// while idle, scaled to the measurement's length: they see every namespace's sockets).
#[derive(Clone, Debug, Default)]
pub struct ProgDelta {
    pub cnt: u64,
    pub time_ns: u64,
    pub bg_cnt: f64,
    pub bg_time_ns: f64,
    pub seconds: f64,
}

impl ProgDelta {
    pub fn net_cnt(&self) -> f64 {
        (self.cnt as f64 - self.bg_cnt).max(0.0)
    }

    pub fn net_time_ns(&self) -> f64 {
        (self.time_ns as f64 - self.bg_time_ns).max(0.0)
    }

    pub fn json(&self) -> Value {
        serde_json::json!({
            "run_cnt": self.cnt, "run_time_ns": self.time_ns, "seconds": self.seconds,
            "background_cnt": self.bg_cnt, "background_time_ns": self.bg_time_ns,
        })
    }
}

/// `b - a` per program, with the idle rate (`idle` over `idle_s`) subtracted pro rata.
pub fn deltas(
    idle: (&Counters, &Counters, f64),
    a: &Counters,
    b: &Counters,
    seconds: f64,
) -> BTreeMap<String, ProgDelta> {
    let (i0, i1, idle_s) = idle;
    let d = |x: &Counters, y: &Counters, k: &str| {
        let (c0, t0) = x.get(k).copied().unwrap_or_default();
        let (c1, t1) = y.get(k).copied().unwrap_or_default();
        (c1.saturating_sub(c0), t1.saturating_sub(t0))
    };
    b.keys()
        .map(|k| {
            let (cnt, time_ns) = d(a, b, k);
            let (ic, it) = d(i0, i1, k);
            // Only tracepoints see other namespaces; the classifiers' idle events are ours.
            let tracepoint = !k.starts_with("lp_tc_");
            let scale = if tracepoint && idle_s > 0.0 { seconds / idle_s } else { 0.0 };
            let bg_cnt = ic as f64 * scale;
            let bg_time_ns = it as f64 * scale;
            (k.clone(), ProgDelta { cnt, time_ns, bg_cnt, bg_time_ns, seconds })
        })
        .collect()
}
