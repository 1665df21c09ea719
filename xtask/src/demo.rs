//! `cargo xtask demo`: the main job on a built-in default. The WAN lab plays `hk-us-day` (calm,
//! ECN congestion, jitter and spikes, loss, an outage), the daemon runs on the Hong Kong host
//! with `policies/hk-us.toml`, iperf3 drives TCP across, and the link's state and knobs are
//! shown live; at the end a summary and an SVG timeline (`target/demo/`).

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use serde_json::Value;

use crate::{
    lab::{self, in_ns, Lab, Reaped},
    run::{status, workspace_root},
};

const SCENARIO: &str = "hk-us-day";
const LAB_NAME: &str = "demo";

fn bin(name: &str) -> PathBuf {
    lab::bin(name)
}

pub fn run(seconds: Option<u64>) -> anyhow::Result<()> {
    if !lab::is_root() {
        bail!("the demo builds network namespaces and loads eBPF programs: run it as root");
    }
    crate::setup::run()?;
    for tool in ["iperf3", "nsenter", "ip", "sysctl"] {
        if !crate::run::succeeds(Command::new("sh").args(["-c", &format!("command -v {tool}")])) {
            bail!("the demo needs {tool}, which is not installed (cargo xtask setup installs it)");
        }
    }
    crate::build_ebpf::debug_binaries()?;
    let out = workspace_root().join("target/demo");
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let secs = match seconds {
        Some(s) => s,
        None => lab::pass_seconds(SCENARIO)?.ceil() as u64,
    };
    println!(
        "demo: the WAN lab plays {SCENARIO} for {secs} s; logs and results in {}",
        out.display()
    );
    let running = Lab::start(&bin("linkpilot-lab"), &out, SCENARIO, LAB_NAME, 1, secs + 30)?;
    let (hk, us) = (running.host("Hk", 0).clone(), running.host("Us", 0).clone());
    let phase = running.latest.clone();
    for h in [&hk, &us] {
        status("enable ECN", &mut in_ns(&h.netns, &["sysctl", "-qw", "net.ipv4.tcp_ecn=1"]))?;
    }
    let server = lab::iperf3_server(&us)?;
    let policy = workspace_root().join("policies/hk-us.toml");
    let p = |f: &str| out.join(f).display().to_string();
    let daemon = Reaped(
        lab::linkpilot_run(&bin("linkpilot"), &hk.netns, &policy, &p)
            .args(["--decision-log", &p("decisions.jsonl"), "--record", &p("trace.jsonl")])
            .stderr(fs::File::create(out.join("daemon.log"))?)
            .spawn()
            .context("starting linkpilot run")?,
        "linkpilot run",
    );
    let socket = out.join("status.sock");
    let start = Instant::now();
    while query(&socket).is_none() {
        if start.elapsed() > Duration::from_secs(30) {
            bail!("the daemon did not come up; see {}", out.join("daemon.log").display());
        }
        thread::sleep(Duration::from_millis(200));
    }
    let deadline = Instant::now() + Duration::from_secs(secs);
    let traffic = drive_traffic(
        hk.netns.clone(),
        us.ipv4.clone(),
        deadline,
        out.join("iperf3.log"),
        Arc::default(),
    );
    live(&socket, &phase, &out.join("decisions.jsonl"), deadline);
    let _ = traffic.join();
    drop(daemon);
    drop(server);
    drop(running);
    summary(&out, &policy)
}

/// iperf3 (CUBIC, ECN on, 4 streams paced at 37 Mbit/s) from HK to US until `deadline` (or
/// `stop`, once the running iperf3 ends), restarted if the link's outage ends a run early. Below the calm link's 200 Mbit/s, so that what the
/// daemon reacts to is the link changing, not a bulk sender filling the queue it is measuring.
pub(crate) fn drive_traffic(
    netns: String,
    server: String,
    deadline: Instant,
    log: PathBuf,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            if left < Duration::from_secs(2) {
                break;
            }
            let t = left.as_secs().to_string();
            let log = fs::OpenOptions::new().create(true).append(true).open(&log);
            let mut c = in_ns(
                &netns,
                &[
                    "iperf3",
                    "-c",
                    &server,
                    "-C",
                    "cubic",
                    "-P",
                    "4",
                    "-b",
                    "37M",
                    "--fq-rate",
                    "37M",
                    "-t",
                    &t,
                ],
            );
            c.stdout(log.map_or(Stdio::null(), Stdio::from)).stderr(Stdio::null());
            if c.status().is_err() {
                return;
            }
            thread::sleep(Duration::from_secs(1));
        }
    })
}

pub(crate) fn query(socket: &Path) -> Option<Value> {
    let out = Command::new(bin("linkpilot"))
        .args(["status", "--json", "--socket", &socket.display().to_string()])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status.success().then(|| serde_json::from_slice(&out.stdout).ok()).flatten()
}

fn mib(v: &Value) -> String {
    v.as_f64().map_or("-".into(), |b| format!("{:.0}MiB", b / 1048576.0))
}

fn ms(v: &Value) -> String {
    v.as_f64().map_or("-".into(), |m| format!("{m:.0}ms"))
}

/// One line per second: the lab's phase, the link's state, signals and knobs; and every
/// decision with its reason as it happens.
fn live(
    socket: &Path,
    phase: &Mutex<BTreeMap<String, Value>>,
    decisions: &Path,
    deadline: Instant,
) {
    println!(
        "{:>5} {:<12} {:>6} {:<10} {:>6} {:>6} {:>6} {:>6} {:>9}  {:<8} {:>6} {:>4} {:>5} {:>7}",
        "t",
        "lab phase",
        "queue",
        "state",
        "rtt",
        "p99",
        "CE%",
        "retx%",
        "goodput",
        "compress",
        "chunk",
        "IBTO",
        "wdog",
        "tcpbuf"
    );
    let start = Instant::now();
    let mut seen = 0;
    while Instant::now() < deadline {
        thread::sleep(Duration::from_secs(1));
        let lab = phase.lock().ok().and_then(|m| m.get("hk_to_us").cloned()).unwrap_or_default();
        let text = fs::read_to_string(decisions).unwrap_or_default();
        for line in text.lines().skip(seen) {
            if let Ok(d) = serde_json::from_str::<Value>(line) {
                println!(
                    "      > #{} {}: {}",
                    d["id"],
                    d["state"].as_str().unwrap_or("?"),
                    d["reason"].as_str().unwrap_or("")
                );
            }
            seen += 1;
        }
        let Some(s) = query(socket) else { continue };
        let l = &s["links"][0];
        let (g, k) = (&l["signals"], &l["knobs"]);
        println!(
            "{:>4}s {:<12} {:>6} {:<10} {:>6} {:>6} {:>5.2}% {:>5.2}% {:>5.0}Mb/s  {:<8} {:>6} {:>4} {:>4}s {:>7}",
            start.elapsed().as_secs(),
            lab["phase"].as_str().unwrap_or("?"),
            lab["stats"]["queue_delay_ns"].as_f64().map_or("-".into(), |q| format!("{:.0}ms", q / 1e6)),
            l["state"].as_str().unwrap_or("?"),
            ms(&g["rtt_ms"]),
            ms(&g["rtt_p99_ms"]),
            g["ce_fraction"].as_f64().unwrap_or(0.0) * 100.0,
            g["retrans"].as_f64().unwrap_or(0.0) * 100.0,
            g["goodput_bps"].as_f64().unwrap_or(0.0) / 1e6,
            k["compression"].as_str().unwrap_or("?"),
            mib(&k["chunk_bytes"]),
            k["nccl_ib_timeout"],
            k["watchdog_s"],
            mib(&k["tcp_buffer_bytes"]),
        );
    }
}

/// Time in each state, knob ranges, the decision count, and the SVG timeline (a replay of the
/// recorded trace through the same policy: the core is deterministic, so it draws what ran).
fn summary(out: &Path, policy: &Path) -> anyhow::Result<()> {
    let trace = out.join("trace.jsonl");
    let svg = out.join("timeline.svg");
    status(
        "timeline",
        Command::new(bin("linkpilot"))
            .args(["replay", &trace.display().to_string()])
            .args(["--policy", &policy.display().to_string()])
            .args(["--plot", &svg.display().to_string()])
            .stdout(fs::File::create(out.join("replay.txt"))?),
    )?;
    let end_ms = fs::read_to_string(&trace)?
        .lines()
        .last()
        .and_then(|l| serde_json::from_str::<Value>(l).ok())
        .and_then(|v| v["at_ms"].as_u64())
        .unwrap_or(0);
    let decisions: Vec<Value> = fs::read_to_string(out.join("decisions.jsonl"))?
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let mut in_state: BTreeMap<String, u64> = BTreeMap::new();
    for (i, d) in decisions.iter().enumerate() {
        let from = d["at_ms"].as_u64().unwrap_or(0);
        let to = decisions.get(i + 1).and_then(|n| n["at_ms"].as_u64()).unwrap_or(end_ms);
        *in_state.entry(d["state"].as_str().unwrap_or("?").to_owned()).or_default() +=
            to.saturating_sub(from);
    }
    let range = |key: &str| {
        let v: Vec<u64> = decisions.iter().filter_map(|d| d["knobs"][key].as_u64()).collect();
        (v.iter().min().copied().unwrap_or(0), v.iter().max().copied().unwrap_or(0))
    };
    let compressions: Vec<&str> = {
        let mut c: Vec<&str> =
            decisions.iter().filter_map(|d| d["knobs"]["compression"].as_str()).collect();
        c.dedup();
        c
    };
    println!("\n== summary ({:.0} s of trace, {} decisions)", end_ms as f64 / 1e3, decisions.len());
    for (state, ms) in &in_state {
        println!("  {state:<10} {:>6.1} s", *ms as f64 / 1e3);
    }
    let (c0, c1) = range("chunk_bytes");
    let (t0, t1) = range("nccl_ib_timeout");
    let (w0, w1) = range("watchdog_s");
    let (b0, b1) = range("tcp_buffer_bytes");
    println!("  compression   {}", compressions.join(" -> "));
    println!("  chunk         {} .. {} MiB", c0 >> 20, c1 >> 20);
    println!("  NCCL_IB_TIMEOUT {t0} .. {t1}");
    println!("  watchdog      {w0} .. {w1} s");
    println!("  tcp buffers   {} .. {} MiB", b0 >> 20, b1 >> 20);
    println!("  timeline      {}", svg.display());
    println!("  decisions     {}", out.join("decisions.jsonl").display());
    println!("  trace         {} (linkpilot replay reads it)", trace.display());
    // The first decision ("start in ...") needs no traffic; one made from measurements does.
    if !decisions.iter().any(|d| !d["reason"].as_str().unwrap_or("").starts_with("start in")) {
        bail!(
            "the daemon decided nothing from measurements: did traffic flow? see {} and {}",
            out.join("daemon.log").display(),
            out.join("iperf3.log").display()
        );
    }
    Ok(())
}
