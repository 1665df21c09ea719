//! Fidelity checks of the lab against tools we did not write: ping, iperf3, tcpdump and tshark.
//! `linkpilot-lab selftest` runs them all and prints the figures; the privileged integration
//! tests run each one and assert it passed.

use std::{
    io::Read,
    process::{Child, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _};

use crate::{
    lab::{Host, Lab, LabConfig},
    scenario::{Direction, Scenario},
};

/// The outcome of one check: what was measured against what was configured.
#[derive(Debug, Clone)]
pub struct Figure {
    pub check: &'static str,
    pub measured: String,
    pub expected: String,
    pub pass: bool,
}

impl std::fmt::Display for Figure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verdict = if self.pass { "PASS" } else { "FAIL" };
        write!(
            f,
            "{verdict} {:<11} measured {}; expected {}",
            self.check, self.measured, self.expected
        )
    }
}

fn lab(name: &str, scenario_toml: &str) -> anyhow::Result<Lab> {
    let scenario = Scenario::parse(scenario_toml, &format!("<selftest {name}>"), None)?;
    Ok(Lab::start(LabConfig { name: name.into(), ..LabConfig::default() }, scenario)?)
}

fn hosts(lab: &Lab) -> (Host, Host) {
    lab.hk_us()
}

fn one_phase(link: &str) -> String {
    format!("name = \"selftest\"\n[[phase]]\nname = \"only\"\nduration = \"10min\"\n[phase.link]\n{link}\n")
}

/// ping's average RTT at low load is the configured RTT within 2% + 1 ms.
pub fn rtt() -> anyhow::Result<Figure> {
    let lab = lab("strtt", &one_phase("delay = \"90ms\"\nrate = \"200Mbit/s\"\nqueue = \"5MiB\""))?;
    let (hk, us) = hosts(&lab);
    let out = hk.exec(&["ping", "-q", "-c", "20", "-i", "0.2", &us.ipv4.to_string()])?;
    let avg = parse_ping_avg(&out).with_context(|| format!("no RTT in ping's output:\n{out}"))?;
    let configured = 180.0;
    let tolerance = configured * 0.02 + 1.0;
    Ok(Figure {
        check: "rtt",
        measured: format!("ping avg {avg:.3} ms"),
        expected: format!("{configured} ms ± {tolerance:.1} ms"),
        pass: (avg - configured).abs() <= tolerance,
    })
}

/// Parses "rtt min/avg/max/mdev = 180.2/180.7/181.0/0.3 ms".
pub fn parse_ping_avg(out: &str) -> Option<f64> {
    let line = out.lines().find(|l| l.contains("min/avg/max"))?;
    line.split('=').nth(1)?.trim().split('/').nth(1)?.parse().ok()
}

/// iperf3 TCP throughput across a 200 Mbit/s, 180 ms RTT link is within 10% of 200 Mbit/s, with
/// socket buffers sized for the bandwidth-delay product (4.5 MB) and CUBIC. (BBR, this kernel's
/// default, empties the pipe for PROBE_RTT every 10 s and so measures ~5% below the link.)
pub fn throughput() -> anyhow::Result<Figure> {
    let lab =
        lab("sttput", &one_phase("delay = \"90ms\"\nrate = \"200Mbit/s\"\nqueue = \"5MiB\""))?;
    let (hk, us) = hosts(&lab);
    for h in [&hk, &us] {
        h.exec(&[
            "sysctl",
            "-qw",
            "net.ipv4.tcp_rmem=4096 131072 33554432",
            "net.ipv4.tcp_wmem=4096 16384 33554432",
        ])?;
    }
    let mut server =
        spawn_quiet(us.command("iperf3").args(["-s", "-1", "-B", &us.ipv4.to_string()]))?;
    thread::sleep(Duration::from_millis(500));
    // Slow start at 180 ms RTT overshoots the queue once; measure the 15 s after it.
    let out = hk.exec(&[
        "iperf3",
        "-c",
        &us.ipv4.to_string(),
        "-C",
        "cubic",
        "-t",
        "25",
        "-O",
        "10",
        "-J",
    ]);
    let _ = server.kill();
    let _ = server.wait();
    let json: serde_json::Value = serde_json::from_str(&out?).context("iperf3 -J output")?;
    let bps = json["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .context("no sum_received in iperf3 JSON")?;
    let configured = 200e6;
    Ok(Figure {
        check: "throughput",
        measured: format!("iperf3 {:.1} Mbit/s", bps / 1e6),
        expected: format!("{:.0} Mbit/s ± 10%", configured / 1e6),
        pass: (bps - configured).abs() <= configured * 0.1,
    })
}

fn spawn_quiet(cmd: &mut std::process::Command) -> anyhow::Result<Child> {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))
}

/// CE marks seen by tcpdump on the receiving host, counted with tshark, equal the lab's count.
pub fn ce_marks() -> anyhow::Result<Figure> {
    let lab = lab(
        "stecn",
        &one_phase("delay = \"10ms\"\nrate = \"50Mbit/s\"\nqueue = \"2MiB\"\necn = { mode = \"step\", threshold = \"5ms\" }"),
    )?;
    let (hk, us) = hosts(&lab);
    for h in [&hk, &us] {
        h.exec(&["sysctl", "-qw", "net.ipv4.tcp_ecn=1"])?;
    }
    let pcap = std::env::temp_dir().join(format!("linkpilot-lab-ce-{}.pcap", std::process::id()));
    let pcap_s = pcap.display().to_string();
    // Only CE-marked IPv4 packets from the HK host, snapped short, so the capture keeps up.
    let filter = format!("src host {} and ip[1] & 3 = 3", hk.ipv4);
    let dump = start_capture(&us, &filter, &pcap_s)?;
    let mut server =
        spawn_quiet(us.command("iperf3").args(["-s", "-1", "-B", &us.ipv4.to_string()]))?;
    thread::sleep(Duration::from_millis(300));
    let run = hk.exec(&["iperf3", "-c", &us.ipv4.to_string(), "-t", "5", "-P", "2"]);
    let _ = server.wait();
    thread::sleep(Duration::from_millis(500)); // the last marked packets are 10 ms away
    let lab_ce = lab.stats(Direction::HkToUs).ce_marked;
    let dropped = stop_capture(dump)?;
    run?;
    let fields = crate::cmd::run(&[
        "tshark",
        "-r",
        &pcap_s,
        "-Y",
        "ip.dsfield.ecn == 3",
        "-T",
        "fields",
        "-e",
        "frame.number",
    ])?;
    let _ = std::fs::remove_file(&pcap);
    let seen = fields.lines().filter(|l| !l.trim().is_empty()).count() as u64;
    ensure!(dropped == 0, "tcpdump dropped {dropped} packets; the count is unreliable");
    Ok(Figure {
        check: "ce-marks",
        measured: format!("tshark counted {seen} CE packets"),
        expected: format!("the lab's CE counter, {lab_ce} (> 0)"),
        pass: seen == lab_ce && lab_ce > 0,
    })
}

/// Starts tcpdump on `host`'s eth0 writing packets that match `filter` (headers only) to `pcap`,
/// and returns once it is listening. Immediate mode: without it libpcap hands packets over in
/// ring-buffer blocks, and the last partial block is lost, uncounted, when tcpdump is stopped.
pub fn start_capture(host: &Host, filter: &str, pcap: &str) -> anyhow::Result<Child> {
    let mut dump = host
        .command("tcpdump")
        .args(["-i", "eth0", "-n", "-s", "96", "--immediate-mode", "-U", "-w", pcap, filter])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting tcpdump")?;
    wait_for_listening(&mut dump)?;
    Ok(dump)
}

fn wait_for_listening(dump: &mut Child) -> anyhow::Result<()> {
    let stderr = dump.stderr.as_mut().context("tcpdump stderr")?;
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if stderr.read(&mut byte)? == 0 {
            bail!("tcpdump exited: {}", String::from_utf8_lossy(&seen));
        }
        seen.push(byte[0]);
        if seen.ends_with(b"\n") && String::from_utf8_lossy(&seen).contains("listening on") {
            return Ok(());
        }
    }
    bail!("tcpdump did not start listening within 10 s")
}

/// Stops tcpdump with SIGINT and returns how many packets it says the kernel dropped.
pub fn stop_capture(mut dump: Child) -> anyhow::Result<u64> {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(dump.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )?;
    let mut rest = String::new();
    if let Some(mut e) = dump.stderr.take() {
        e.read_to_string(&mut rest)?;
    }
    dump.wait()?;
    let dropped = rest
        .lines()
        .find(|l| l.contains("dropped by kernel"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    Ok(dropped)
}

/// Loss measured by ping over 10,000 echo requests matches the configured 2% Bernoulli loss of
/// one direction, within 4 standard deviations, and equals the lab's own drop count.
pub fn loss() -> anyhow::Result<Figure> {
    let toml = "name = \"selftest\"\n[[phase]]\nname = \"only\"\nduration = \"10min\"\n[phase.link]\ndelay = \"10ms\"\n\
                [phase.hk_to_us]\nloss = { model = \"bernoulli\", rate = \"2%\" }\n";
    let lab = lab("stloss", toml)?;
    let (hk, us) = hosts(&lab);
    let n = 10_000u64;
    let out = crate::cmd::in_ns_any_status(
        &hk.netns,
        &["ping", "-q", "-c", &n.to_string(), "-i", "0.001", "-W", "2", &us.ipv4.to_string()],
    )?;
    let received =
        parse_ping_received(&out).with_context(|| format!("no counts in ping's output:\n{out}"))?;
    let lost = n - received;
    let link = lab.stats(Direction::HkToUs);
    let lab_lost = link.drops_loss;
    // Anything else that crossed (the odd IPv6 control packet) may have been lost too.
    let others = link.packets_in.saturating_sub(n);
    let p = 0.02;
    let sigma = (p * (1.0 - p) / n as f64).sqrt();
    let measured = lost as f64 / n as f64;
    Ok(Figure {
        check: "loss",
        measured: format!(
            "ping lost {lost}/{n} = {:.2}%, lab dropped {lab_lost}",
            measured * 100.0
        ),
        expected: format!(
            "2% ± {:.2}% (4 sigma); lab drops = ping losses (+ up to {others} other packets)",
            4.0 * sigma * 100.0
        ),
        pass: (measured - p).abs() <= 4.0 * sigma && (lost..=lost + others).contains(&lab_lost),
    })
}

/// Parses "10000 packets transmitted, 9801 received".
pub fn parse_ping_received(out: &str) -> Option<u64> {
    let line = out.lines().find(|l| l.contains("packets transmitted"))?;
    line.split(',').nth(1)?.split_whitespace().next()?.parse().ok()
}

/// During a 2 s outage phase nothing gets through: the longest silence between ping replies
/// (requests every 10 ms, reply times from `ping -D`) spans the outage, give or take one RTT and
/// one ping interval.
pub fn outage() -> anyhow::Result<Figure> {
    let toml = "name = \"selftest\"\n\
        [[phase]]\nname = \"before\"\nduration = \"2s\"\n[phase.link]\ndelay = \"20ms\"\n\
        [[phase]]\nname = \"down\"\nduration = \"2s\"\n[phase.link]\ndown = true\n\
        [[phase]]\nname = \"after\"\nduration = \"10min\"\n[phase.link]\ndelay = \"20ms\"\n";
    let lab = lab("stout", toml)?;
    let (hk, us) = hosts(&lab);
    let out = crate::cmd::in_ns_any_status(
        &hk.netns,
        &["ping", "-D", "-c", "400", "-i", "0.01", "-W", "1", &us.ipv4.to_string()],
    )?;
    let times = parse_reply_times(&out);
    ensure!(times.len() > 50, "ping got too few replies to judge:\n{out}");
    let gap_s = times.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
    let (lo, hi) = (2.0 - 0.05, 2.0 + 0.04 + 0.05);
    Ok(Figure {
        check: "outage",
        measured: format!("longest silence between replies {gap_s:.3} s"),
        expected: format!("{lo:.2} to {hi:.2} s"),
        pass: (lo..=hi).contains(&gap_s),
    })
}

/// Receive times of ping replies from `ping -D` lines "[1795973775.123456] 64 bytes from ...".
pub fn parse_reply_times(out: &str) -> Vec<f64> {
    out.lines()
        .filter(|l| l.contains("bytes from"))
        .filter_map(|l| l.strip_prefix('[')?.split(']').next()?.parse().ok())
        .collect()
}

/// A fidelity check.
pub type Check = fn() -> anyhow::Result<Figure>;

/// Runs every check and prints its figure; fails if any check failed.
pub fn run_all() -> anyhow::Result<()> {
    let checks: [(&str, Check); 5] = [
        ("rtt", rtt),
        ("throughput", throughput),
        ("ce-marks", ce_marks),
        ("loss", loss),
        ("outage", outage),
    ];
    let mut failed = Vec::new();
    for (name, check) in checks {
        match check() {
            Ok(f) => {
                println!("{f}");
                if !f.pass {
                    failed.push(name);
                }
            }
            Err(e) => {
                println!("FAIL {name:<11} {e:#}");
                failed.push(name);
            }
        }
    }
    ensure!(failed.is_empty(), "failed: {}", failed.join(", "));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ping() {
        let out = "--- 198.18.2.10 ping statistics ---\n10000 packets transmitted, 9801 received, 1.99% packet loss, time 10s\n\
                   rtt min/avg/max/mdev = 180.266/180.708/181.032/0.263 ms\n";
        assert_eq!(parse_ping_received(out), Some(9801));
        assert_eq!(parse_ping_avg(out), Some(180.708));
        assert_eq!(parse_ping_avg("nothing"), None);
        let d = "[1795973775.250000] 64 bytes from 198.18.2.10: icmp_seq=1 ttl=62 time=40.1 ms\n\
                 [1795973777.300000] 64 bytes from 198.18.2.10: icmp_seq=130 ttl=62 time=40.2 ms\n";
        assert_eq!(parse_reply_times(d), vec![1795973775.25, 1795973777.3]);
    }
}
