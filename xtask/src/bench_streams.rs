//! `cargo xtask bench-streams`: does striping one exchange over N TCP connections make it
//! faster on the lab's lossy link? Two lab hosts all-reduce a buffer over N gloo groups at once
//! (`python/benchmarks/streams.py`), for each congestion control asked, every stream count
//! interleaved repeat by repeat, each exchange after an idle gap like a step's compute.
//!
//! Each host runs the static recipe's transport (ECN on, windows kept across idle gaps, 64 MiB
//! buffer ceilings) with the congestion control under test as its default. The verdict against
//! one stream is the training benchmark's: "faster" only where every repeat of N streams beat
//! every repeat of one.

use std::{
    collections::BTreeMap,
    fs,
    io::{BufRead as _, BufReader, Write as _},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use serde_json::{json, Value};

use crate::{
    bench_training::{
        stats::{Speedup, Spread},
        transport::{check_cc, pin_defaults, set_in, Globals},
    },
    lab::{in_ns, is_root, Host, Lab, Reaped},
    run::workspace_root,
};

#[derive(clap::Args)]
pub struct Args {
    /// Congestion controls to compare, each the hosts' default in turn.
    #[arg(long = "cc", value_delimiter = ',', default_value = "cubic,bbr")]
    pub ccs: Vec<String>,
    /// Stream counts; the first is the baseline of the speed-ups.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8",
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub streams: Vec<u32>,
    /// MiB per exchange.
    #[arg(long, default_value_t = 4.0)]
    pub mib: f64,
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub repeats: u32,
    /// Idle seconds before each exchange (a step's compute).
    #[arg(long, default_value_t = 1.0)]
    pub gap: f64,
    /// The lab scenario (a built-in name or a file).
    #[arg(long, default_value = "training-lossy")]
    pub scenario: String,
    /// net.ipv4.tcp_slow_start_after_idle on both hosts (0, the recipe's, keeps windows).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub slow_start_after_idle: u8,
    /// gloo: an all-reduce over N groups; tcp: the transport alone (N plain connections,
    /// the parts sent, one byte back).
    #[arg(long, default_value = "gloo", value_parser = ["gloo", "tcp"])]
    pub transport: String,
    /// The short form CI runs: cubic, 1 and 2 streams of 1 MiB twice on steady-180ms;
    /// fails unless the lab carried every exchange's bytes and none beat the round trip.
    #[arg(long, conflicts_with_all = ["ccs", "streams", "mib", "repeats", "gap", "scenario", "transport"])]
    pub quick: bool,
}

impl Args {
    /// The short form CI runs: one congestion control, 1 and 2 streams of 1 MiB twice on the
    /// calm link; it fails unless the lab carried every exchange's bytes and no exchange beat
    /// the round trip.
    pub fn quick() -> Self {
        Self {
            ccs: vec![crate::bench_training::transport::DEFAULT_CC.into()],
            streams: vec![1, 2],
            mib: 1.0,
            repeats: 2,
            gap: 0.2,
            scenario: "steady-180ms".into(),
            slow_start_after_idle: 0,
            transport: "gloo".into(),
            quick: true,
        }
    }
}

/// The recipe's host transport, per namespace (the congestion control comes from `--cc`).
const RECIPE: &[(&str, &str)] = &[
    ("net.ipv4.tcp_ecn", "1"),
    ("net.ipv4.tcp_rmem", "4096 131072 67108864"),
    ("net.ipv4.tcp_wmem", "4096 16384 67108864"),
];

pub fn run(a: Args) -> anyhow::Result<()> {
    if !is_root() {
        bail!("bench-streams builds network namespaces: run it as root");
    }
    if a.streams.is_empty() || a.ccs.is_empty() {
        bail!("--streams and --cc each need at least one value");
    }
    if !["gloo", "tcp"].contains(&a.transport.as_str()) {
        bail!("--transport {}: expected gloo or tcp", a.transport);
    }
    if !(a.mib > 0.0 && a.mib <= 1024.0 && (0.0..=60.0).contains(&a.gap)) {
        bail!("--mib must be in (0, 1024] and --gap in [0, 60] seconds");
    }
    for cc in &a.ccs {
        check_cc(cc)?;
    }
    crate::bench_training::transport::restore_interrupted()?;
    let out = workspace_root().join("target/bench-streams");
    fs::create_dir_all(&out)?;
    let rate = crate::lab::top_rate(&a.scenario)?;
    let lab =
        Lab::start(&crate::lab::bin("linkpilot-lab"), &out, &a.scenario, "streams", 1, 24 * 3600)?;
    let rtt = ping_rtt(&lab.hosts)?;
    // A two-rank all-reduce is a reduce-scatter then an all-gather, each half the buffer one
    // way: at best two one-way delays plus the whole buffer at the link's rate; the plain TCP
    // exchange is the buffer one way and a byte back, the same floor.
    let ideal = rate.map(|r| rtt + a.mib * 1_048_576.0 * 8.0 / r);
    let mut results = fs::File::create(out.join("results.jsonl"))?;
    let mut tables = Vec::new();
    for cc in &a.ccs {
        let _globals = Globals::apply(None, cc)?;
        pin_defaults(&lab.hosts, cc)?;
        let idle = a.slow_start_after_idle.to_string();
        for h in &lab.hosts {
            for (key, value) in RECIPE {
                set_in(h, key, value)?;
            }
            set_in(h, "net.ipv4.tcp_slow_start_after_idle", &idle)?;
        }
        eprintln!("bench-streams: {cc}, streams {:?}, {} MiB x {}", a.streams, a.mib, a.repeats);
        let rows = exchange(&a, &lab.hosts, &out, cc)?;
        let mut by_n: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
        for r in &rows {
            writeln!(results, "{}", json!({ "cc": cc, "row": r }))?;
            if let (Some(n), Some(s)) = (r["streams"].as_u64(), r["seconds"].as_f64()) {
                by_n.entry(n as u32).or_default().push(s);
            }
        }
        tables.push(table(cc, &a, &by_n, ideal)?);
        if a.quick {
            check(&a, &lab, &by_n, rtt)?;
        }
    }
    let text = tables.join("\n");
    fs::write(out.join("summary.md"), &text)?;
    println!("{text}");
    Ok(())
}

/// Runs both ranks (rank 0 on the Hong Kong host) and returns rank 0's rows.
fn exchange(
    a: &Args,
    hosts: &[Host],
    out: &std::path::Path,
    cc: &str,
) -> anyhow::Result<Vec<Value>> {
    let script = workspace_root().join("python/benchmarks/streams.py");
    let counts = a.streams.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let master = hosts[0].ipv4.clone();
    let mut ranks = Vec::new();
    for (rank, h) in hosts.iter().take(2).enumerate() {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", h.netns))
            .arg(crate::python::python())
            .arg(&script)
            .args(["--rank", &rank.to_string(), "--master", &master, "--streams", &counts])
            .args(["--mib", &a.mib.to_string(), "--repeats", &a.repeats.to_string()])
            .args(["--gap", &a.gap.to_string(), "--transport", &a.transport])
            .args(["--peer", &hosts[1].ipv4])
            // The lab host's name resolves to loopback: gloo must be told the interface.
            .env("GLOO_SOCKET_IFNAME", "eth0")
            .env("OMP_NUM_THREADS", "1")
            .stdout(Stdio::piped())
            .stderr(fs::File::create(out.join(format!("{cc}-rank{rank}.log")))?);
        ranks.push(Reaped(c.spawn().context("starting a streams rank")?, "a streams rank"));
    }
    let stdout = ranks[0].0.stdout.take().context("rank 0's stdout")?;
    let reader = thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| serde_json::from_str::<Value>(&l).ok())
            .inspect(|v| eprintln!("  {v}"))
            .collect::<Vec<_>>()
    });
    // Generous: a single stream of loss-based CC moves under 1 Mbit/s at 1% loss and 180 ms.
    let deadline = Instant::now() + Duration::from_secs(3600);
    for (rank, r) in ranks.iter_mut().enumerate() {
        match r.wait_until(deadline) {
            Some(s) if s.success() => {}
            Some(s) => bail!(
                "streams rank {rank} exited with {s}; see {}",
                out.join(format!("{cc}-rank{rank}.log")).display()
            ),
            None => bail!("streams rank {rank} did not finish within an hour"),
        }
    }
    reader.join().map_err(|_| anyhow::anyhow!("rank 0's reader panicked"))
}

/// The short form's oracle: the lab's own count of the bytes it carried from Hong Kong covers
/// every exchange (each sends its whole buffer each way, half per phase), every stream count
/// ran each repeat, and none finished faster than a round trip.
fn check(a: &Args, lab: &Lab, by_n: &BTreeMap<u32, Vec<f64>>, rtt: f64) -> anyhow::Result<()> {
    for &n in &a.streams {
        let got = by_n.get(&n).map_or(0, Vec::len);
        if got != a.repeats as usize {
            bail!("{n} streams: {got} exchanges timed, {} expected", a.repeats);
        }
    }
    if let Some((n, t)) =
        by_n.iter().flat_map(|(n, v)| v.iter().map(move |t| (n, *t))).find(|(_, t)| *t < rtt)
    {
        bail!("an exchange over {n} streams took {t:.3} s, less than the {rtt:.3} s round trip");
    }
    // The lab prints its counters once a second: wait for a line after the last exchange.
    thread::sleep(Duration::from_millis(1500));
    let carried = lab
        .latest
        .lock()
        .ok()
        .and_then(|m| m.get("hk_to_us").and_then(|v| v["stats"]["bytes_out"].as_u64()))
        .context("the lab printed no hk_to_us counters")?;
    let sent = a.mib * 1_048_576.0 * f64::from(a.repeats) * a.streams.len() as f64;
    if (carried as f64) < sent {
        bail!("the lab carried {carried} bytes from Hong Kong, fewer than the {sent} exchanged");
    }
    println!(
        "bench-streams --quick: {} exchanges, each at least the {rtt:.3} s round trip; \
         the lab carried {carried} bytes from Hong Kong for {sent} exchanged",
        by_n.values().map(Vec::len).sum::<usize>()
    );
    Ok(())
}

/// The lab link's round trip (ping's average of 10, seconds), which the scenario sets.
fn ping_rtt(hosts: &[Host]) -> anyhow::Result<f64> {
    let o = in_ns(&hosts[0].netns, &["ping", "-n", "-q", "-c", "10", "-i", "0.2", &hosts[1].ipv4])
        .output()
        .context("running ping in the lab")?;
    let text = String::from_utf8_lossy(&o.stdout);
    // "rtt min/avg/max/mdev = 180.1/180.3/180.6/0.2 ms"
    text.lines()
        .find_map(|l| l.split_once(" = ").filter(|(k, _)| k.contains("min/avg")))
        .and_then(|(_, v)| v.split('/').nth(1)?.parse::<f64>().ok())
        .map(|ms| ms / 1000.0)
        .with_context(|| format!("no round trip in ping's output: {text}"))
}

/// One congestion control's figures as markdown: per stream count the exchange time (median
/// and range) and the speed-up over one stream with its verdict.
fn table(
    cc: &str,
    a: &Args,
    by_n: &BTreeMap<u32, Vec<f64>>,
    ideal: Option<f64>,
) -> anyhow::Result<String> {
    let spread = |n: u32| by_n.get(&n).and_then(|v| Spread::of(v.iter().copied()));
    let first = *a.streams.first().context("no stream count")?;
    let base = spread(first).with_context(|| format!("{cc}: no exchange with {first} streams"))?;
    let mut s = format!(
        "{cc}, {} MiB {}, {} repeats, {} s idle before each, \
         tcp_slow_start_after_idle {}; RTT + bytes at the link's rate: {}\n\n\
         | streams | exchange s, median [min-max] | vs RTT + bytes/rate | speed-up vs {first} |\n\
         |---|---|---|---|\n",
        a.mib,
        if a.transport == "tcp" { "sent over plain TCP, a byte back" } else { "all-reduce (gloo)" },
        a.repeats,
        a.gap,
        a.slow_start_after_idle,
        ideal.map_or("unknown (no rate limit)".into(), |i| format!("{i:.3} s")),
    );
    for &n in &a.streams {
        let t = spread(n).with_context(|| format!("{cc}: no exchange with {n} streams"))?;
        let up = Speedup::of(base, t);
        s += &format!(
            "| {n} | {:.3} [{:.3}-{:.3}] | {} | {:.2}x [{:.2}-{:.2}] {} |\n",
            t.median,
            t.min,
            t.max,
            ideal.map_or("-".into(), |i| format!("{:.2}x", t.median / i)),
            up.median,
            up.min,
            up.max,
            up.verdict.as_str()
        );
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_compares_each_count_with_the_first_and_the_floor() {
        let a = Args { streams: vec![1, 8], repeats: 3, ..Args::quick() };
        let by_n = BTreeMap::from([(1, vec![4.0, 4.2, 4.4]), (8, vec![1.0, 1.1, 1.2])]);
        let t = table("cubic", &a, &by_n, Some(0.5)).unwrap();
        assert!(t.contains("| 1 | 4.200 [4.000-4.400] | 8.40x | 1.00x [0.91-1.10] within spread |"));
        assert!(
            t.contains("| 8 | 1.100 [1.000-1.200] | 2.20x | 3.82x [3.33-4.40] faster |"),
            "{t}"
        );
        let missing = BTreeMap::from([(1, vec![4.0])]);
        assert!(table("cubic", &a, &missing, None).unwrap_err().to_string().contains("8 streams"));
    }
}
