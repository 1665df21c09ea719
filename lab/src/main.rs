//! `linkpilot-lab`: run the WAN lab, check scenario files, clean up, self-test, benchmark.

use std::{process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use linkpilot_lab::{
    lab::{cleanup_stale, Lab, LabConfig},
    scenario::{Direction, Scenario, BUILTIN},
};
use nix::sys::signal::{SigSet, Signal};

#[derive(Parser)]
#[command(
    name = "linkpilot-lab",
    version,
    about = "Two data centers and a long-haul link on one machine"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build the lab and run a scenario until Ctrl-C/SIGTERM (or --duration).
    Run {
        /// A built-in scenario name or a scenario file.
        #[arg(long, default_value = "steady-180ms")]
        scenario: String,
        /// Lab name (part of every namespace name).
        #[arg(long, default_value = "lab")]
        name: String,
        /// Hosts per site.
        #[arg(long, default_value_t = 1)]
        hosts: u8,
        /// Stop after this many seconds.
        #[arg(long)]
        duration: Option<u64>,
        /// Print the ground-truth counters as JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Validate a scenario file (or built-in name); exit status 1 on error.
    Check { scenario: String },
    /// List the built-in scenarios.
    List,
    /// Delete what a crashed run of lab NAME left behind.
    Cleanup {
        #[arg(long, default_value = "lab")]
        name: String,
    },
    /// Check the lab's fidelity with ping, iperf3 and tshark, and print the figures.
    Selftest,
    /// Measure the highest packet rate the delay line sustains and its scheduling error.
    Bench {
        /// Seconds per offered rate.
        #[arg(long, default_value_t = 3)]
        seconds: u64,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run { scenario, name, hosts, duration, json } => {
            let scenario = Scenario::load(&scenario)?;
            // Block the stop signals in every thread; the main thread takes them with sigwait.
            let mut signals = SigSet::empty();
            signals.add(Signal::SIGINT);
            signals.add(Signal::SIGTERM);
            signals.thread_block().context("blocking signals")?;
            let lab = Lab::start(
                LabConfig { name, hosts_per_site: hosts, ..LabConfig::default() },
                scenario,
            )?;
            for h in lab
                .hosts(linkpilot_lab::lab::Site::Hk)
                .chain(lab.hosts(linkpilot_lab::lab::Site::Us))
            {
                eprintln!("host {:?} netns {} {} {} {}", h.site, h.netns, h.iface, h.ipv4, h.ipv6);
            }
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(signals.wait());
            });
            let deadline = duration.map(Duration::from_secs);
            loop {
                if rx.recv_timeout(Duration::from_secs(1)).is_ok() {
                    break;
                }
                if print_stats(&lab, json).is_err() {
                    break; // stdout closed: stop and tear down rather than panic
                }
                if deadline.is_some_and(|d| lab.elapsed() >= d) {
                    break;
                }
            }
            drop(lab);
            Ok(())
        }
        Command::Check { scenario } => {
            let s = Scenario::load(&scenario)?;
            // The best rate any phase gives: what a policy for this lab declares as capacity.
            let top = s
                .phases
                .iter()
                .flat_map(|p| [&p.hk_to_us, &p.us_to_hk])
                .filter_map(|l| l.rate.map(|r| r.at(0.0).0.max(r.at(1.0).0)))
                .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))));
            let rate = top.map_or("unlimited rate".to_owned(), |r| format!("up to {r:.0} bit/s"));
            println!(
                "OK: {} ({} phases, {:.1} s per pass, {rate})",
                s.name,
                s.phases.len(),
                s.duration().0 as f64 / 1e9
            );
            Ok(())
        }
        Command::List => {
            for (name, _) in BUILTIN {
                let s = Scenario::load(name)?;
                println!("{name:<16} {}", s.description);
            }
            Ok(())
        }
        Command::Cleanup { name } => {
            let deleted = cleanup_stale(&name)?;
            println!("removed {} namespace(s) {deleted:?}", deleted.len());
            Ok(())
        }
        Command::Selftest => linkpilot_lab::selftest::run_all(),
        Command::Bench { seconds } => linkpilot_lab::bench::run(seconds),
    }
}

fn print_stats(lab: &Lab, json: bool) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    for dir in Direction::BOTH {
        let s = lab.stats(dir);
        let phase = lab.scenario.phases.get(s.phase as usize).map_or("?", |p| p.name.as_str());
        if json {
            let unix_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            let line = serde_json::json!({ "elapsed_s": lab.elapsed().as_secs_f64(), "unix_ms": unix_ms, "direction": dir.name(), "phase": phase, "stats": s });
            writeln!(out, "{line}")?;
        } else {
            writeln!(
                out,
                "{:>7.1}s {:<8} {:<12} in {:>9} out {:>9} drop loss/queue/aqm/outage {}/{}/{}/{} CE {} queue {:.1}ms",
                lab.elapsed().as_secs_f64(),
                dir.name(),
                phase,
                s.packets_in,
                s.packets_out,
                s.drops_loss,
                s.drops_queue,
                s.drops_aqm,
                s.drops_outage,
                s.ce_marked,
                s.queue_delay_ns as f64 / 1e6
            )?;
        }
    }
    Ok(())
}
