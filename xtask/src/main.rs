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
mod proc_usage;
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
    BenchTraining(bench_training::Args),
    /// Whether striping one exchange over N TCP connections makes it faster on the lab's
    /// lossy link (as root): a gloo all-reduce over N groups at once between two lab hosts,
    /// per congestion control, stream counts interleaved; results in target/bench-streams.
    BenchStreams(bench_streams::Args),
    /// What the eBPF programs cost on real traffic (as root): linkpilot builds vs no programs,
    /// interleaved round by round, over a veth pair, the WAN lab, loopback (tracepoints) and
    /// a veth pair under `linkpilot run` (sock_ops), with the kernel's bpf_stats per program.
    BenchDatapath(bench_datapath::Args),
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
        Command::BenchDatapath(args) => bench_datapath::run(args),
        Command::BenchStreams(a) => {
            bench_streams::run(if a.quick { bench_streams::Args::quick() } else { a })
        }
        Command::BenchTraining(args) => bench_training::run(args),
    }
}
