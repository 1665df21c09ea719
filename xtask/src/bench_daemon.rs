//! `cargo xtask bench-daemon`: the daemon's CPU and memory at its 10 Hz tick, idle and with
//! 10,000 active TCP flows (each sending 64 bytes a second, so every flow's RTT stays fresh),
//! measured in one run from /proc/<pid> over the same wall time. Two namespaces joined by a
//! veth pair; the release build of `linkpilot run` with a one-link policy on it.

use std::{
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

use crate::{
    proc_usage::{usage, Usage},
    run::{status, workspace_root},
};

const NS: [&str; 2] = ["lpb-daemon", "lpb-flows"];
const ADDR: [&str; 2] = ["10.213.0.1", "10.213.0.2"];

const POLICY: &str = r#"
[daemon]
tick = "100ms"
[[link]]
name = "bench"
interfaces = ["veth0"]
capacity = "10Gbit/s"
[[link.peer]]
name = "flows"
cidrs = ["10.213.0.2/32"]
[[state]]
name = "healthy"
[state.knobs]
compression = "none"
dscp = 26
roce_traffic_class = 106
[[state]]
name = "congested"
enter = { ce_fraction = "1%", retrans = "1%" }
exit = { ce_fraction = "0.2%", retrans = "0.2%" }
[state.knobs]
compression = "int8"
dscp = 26
roce_traffic_class = 106
"#;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Namespaces;

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in NS {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    status("network setup", Command::new("ip").args(args))
}

fn netns() -> anyhow::Result<Namespaces> {
    // The guard first: whatever fails below, the namespaces go.
    let guard = Namespaces;
    for ns in NS {
        let _ = Command::new("ip").args(["netns", "del", ns]).stderr(Stdio::null()).status();
        ip(&["netns", "add", ns])?;
    }
    ip(&["-n", NS[0], "link", "add", "veth0", "type", "veth", "peer", "name", "veth1"])?;
    ip(&["-n", NS[0], "link", "set", "veth1", "netns", NS[1]])?;
    for (i, (ns, dev)) in NS.iter().zip(["veth0", "veth1"]).enumerate() {
        ip(&["-n", ns, "addr", "add", &format!("{}/24", ADDR[i]), "dev", dev])?;
        ip(&["-n", ns, "link", "set", dev, "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
    }
    Ok(guard)
}

fn status_json(bin: &Path, socket: &Path) -> Option<serde_json::Value> {
    let out = Command::new(bin)
        .args(["status", "--json", "--socket", &socket.display().to_string()])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

/// CPU share of one core and RSS over `secs` seconds.
fn measure(pid: u32, bin: &Path, socket: &Path, secs: u64) -> anyhow::Result<(u64, u64, u64, u64)> {
    let c0 = usage(pid)?.cpu_s;
    let t0 = Instant::now();
    let ticks0 = status_json(bin, socket).and_then(|s| s["ticks"].as_u64()).unwrap_or(0);
    thread::sleep(Duration::from_secs(secs));
    let Usage { cpu_s: c1, rss_kib, peak_rss_kib } = usage(pid)?;
    let (rss, hwm) = (rss_kib * 1024, peak_rss_kib * 1024);
    let s = status_json(bin, socket).context("status")?;
    let ticks = s["ticks"].as_u64().unwrap_or(0).saturating_sub(ticks0);
    let flows = s["flows"].as_u64().unwrap_or(0);
    let wall = t0.elapsed().as_secs_f64();
    println!(
        "  {secs} s: {ticks} ticks ({:.1} Hz), flows tracked {flows}, CPU {:.2}% of a core, RSS {:.1} MiB (peak {:.1} MiB)",
        ticks as f64 / wall,
        (c1 - c0) / wall * 100.0,
        rss as f64 / 1048576.0,
        hwm as f64 / 1048576.0
    );
    Ok((flows, ((c1 - c0) / wall * 1e4) as u64, rss, hwm))
}

pub fn run(flows: u32, secs: u64) -> anyhow::Result<()> {
    let bin = crate::build_ebpf::release_daemon()?;
    let dir = std::env::temp_dir().join(format!("lp-bench-daemon-{}", std::process::id()));
    fs::create_dir_all(&dir)?;
    let p = |f: &str| -> PathBuf { dir.join(f) };
    fs::write(p("policy.toml"), POLICY)?;
    let _ns = netns()?;
    let script = workspace_root().join("xtask/scripts/flowgen.py");
    let in_ns = |ns: &str| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]);
        c
    };
    let mut server = Killed(
        in_ns(NS[1])
            .args(["python3", &script.display().to_string(), "server", ADDR[1], "7000"])
            .stdout(Stdio::piped())
            .spawn()
            .context("python3 flowgen.py server")?,
    );
    if let Some(out) = server.0.stdout.take() {
        BufReader::new(out).lines().next();
    }
    let daemon = Killed(
        Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", NS[0]))
            .arg(&bin)
            .args(["run", "--policy", &p("policy.toml").display().to_string()])
            .args(["--board", &p("knobs").display().to_string()])
            .args(["--env-file", &p("nccl.env").display().to_string()])
            .args(["--sysctl-state", &p("sysctl.json").display().to_string()])
            .args(["--roce-tc-state", &p("roce-tc.json").display().to_string()])
            .args(["--status-socket", &p("status.sock").display().to_string()])
            .args(["--lock", &p("lock").display().to_string()])
            .args(["--tuner-stats", &p("tuner").display().to_string()])
            .args(["--job-reports", &p("jobs").display().to_string()])
            .stdout(Stdio::null())
            .stderr(fs::File::create(p("daemon.log"))?)
            .spawn()
            .context("linkpilot run")?,
    );
    let socket = p("status.sock");
    let t = Instant::now();
    while status_json(&bin, &socket).is_none() {
        if t.elapsed() > Duration::from_secs(30) {
            bail!("the daemon did not start; see {}", p("daemon.log").display());
        }
        thread::sleep(Duration::from_millis(200));
    }
    let pid = daemon.0.id();
    println!("daemon pid {pid}, tick 100 ms; idle:");
    thread::sleep(Duration::from_secs(5));
    let idle = measure(pid, &bin, &socket, secs)?;
    let mut client = Killed(
        in_ns(NS[0])
            .args(["python3", &script.display().to_string(), "client", ADDR[1], "7000"])
            .arg(flows.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .context("python3 flowgen.py client")?,
    );
    if let Some(out) = client.0.stdout.take() {
        let line = BufReader::new(out).lines().next().transpose()?.unwrap_or_default();
        if !line.starts_with("connected") {
            bail!("the flow generator did not connect: {line:?}");
        }
    }
    println!("{flows} flows connected, each sending 64 B/s; warming up 10 s");
    thread::sleep(Duration::from_secs(10));
    let busy = measure(pid, &bin, &socket, secs)?;
    println!(
        "result: CPU {:.2}% -> {:.2}% of a core, RSS {:.1} -> {:.1} MiB with {} flows tracked (goal: < 2%, < 64 MiB)",
        idle.1 as f64 / 100.0,
        busy.1 as f64 / 100.0,
        idle.2 as f64 / 1048576.0,
        busy.2 as f64 / 1048576.0,
        busy.0
    );
    drop(client);
    drop(daemon);
    drop(server);
    let _ = fs::remove_dir_all(&dir);
    Ok(())
}
