//! `cargo xtask bench-datapath`: what linkpilot's eBPF programs cost on real traffic. Several
//! linkpilot builds and "none" (no programs) are measured in one run, interleaved round by round
//! so the machine's noise hits all alike, and the kernel's bpf_stats give each program's own run
//! time per invocation over the same traffic. Parts: a bare veth pair, the WAN lab, the
//! tracepoints' cost per event over loopback, and the sock_ops program under `linkpilot run`.

mod probe;
mod report;
mod traffic;

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use serde_json::Value;

use crate::{lab, run::workspace_root};
use probe::{Attach, ProgDelta};
use traffic::{ip, iperf_client, iperf_server, num, EchoServer, Netns};

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Part {
    Veth,
    Lab,
    Tracepoints,
    SockOps,
}

#[derive(clap::Args)]
pub struct Args {
    /// A linkpilot binary to compare: NAME=PATH (repeat; default
    /// current=target/release/linkpilot).
    #[arg(long = "bin", value_name = "NAME=PATH", value_parser = parse_bin)]
    pub bins: Vec<(String, PathBuf)>,
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub rounds: u32,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub seconds: u64,
    /// The linkpilot-lab binary (default target/release/linkpilot-lab).
    #[arg(long)]
    pub lab_bin: Option<PathBuf>,
    /// A subset of the parts (default all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub parts: Vec<Part>,
    /// Write every measurement's raw figures here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The short form CI runs: the debug build, veth and tracepoints, one 2 s round; fails
    /// unless the programs ran once per packet iperf3 sent and per segment received.
    #[arg(long, conflicts_with_all = ["rounds", "seconds", "parts"])]
    pub quick: bool,
}

/// `NAME=PATH` of `--bin`.
pub fn parse_bin(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((n, p)) if !n.is_empty() && n != "none" && !p.is_empty() => {
            Ok((n.to_owned(), PathBuf::from(p)))
        }
        _ => Err(format!("{s:?}: expected NAME=PATH (NAME not empty, not \"none\")")),
    }
}

/// "none" (no programs) or a linkpilot binary: `watch`, or `run` with a policy.
pub struct Config {
    pub name: String,
    pub bin: Option<PathBuf>,
    pub policy: Option<String>,
}

/// One measurement. The first metric is the rate compared against "none".
pub struct Sample {
    pub part: &'static str,
    pub test: &'static str,
    pub config: String,
    pub round: u32,
    pub metrics: Vec<(&'static str, f64)>,
    pub progs: BTreeMap<String, ProgDelta>,
    /// The metrics of the run the program figures come from (round 1).
    pub profiled: Metrics,
}

type Metrics = Vec<(&'static str, f64)>;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: nix::libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Ctrl-C or SIGTERM ends the run between measurements, so the guards tear everything down.
fn catch_signals() -> anyhow::Result<()> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(SigHandler::Handler(on_signal), SaFlags::empty(), SigSet::empty());
    for s in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { sigaction(s, &action) }.context("installing a signal handler")?;
    }
    Ok(())
}

fn check_stop() -> anyhow::Result<()> {
    if STOP.load(Ordering::Relaxed) {
        bail!("interrupted");
    }
    Ok(())
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

fn preflight(parts: &[Part], configs: &[Config], lab_bin: &Path) -> anyhow::Result<()> {
    if !lab::is_root() {
        bail!("bench-datapath builds network namespaces and loads eBPF programs: run it as root");
    }
    for tool in ["iperf3", "bpftool", "nsenter", "ip", "ss"] {
        if !on_path(tool) {
            bail!(
                "bench-datapath needs {tool}, which is not on PATH (cargo xtask setup installs it)"
            );
        }
    }
    for c in configs {
        if let Some(b) = c.bin.as_ref().filter(|b| !b.is_file()) {
            bail!("--bin {}: {} does not exist", c.name, b.display());
        }
    }
    if parts.contains(&Part::Lab) && !lab_bin.is_file() {
        bail!("--lab-bin: {} does not exist", lab_bin.display());
    }
    Ok(())
}

pub fn run(mut args: Args) -> anyhow::Result<()> {
    let root = workspace_root();
    if args.quick {
        (args.rounds, args.seconds) = (1, 2);
        args.parts = vec![Part::Veth, Part::Tracepoints];
    }
    let mut bins = args.bins.clone();
    if bins.is_empty() {
        let profile = if args.quick { "debug" } else { "release" };
        bins.push(("current".into(), root.join(format!("target/{profile}/linkpilot"))));
    }
    let mut configs = vec![Config { name: "none".into(), bin: None, policy: None }];
    for (name, bin) in bins {
        if configs.iter().any(|c| c.name == name) {
            bail!("--bin {name} is given twice");
        }
        configs.push(Config { name, bin: Some(bin), policy: None });
    }
    let lab_bin = args.lab_bin.clone().unwrap_or_else(|| root.join("target/release/linkpilot-lab"));
    let parts = if args.parts.is_empty() {
        vec![Part::Veth, Part::Lab, Part::Tracepoints, Part::SockOps]
    } else {
        args.parts.clone()
    };
    preflight(&parts, &configs, &lab_bin)?;
    catch_signals()?;
    let out = root.join("target/bench-datapath");
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let ctx = Ctx { configs, rounds: args.rounds, secs: args.seconds, out: out.clone() };
    println!(
        "bench-datapath: {} x {} rounds x {} s per measurement; logs in {}",
        ctx.configs.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join("/"),
        ctx.rounds,
        ctx.secs,
        out.display()
    );
    let mut samples = Vec::new();
    let mut failed = Vec::new();
    for part in parts {
        let got = match part {
            Part::Veth => veth(&ctx, &mut samples),
            Part::Lab => lab_part(&ctx, &lab_bin, &mut samples),
            Part::Tracepoints => tracepoints(&ctx, &mut samples),
            Part::SockOps => sock_ops(&ctx, &mut samples),
        };
        if let Err(e) = got {
            let part = format!("{part:?}").to_lowercase();
            eprintln!("part {part} failed: {e:#}");
            failed.push(part);
            if STOP.load(Ordering::Relaxed) {
                break;
            }
        }
    }
    report::print(&samples);
    if let Some(path) = &args.json {
        let v = report::json(&ctx, &samples);
        fs::write(path, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("raw figures: {}", path.display());
    }
    if !failed.is_empty() {
        bail!("part(s) {} failed (see above)", failed.join(", "));
    }
    if args.quick {
        check_counts(&samples)?;
    }
    Ok(())
}

/// The quick form's oracle: in the profiled run, the egress classifier ran once per packet
/// iperf3 says it sent (plus a few of iperf3's control connection), and tcp_probe at least once
/// per request/response transaction (each end receives a segment).
fn check_counts(samples: &[Sample]) -> anyhow::Result<()> {
    let profiled = |part: &'static str, test: &'static str| {
        samples.iter().filter(move |s| s.part == part && s.test == test && !s.progs.is_empty())
    };
    let metric = |s: &Sample, k: &str| s.profiled.iter().find(|m| m.0 == k).map(|m| m.1);
    let mut checked = 0;
    for s in profiled("veth", "udp") {
        let sent = metric(s, "tx_packets").context("tx_packets")?;
        let ran = s.progs.get("lp_tc_egress").map_or(0.0, |d| d.cnt as f64);
        println!("quick: {}: lp_tc_egress ran {ran:.0} times for {sent:.0} packets sent", s.config);
        if !(sent > 1000.0 && ran >= sent * 0.99 && ran <= sent * 1.05 + 200.0) {
            bail!("{}: lp_tc_egress ran {ran:.0} times for {sent:.0} UDP packets", s.config);
        }
        checked += 1;
    }
    for s in profiled("tracepoints", "rr") {
        let txns = metric(s, "txn_s").context("txn_s")? * s.progs_seconds();
        let ran = s.progs.get("lp_tcp_probe").map_or(0.0, |d| d.net_cnt());
        println!("quick: {}: lp_tcp_probe ran {ran:.0} times for {txns:.0} transactions", s.config);
        if !(txns > 100.0 && ran >= txns * 0.9) {
            bail!("{}: lp_tcp_probe ran {ran:.0} times for {txns:.0} transactions", s.config);
        }
        checked += 1;
    }
    if checked == 0 {
        bail!("no profiled measurement to check");
    }
    Ok(())
}

impl Sample {
    /// Seconds of the profiled run.
    fn progs_seconds(&self) -> f64 {
        self.progs.values().map(|d| d.seconds).fold(0.0, f64::max)
    }
}

pub struct Ctx {
    pub configs: Vec<Config>,
    pub rounds: u32,
    pub secs: u64,
    out: PathBuf,
}

/// Idle time with the programs attached, to measure the background (other namespaces' TCP).
const IDLE: Duration = Duration::from_secs(1);

/// Runs `traffic` once for `cfg`: bare for "none", else with its watch attached on `at`. The
/// rates come from a run with bpf_stats off (it times every program run, two clock reads that
/// cost more than our TC programs themselves); with `profile`, a second run with bpf_stats on
/// gives each program's own figures.
fn measure(
    ctx: &Ctx,
    cfg: &Config,
    at: &Attach,
    traffic: &mut dyn FnMut() -> anyhow::Result<Metrics>,
    profile: bool,
) -> anyhow::Result<(Metrics, BTreeMap<String, ProgDelta>, Metrics)> {
    check_stop()?;
    thread::sleep(Duration::from_millis(300));
    let Some(bin) = &cfg.bin else { return Ok((traffic()?, BTreeMap::new(), Vec::new())) };
    let log = ctx.out.join(format!("watch-{}.log", cfg.name));
    let watch = match &cfg.policy {
        Some(policy) => probe::Watch::start_daemon(bin, at, policy, &log)?,
        None => probe::Watch::start(bin, at, &log)?,
    };
    let rates = traffic()?;
    if !profile {
        return Ok((rates, BTreeMap::new(), Vec::new()));
    }
    check_stop()?;
    let _stats = probe::StatsOn::enable()?;
    let ids = watch.prog_ids()?;
    let i0 = probe::snapshot(&ids)?;
    let t = Instant::now();
    thread::sleep(IDLE);
    let i1 = probe::snapshot(&ids)?;
    let idle_s = t.elapsed().as_secs_f64();
    let a = probe::snapshot(&ids)?;
    let t = Instant::now();
    let profiled = traffic()?;
    let b = probe::snapshot(&ids)?;
    let secs = t.elapsed().as_secs_f64();
    drop(watch);
    Ok((rates, probe::deltas((&i0, &i1, idle_s), &a, &b, secs), profiled))
}

/// One round after another; in each, every test for every configuration in turn.
fn rounds(
    ctx: &Ctx,
    part: &'static str,
    at: &Attach,
    tests: &mut [(&'static str, &mut dyn FnMut() -> anyhow::Result<Metrics>)],
    samples: &mut Vec<Sample>,
) -> anyhow::Result<()> {
    for round in 1..=ctx.rounds {
        for (test, traffic) in tests.iter_mut() {
            for cfg in &ctx.configs {
                let (metrics, progs, profiled) = measure(ctx, cfg, at, &mut **traffic, round == 1)
                    .with_context(|| format!("{part} {test} {} round {round}", cfg.name))?;
                let (k, v) = metrics.first().copied().unwrap_or(("?", 0.0));
                println!("  {part} round {round} {test:<6} {:<10} {k} {v:.4}", cfg.name);
                samples.push(Sample {
                    part,
                    test,
                    config: cfg.name.clone(),
                    round,
                    metrics,
                    progs,
                    profiled,
                });
            }
        }
    }
    Ok(())
}

fn udp_metrics(v: &Value) -> anyhow::Result<Metrics> {
    let secs = num(v, &["end", "sum", "seconds"])?.max(1e-9);
    let sent = num(v, &["end", "sum", "packets"])?;
    let lost = num(v, &["end", "sum", "lost_packets"])?;
    Ok(vec![
        ("rx_pps", (sent - lost) / secs),
        ("tx_pps", sent / secs),
        ("loss_pct", num(v, &["end", "sum", "lost_percent"])?),
        ("tx_packets", sent),
    ])
}

fn tcp_gbit(v: &Value) -> anyhow::Result<f64> {
    Ok(num(v, &["end", "sum_received", "bits_per_second"])? / 1e9)
}

/// Two new namespaces joined by a veth pair, each end (namespace, device, address/prefix) up.
fn veth_pair(a: (&str, &str, &str), b: (&str, &str, &str)) -> anyhow::Result<Netns> {
    let ns = Netns::create(&[a.0, b.0])?;
    ip(&["-n", a.0, "link", "add", a.1, "type", "veth", "peer", "name", b.1])?;
    ip(&["-n", a.0, "link", "set", b.1, "netns", b.0])?;
    for (netns, dev, addr) in [a, b] {
        ip(&["-n", netns, "addr", "add", addr, "dev", dev])?;
        ip(&["-n", netns, "link", "set", dev, "up"])?;
    }
    Ok(ns)
}

/// iperf3's CPU arguments for the client and the server: CPUs of their own where there are
/// two. The sender's CPU carries the whole kernel path (the veth hands the packet to the
/// peer's stack in its softirq), so its packet rate is what the programs' cost shows in, and
/// pinning halves the spread.
fn pinned() -> (&'static [&'static str], &'static [&'static str]) {
    if thread::available_parallelism().is_ok_and(|n| n.get() >= 2) {
        (&["-A", "0"], &["-A", "1"])
    } else {
        (&[], &[])
    }
}

/// Two namespaces joined by a veth pair, no delay; programs on the sender's side.
fn veth(ctx: &Ctx, samples: &mut Vec<Sample>) -> anyhow::Result<()> {
    println!("part veth: lpd-a 198.18.77.1 -> lpd-b 198.18.77.2");
    let _ns =
        veth_pair(("lpd-a", "lpd-va", "198.18.77.1/24"), ("lpd-b", "lpd-vb", "198.18.77.2/24"))?;
    let (client_cpu, server_cpu) = pinned();
    let _server = iperf_server("lpd-b", "198.18.77.2", server_cpu)?;
    let at =
        Attach { netns: "lpd-a".into(), iface: "lpd-va".into(), peer: "b=198.18.77.0/24".into() };
    let s = ctx.secs.to_string();
    let mut udp = || {
        let a = [&["-c", "198.18.77.2", "-u", "-b", "0", "-l", "1472", "-t", &s], client_cpu];
        udp_metrics(&iperf_client("lpd-a", &a.concat(), ctx.secs)?)
    };
    let mut tcp = || {
        let a = [&["-c", "198.18.77.2", "-t", &s], client_cpu].concat();
        Ok(vec![("gbit_s", tcp_gbit(&iperf_client("lpd-a", &a, ctx.secs)?)?)])
    };
    rounds(ctx, "veth", &at, &mut [("udp", &mut udp), ("tcp", &mut tcp)], samples)
}

/// The WAN lab's steady-180ms, one lab for all rounds; iperf3 from the HK host to the US host
/// with the programs on the HK host's eth0.
fn lab_part(ctx: &Ctx, lab_bin: &Path, samples: &mut Vec<Sample>) -> anyhow::Result<()> {
    let per = ctx.secs + 15;
    let lab_secs = u64::from(ctx.rounds) * ctx.configs.len() as u64 * per + 60;
    println!("part lab: steady-180ms for up to {lab_secs} s (namespaces lpl-lpd-*)");
    let running = lab::Lab::start(lab_bin, &ctx.out, "steady-180ms", "lpd", 1, lab_secs)?;
    let (hk, us) = (running.host("Hk", 0).clone(), running.host("Us", 0).clone());
    let net = us.ipv4.rsplit_once('.').map(|(n, _)| n).context("the US host's address")?;
    let _server = iperf_server(&us.netns, &us.ipv4, &[])?;
    let at =
        Attach { netns: hk.netns.clone(), iface: "eth0".into(), peer: format!("us={net}.0/24") };
    let s = ctx.secs.to_string();
    let mut tcp = || {
        let v = iperf_client(&hk.netns, &["-c", &us.ipv4, "-C", "cubic", "-t", &s], ctx.secs)?;
        Ok(vec![("gbit_s", tcp_gbit(&v)?)])
    };
    rounds(ctx, "lab", &at, &mut [("tcp", &mut tcp)], samples)
}

/// Over loopback in lpd-t. The watched interface is one end of a veth pair (this kernel has no
/// dummy devices) holding the address the traffic uses: the daemon's local-address map knows
/// it, the traffic itself goes over lo, so the classifiers see none of it and the rate
/// difference is the tracepoints' alone.
fn tracepoints(ctx: &Ctx, samples: &mut Vec<Sample>) -> anyhow::Result<()> {
    const ADDR: &str = "198.18.78.1";
    println!("part tracepoints: lpd-t, {ADDR} on veth lpd-t0, traffic over lo");
    let _ns = Netns::create(&["lpd-t"])?;
    ip(&["-n", "lpd-t", "link", "add", "lpd-t0", "type", "veth", "peer", "name", "lpd-t1"])?;
    ip(&["-n", "lpd-t", "addr", "add", &format!("{ADDR}/32"), "dev", "lpd-t0"])?;
    for dev in ["lpd-t0", "lpd-t1"] {
        ip(&["-n", "lpd-t", "link", "set", dev, "up"])?;
    }
    // The connect/close loop leaves a TIME_WAIT per connection: reuse them, more ports.
    for kv in ["net.ipv4.tcp_tw_reuse=1", "net.ipv4.ip_local_port_range=1024 65535"] {
        let st = traffic::in_ns("lpd-t", "sysctl").args(["-qw", kv]).status()?;
        if !st.success() {
            bail!("sysctl -w {kv} in lpd-t failed");
        }
    }
    let _iperf = iperf_server("lpd-t", ADDR, &[])?;
    let echo = EchoServer::start("lpd-t", ADDR)?;
    let at = Attach { netns: "lpd-t".into(), iface: "lpd-t0".into(), peer: format!("p={ADDR}/24") };
    let (rr, crr, secs) = (echo.rr, echo.crr, ctx.secs);
    let mut pingpong = || {
        let (n, t) = traffic::request_response("lpd-t", rr, secs)?;
        Ok(vec![("txn_s", n as f64 / t)])
    };
    let mut connect = || {
        let (n, t) = traffic::connect_close("lpd-t", crr, secs)?;
        Ok(vec![("conn_s", n as f64 / t)])
    };
    let s = secs.to_string();
    let mut bulk =
        || Ok(vec![("gbit_s", tcp_gbit(&iperf_client("lpd-t", &["-c", ADDR, "-t", &s], secs)?)?)]);
    let mut tests: [(&'static str, &mut dyn FnMut() -> anyhow::Result<Metrics>); 3] =
        [("rr", &mut pingpong), ("crr", &mut connect), ("bulk", &mut bulk)];
    rounds(ctx, "tracepoints", &at, &mut tests, samples)
}

/// The daemon's policy for the sock_ops part: the veth's peer on one link, and with `profile`
/// a transport profile that asks for what the kernel already does (CUBIC, the host default
/// here), so TCP behaves the same and only the program's work differs.
fn sock_ops_policy(profile: bool) -> String {
    let mut p = String::from(
        "[[link]]\nname = \"veth\"\ninterfaces = [\"lpd-sa0\"]\ncapacity = \"10Gbit/s\"\n\
         [[link.peer]]\nname = \"b\"\ncidrs = [\"198.18.79.0/24\"]\n\
         [[state]]\nname = \"healthy\"\n[state.knobs]\ncompression = \"none\"\n",
    );
    if profile {
        p += "[state.transport]\ncongestion_control = \"cubic\"\n";
    }
    p
}

/// What the sock_ops program costs per TCP callback (mostly the RTT callback, once per ACK that
/// gives an RTT sample): TCP over a veth pair with `linkpilot run` on the sender's side, once
/// with a transport profile for the peer (the program attached to the cgroup root, every
/// connection to the peer managed) and once without (no program), against no daemon.
fn sock_ops(ctx: &Ctx, samples: &mut Vec<Sample>) -> anyhow::Result<()> {
    println!("part sock-ops: lpd-sa 198.18.79.1 -> lpd-sb 198.18.79.2, linkpilot run");
    let _ns = veth_pair(
        ("lpd-sa", "lpd-sa0", "198.18.79.1/24"),
        ("lpd-sb", "lpd-sb0", "198.18.79.2/24"),
    )?;
    let (client_cpu, server_cpu) = pinned();
    let _server = iperf_server("lpd-sb", "198.18.79.2", server_cpu)?;
    let at =
        Attach { netns: "lpd-sa".into(), iface: "lpd-sa0".into(), peer: "b=198.18.79.0/24".into() };
    let mut configs = vec![Config { name: "none".into(), bin: None, policy: None }];
    for c in ctx.configs.iter().filter(|c| c.bin.is_some()) {
        for (suffix, profile) in [("run", false), ("run+sock_ops", true)] {
            configs.push(Config {
                name: format!("{}-{suffix}", c.name),
                bin: c.bin.clone(),
                policy: Some(sock_ops_policy(profile)),
            });
        }
    }
    let ctx = Ctx { configs, rounds: ctx.rounds, secs: ctx.secs, out: ctx.out.clone() };
    let s = ctx.secs.to_string();
    let mut tcp = || {
        let a = [&["-c", "198.18.79.2", "-C", "cubic", "-t", &s], client_cpu].concat();
        Ok(vec![("gbit_s", tcp_gbit(&iperf_client("lpd-sa", &a, ctx.secs)?)?)])
    };
    rounds(&ctx, "sock-ops", &at, &mut [("tcp", &mut tcp)], samples)
}
