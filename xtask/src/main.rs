//! Project automation: `cargo xtask setup | build-ebpf | test | fuzz | demo | bench-daemon |
//! bench-training | bench-datapath | bench-streams`.

mod bench_daemon;
mod bench_datapath;
mod bench_streams;
mod bench_training;
mod build_ebpf;
mod build_portable;
mod build_tuner;
mod demo;
mod fuzz;
mod lab;
mod python;
mod run;
mod setup;
mod soak;
mod test;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "linkpilot project automation")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what a fresh machine lacks (idempotent; seconds when everything is present).
    Setup,
    /// Build the eBPF object (through the controller's build script) and print its path.
    BuildEbpf {
        /// Build the release profile of the controller.
        #[arg(long)]
        release: bool,
    },
    /// Build the NCCL tuner plugin as shipped (against glibc 2.28, with cargo-zigbuild), check
    /// the glibc versions it needs, and print its path.
    BuildTuner,
    /// Build the daemon for glibc 2.28 userlands (cargo-zigbuild, without libibverbs), check
    /// the glibc versions and libraries it needs, and print its path (target/portable/linkpilot).
    BuildPortable,
    /// The main job on a built-in default: the WAN lab plays hk-us-day, the daemon tunes the
    /// Hong Kong side with policies/hk-us.toml under real TCP traffic (as root).
    Demo {
        /// Stop after this many seconds instead of one pass of the scenario.
        #[arg(long, value_parser = clap::value_parser!(u64).range(10..))]
        seconds: Option<u64>,
    },
    /// The daemon's CPU and RSS at its 10 Hz tick, idle and with many active TCP flows (as root).
    BenchDaemon {
        #[arg(long, default_value_t = 10_000)]
        flows: u32,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
    },
    /// Real DDP training across the WAN lab: untuned vs the static hand-tuning vs linkpilot
    /// adaptive vs fixed codecs (the per-phase oracle); results in target/bench-training (root).
    BenchTraining {
        /// The short form CI runs: training-quick, static-bbr vs adaptive, a hook that ignores
        /// its board and the shipped policy pinned to no compression, once, no checkpoint
        /// evaluated; fails unless adaptive's ranks follow the boards through a codec change
        /// (and the ignoring hook fails that check), and adaptive is faster than static-bbr
        /// when congested (and the pinned policy is not).
        #[arg(long)]
        quick: bool,
        /// Runs per configuration, interleaved round-robin (default: 3; quick: 1).
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=20))]
        repeats: Option<u16>,
        /// Lab scenarios (built-in names or files; default: training-day and the held-out
        /// training-holdout; quick: training-quick).
        #[arg(long = "scenario", value_delimiter = ',')]
        scenarios: Option<Vec<String>>,
        /// A subset of configurations, e.g. untuned,adaptive (default: each scenario's set).
        #[arg(long, value_delimiter = ',')]
        configs: Option<Vec<String>>,
        /// Keep the earlier runs of configurations not run now and report them too (to re-run
        /// one configuration after a policy change).
        #[arg(long, requires = "configs")]
        keep: bool,
        /// Go on with an interrupted benchmark of the same plan (scenarios, configurations,
        /// repeats): keeps every run that finished and runs the others.
        #[arg(long, conflicts_with = "keep")]
        resume: bool,
        /// Only summarize the runs already in target/bench-training.
        #[arg(long, conflicts_with_all = ["repeats", "configs", "keep", "resume"])]
        report_only: bool,
        /// Held-out windows per evaluation of a checkpoint (the quick form evaluates none).
        #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=512))]
        eval_windows: u32,
        /// The congestion control every lab host starts with (default cubic, the common
        /// distribution default); results of another go to target/bench-training-CC.
        #[arg(long)]
        cc: Option<String>,
    },
    /// Whether striping one exchange over N TCP connections makes it faster on the lab's
    /// lossy link (as root): a gloo all-reduce over N groups at once between two lab hosts,
    /// per congestion control, stream counts interleaved; results in target/bench-streams.
    BenchStreams(bench_streams::Args),
    /// What the eBPF programs cost on real traffic (as root): linkpilot builds vs no programs,
    /// interleaved round by round, over a veth pair, the WAN lab, loopback (tracepoints) and
    /// a veth pair under `linkpilot run` (sock_ops), with the kernel's bpf_stats per program.
    BenchDatapath {
        /// A linkpilot binary to compare: NAME=PATH (repeat; default
        /// current=target/release/linkpilot).
        #[arg(long = "bin", value_name = "NAME=PATH", value_parser = bench_datapath::parse_bin)]
        bins: Vec<(String, std::path::PathBuf)>,
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=50))]
        rounds: u32,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=300))]
        seconds: u64,
        /// The linkpilot-lab binary (default target/release/linkpilot-lab).
        #[arg(long)]
        lab_bin: Option<std::path::PathBuf>,
        /// A subset of the parts (default all).
        #[arg(long, value_enum, value_delimiter = ',')]
        parts: Vec<bench_datapath::Part>,
        /// Write every measurement's raw figures here.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
        /// The short form CI runs: the debug build, veth and tracepoints, one 2 s round; fails
        /// unless the programs ran once per packet iperf3 sent and per segment received.
        #[arg(long, conflicts_with_all = ["rounds", "seconds", "parts"])]
        quick: bool,
    },
    /// The coverage-guided fuzz targets (fuzz/: cargo-fuzz on nightly, and atheris for the
    /// Python env-file loader), each for a while from the committed seeds; fails on a crash,
    /// naming the input.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Only this target.
        #[arg(long)]
        target: Option<String>,
    },
    /// The daemon on the WAN lab with traffic for longer than a test (as root): `kill`
    /// (SIGKILL it every 10-30 s for 10 restarts) and `day` (an hour at 10 Hz against the
    /// looping hk-us-day, RSS and CPU sampled every minute); results in target/soak.
    Soak {
        /// The short form CI runs: 3 restarts 3-6 s apart, and 3 minutes sampled every 5 s.
        #[arg(long)]
        quick: bool,
        /// Only these steps.
        #[arg(long, value_enum, value_delimiter = ',')]
        steps: Vec<soak::Step>,
        /// Seed of the kill step's random gaps (default: from the clock; printed either way).
        #[arg(long)]
        seed: Option<u64>,
        /// Restarts in the kill step (default 10, or 3 with --quick).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        restarts: Option<u32>,
        /// Minutes of the day step (default 60, or 3 with --quick).
        #[arg(long, value_parser = clap::value_parser!(u64).range(2..))]
        minutes: Option<u64>,
        /// Run the daemon's release build (what operators run) rather than the debug build.
        #[arg(long)]
        release: bool,
    },
    /// Setup, then fmt check, clippy, unit tests and (as root) the privileged tests.
    Test {
        /// Skip the privileged tests (they need root: namespaces, eBPF).
        #[arg(long)]
        no_privileged: bool,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Setup => setup::run(),
        Command::BuildEbpf { release } => {
            let path = build_ebpf::build(release)?;
            println!("{}", path.display());
            Ok(())
        }
        Command::BuildTuner => {
            println!("{}", build_tuner::build()?.display());
            Ok(())
        }
        Command::BuildPortable => {
            println!("{}", build_portable::build()?.display());
            Ok(())
        }
        Command::Soak { quick, steps, seed, restarts, minutes, release } => {
            soak::run(soak::Args { quick, steps, seed, restarts, minutes, release })
        }
        Command::Test { no_privileged } => test::run(!no_privileged),
        Command::Fuzz { seconds, target } => {
            setup::run()?;
            fuzz::run(seconds, target.as_deref()).map(drop)
        }
        Command::Demo { seconds } => demo::run(seconds),
        Command::BenchDaemon { flows, seconds } => bench_daemon::run(flows, seconds),
        Command::BenchDatapath { bins, rounds, seconds, lab_bin, parts, json, quick } => {
            bench_datapath::run(bench_datapath::Args {
                bins,
                rounds,
                seconds,
                lab_bin,
                parts,
                json,
                quick,
            })
        }
        Command::BenchStreams(a) => {
            bench_streams::run(if a.quick { bench_streams::Args::quick() } else { a })
        }
        Command::BenchTraining {
            quick,
            repeats,
            scenarios,
            configs,
            keep,
            resume,
            report_only,
            eval_windows,
            cc,
        } => bench_training::run(bench_training::Args {
            quick,
            repeats: repeats.map(usize::from),
            scenarios,
            configs,
            keep,
            resume,
            report_only,
            eval_windows,
            cc,
        }),
    }
}
