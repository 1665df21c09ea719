//! `cargo xtask test`: the one test command, for developers and CI alike.

use std::process::Command;

use anyhow::{bail, Context as _};

use crate::{
    build_ebpf,
    run::{status, workspace_root},
    setup,
};

/// Seconds per fuzz target in the short form (8 targets).
const FUZZ_SECONDS: u64 = 10;

pub fn run(privileged: bool) -> anyhow::Result<()> {
    setup::run()?;
    let cargo = env!("CARGO");
    status("rustfmt check", Command::new(cargo).args(["fmt", "--all", "--", "--check"]))?;
    status(
        "clippy (host crates)",
        Command::new(cargo).args([
            "clippy",
            "--workspace",
            "--exclude",
            "linkpilot-ebpf",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    status(
        "clippy (eBPF crate)",
        Command::new("rustup").args([
            "run",
            "nightly",
            "cargo",
            "clippy",
            "--package",
            "linkpilot-ebpf",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--release",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    status(
        "unit tests",
        Command::new(cargo).args([
            "test",
            "--workspace",
            "--exclude",
            "linkpilot-ebpf",
            "--exclude",
            "linkpilot-tests",
        ]),
    )?;
    status(
        "building linkpilot and the NCCL tuner plugin",
        Command::new(cargo).args([
            "build",
            "--package",
            "linkpilot",
            "--package",
            "linkpilot-nccl-tuner",
        ]),
    )?;
    // The plugin as shipped (glibc 2.28): the training side's tests run against it.
    let tuner = crate::build_tuner::build().context("the shipped NCCL tuner plugin")?;
    crate::python::test(&workspace_root().join("target/debug/linkpilot"), &tuner)?;
    // Every fuzz target briefly from its seeds: a crash fails the run.
    eprintln!("test: cargo xtask fuzz --seconds {FUZZ_SECONDS}");
    crate::fuzz::run(FUZZ_SECONDS, None).context("the fuzz targets")?;
    if !privileged {
        eprintln!("test: privileged tests skipped (--no-privileged)");
        return Ok(());
    }
    if !Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n")) {
        bail!("the privileged tests need root (namespaces, eBPF); run as root or pass --no-privileged");
    }
    let object = build_ebpf::build(false)?;
    eprintln!("test: eBPF object {}", object.display());
    status(
        "building the binaries",
        // The tuner plugin: prometheus.rs loads it in a training process.
        Command::new(cargo).args([
            "build",
            "--package",
            "linkpilot-lab",
            "--package",
            "linkpilot-nccl-tuner",
        ]),
    )?;
    let target = workspace_root().join("target/debug");
    status(
        "privileged tests",
        Command::new(cargo)
            .args(["test", "--package", "linkpilot-tests", "--", "--test-threads=1"])
            .env("LINKPILOT_BIN", target.join("linkpilot"))
            .env("LINKPILOT_LAB_BIN", target.join("linkpilot-lab"))
            .env("LINKPILOT_SHIPPED_TUNER", &tuner),
    )?;
    // The reliability soak's short form: 3 SIGKILLs and restarts under traffic with a board
    // reader, and 3 minutes at 10 Hz judged on RSS growth and CPU (RELIABILITY.md), with the
    // release build: the CPU goal is for what operators run, and an unoptimised build's CPU
    // moves with the machine's speed (the same debug build: 1.1% one day, 2.0% another here).
    eprintln!("test: cargo xtask soak --quick");
    crate::soak::run(crate::soak::Args {
        quick: true,
        steps: Vec::new(),
        seed: None,
        restarts: None,
        minutes: None,
        release: true,
    })
    .context("soak --quick")?;
    // The datapath benchmark's short form: its harness runs, and the programs ran once per
    // packet iperf3 sent (bpf_stats against iperf3's count).
    eprintln!("test: cargo xtask bench-datapath --quick");
    crate::bench_datapath::run(crate::bench_datapath::Args {
        bins: Vec::new(),
        rounds: 1,
        seconds: 2,
        lab_bin: None,
        parts: Vec::new(),
        json: None,
        quick: true,
    })
    .context("bench-datapath --quick")?;
    // The streams benchmark's short form: real gloo ranks across the lab; it fails unless the
    // lab carried every exchange's bytes and none beat the round trip.
    eprintln!("test: cargo xtask bench-streams --quick");
    crate::bench_streams::run(crate::bench_streams::Args::quick())
        .context("bench-streams --quick")?;
    // The README's main command, cut short: it fails unless the daemon decided and the
    // timeline was drawn.
    eprintln!("test: cargo xtask demo --seconds 30");
    crate::demo::run(Some(30)).context("the demo")?;
    // The headline's short form: real training across the lab; it fails unless adaptive's
    // ranks follow the daemons' boards through a codec change, a hook that ignores its board
    // fails that same check, and adaptive is faster than untuned when congested.
    eprintln!("test: cargo xtask bench-training --quick");
    crate::bench_training::run(crate::bench_training::Args {
        quick: true,
        repeats: None,
        scenarios: None,
        configs: None,
        keep: false,
        resume: false,
        report_only: false,
        eval_windows: 128,
        cc: None,
    })
    .context("bench-training --quick")
}
