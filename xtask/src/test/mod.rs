//! `cargo xtask test`: the one test command, for developers and CI alike. The workspace is built
//! once (debug, every target) and every step after it uses that build; the Rust tests run under
//! cargo-nextest, the privileged ones side by side (`privileged.rs`). Every step is timed: the
//! table is printed when the run ends, pass or fail, and written to `target/test-timings.json`.
//! A run must leave the work tree as it found it (`tree.rs`).

mod privileged;
mod timing;
mod tree;

use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

use crate::{
    build_ebpf::{self, Built, PREBUILT},
    run::{status, workspace_root},
    setup,
};

/// Where the timing table goes as JSON.
pub const TIMINGS: &str = "target/test-timings.json";

pub fn run(privileged: bool) -> anyhow::Result<()> {
    let tree = tree::Snapshot::take()?;
    let mut suite = timing::Suite::default();
    let outcome = steps(&mut suite, privileged);
    let reported = suite.report(&workspace_root().join(TIMINGS));
    outcome?;
    reported?;
    tree.unchanged()
}

fn steps(suite: &mut timing::Suite, privileged: bool) -> anyhow::Result<()> {
    let python = suite.step("setup (the virtualenv goes on in the background)", setup::start)?;
    let cargo = env!("CARGO");
    suite.step("rustfmt check", || {
        status("rustfmt check", Command::new(cargo).args(["fmt", "--all", "--", "--check"]))
    })?;
    // Every target of every host crate, debug, once: the tests, the binaries the lab tests,
    // benchmarks and demo run, and the eBPF object the controller embeds.
    let built = suite.step("build (debug, every target)", || {
        build_ebpf::cargo_build(
            &["--workspace", "--exclude", "linkpilot-ebpf", "--all-targets"],
            &[],
        )
    })?;
    let object = built.ebpf_object.clone().context("the build did not build the controller")?;
    build_ebpf::mark_workspace_built();
    // The checks reuse the object rather than build it once more (a check build runs build
    // scripts too).
    let reuse = [(PREBUILT, object.clone())];
    suite.step("clippy (host crates)", || {
        status(
            "clippy (host crates)",
            Command::new(cargo)
                .args(["clippy", "--workspace", "--exclude", "linkpilot-ebpf", "--all-targets"])
                .args(["--", "-D", "warnings"])
                .envs(reuse.iter().map(|(k, v)| (k, v))),
        )
    })?;
    suite.step("clippy (eBPF crate)", || {
        status(
            "clippy (eBPF crate)",
            // A target directory of its own: `--release` puts its host artifacts in
            // target/release, whose lock the daemon's release build holds meanwhile.
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
                "--target-dir",
                "target/clippy-ebpf",
                "--",
                "-D",
                "warnings",
            ]),
        )
    })?;
    // nextest comes with the virtualenv.
    suite.step("setup: the virtualenv (what is left of it)", || setup::finish(python))?;
    suite.step("unit tests and fuzz seeds", || {
        privileged::nextest(&["not package(linkpilot-tests)"], None, &[])
    })?;
    // The plugin as shipped (glibc 2.28): the training side's tests run against it.
    let tuner = suite.step("NCCL tuner plugin (glibc 2.28)", crate::build_tuner::build)?;
    // The release daemon the soak runs is the portable one (glibc 2.28, no libibverbs), checked
    // for its glibc symbol versions and libraries once built: it goes on in the background from
    // here (after the plugin, whose target directory and zig cache it shares), embedding the
    // object built above, at full priority: it ends during the side-by-side lab tests, so the
    // soak's day (which mostly waits) runs beside them or pytest rather than after both. (At
    // nice 10 it ended with pytest and the suite took about 3 minutes more; its starving the
    // daemons' starts no longer fails a test, which judges a start by the daemon's own time.)
    let release = privileged.then(|| {
        let log = workspace_root().join("target/portable-build.log");
        crate::build_portable::in_background(vec![(PREBUILT, object.clone())], log)
    });
    let linkpilot = built.bin("linkpilot")?;
    suite.step("mypy (python/)", crate::python::mypy)?;
    let pytest = || crate::python::pytest(&linkpilot, &tuner);
    if !privileged {
        suite.step("pytest (python/)", pytest)?;
        eprintln!("test: privileged tests skipped (--no-privileged)");
        suite.skip("privileged steps (--no-privileged)");
        return Ok(());
    }
    if !crate::lab::is_root() {
        bail!("the privileged tests need root (namespaces, eBPF); run as root or pass --no-privileged");
    }
    let env = lab_env(&built, &tuner)?;
    let release = release.context("the release build was not started")?;
    // Beside the lab tests, which mostly wait, the checks a busier machine cannot pass wrongly,
    // on two threads: the streams benchmark's and the demo's quick forms, one after the other;
    // and, once the release build is done (the lab tests leave it most of the CPU), the soak's
    // compressed day, whose figures are the daemon's own (its CPU seconds, its resident memory,
    // its tick count), beside the lab tests or pytest, whichever runs then.
    let quick_forms = std::thread::spawn(|| {
        // The streams benchmark's short form: real gloo ranks across the lab; it fails unless
        // the lab carried every exchange's bytes and none beat the round trip.
        let t = Instant::now();
        let streams = crate::bench_streams::run(crate::bench_streams::Args::quick());
        let streams = (t.elapsed(), streams);
        // The README's main command, cut short: it fails unless the daemon decided and the
        // timeline was drawn.
        let t = Instant::now();
        let demo = crate::demo::run(Some(30));
        (streams, (t.elapsed(), demo))
    });
    let soak_day = std::thread::spawn(move || {
        let t = Instant::now();
        let built =
            release.join().map_err(|_| anyhow::anyhow!("the release build's thread panicked"));
        let built = (t.elapsed(), built.and_then(|b| b));
        if built.1.is_err() {
            return (built, (Duration::ZERO, Ok(())));
        }
        // The reliability soak's compressed day, short: 3 minutes at 10 Hz judged on RSS
        // growth, CPU and tick rate (RELIABILITY.md), with the release build: the CPU goal is
        // for what operators run, and an unoptimised build's CPU moves with the machine's speed
        // (the same debug build: 1.1% one day, 2.0% another here).
        let t = Instant::now();
        let day = soak(crate::soak::Step::Day);
        (built, (t.elapsed(), day))
    });
    let side_by_side = suite.step("lab tests, side by side", || privileged::side_by_side(&env));
    let ((streams_took, streams), (demo_took, demo)) = quick_forms
        .join()
        .map_err(|_| anyhow::anyhow!("the quick forms beside the lab tests panicked"))?;
    let streams =
        suite.beside("bench-streams --quick (beside the lab tests)", streams_took, streams);
    let demo = suite.beside("demo --seconds 30 (beside the lab tests)", demo_took, demo);
    // pytest after the lab tests: the soak's day, once the release build is done, runs beside
    // whichever of them runs then, not after both.
    let pytest = suite.step("pytest (python/)", pytest);
    let ((built_took, built), (day_took, day)) = soak_day
        .join()
        .map_err(|_| anyhow::anyhow!("the soak's day beside the lab tests panicked"))?;
    let built = suite.beside(
        "portable release build of the daemon (glibc 2.28; beside; the wait for it)",
        built_took,
        built,
    );
    let day = suite.beside("soak --quick: the day (beside lab tests or pytest)", day_took, day);
    side_by_side?;
    streams?;
    demo?;
    pytest?;
    built?;
    day?;
    suite.step("lab tests, one at a time", || privileged::alone(&env))?;
    // The soak's kill cycle, short: 3 SIGKILLs and restarts under traffic with a board reader
    // that times how soon the board goes stale and fresh again, so on a machine left quiet.
    suite.step("soak --quick: the kill cycle", || soak(crate::soak::Step::Kill))?;
    // The datapath benchmark's short form: its harness runs, and the programs ran once per
    // packet iperf3 sent (bpf_stats against iperf3's count).
    suite.step("bench-datapath --quick", || {
        crate::bench_datapath::run(crate::bench_datapath::Args {
            bins: Vec::new(),
            rounds: 1,
            seconds: 2,
            lab_bin: None,
            parts: Vec::new(),
            json: None,
            quick: true,
        })
    })?;
    // The headline's short form: real training across the lab; it fails unless adaptive's
    // ranks follow the daemons' boards through a codec change, a hook that ignores its board
    // fails that same check, adaptive is faster than the strongest fixed baseline (static-bbr)
    // when congested, and the same policy pinned to no compression fails that same bar.
    suite.step("bench-training --quick", || {
        crate::bench_training::run(crate::bench_training::Args {
            quick: true,
            repeats: None,
            scenarios: None,
            configs: None,
            keep: false,
            resume: false,
            report_only: false,
            // Unused: the quick form saves and evaluates no checkpoint.
            eval_windows: 16,
            cc: None,
            reference_batch: None,
        })
    })
}

/// One step of `soak --quick`, on the release build.
fn soak(step: crate::soak::Step) -> anyhow::Result<()> {
    crate::soak::run(crate::soak::Args {
        quick: true,
        steps: vec![step],
        seed: None,
        restarts: None,
        minutes: None,
        release: true,
    })
}

/// What the privileged tests are told: the binaries under test and the shipped plugin.
fn lab_env(built: &Built, tuner: &std::path::Path) -> anyhow::Result<Vec<(&'static str, PathBuf)>> {
    Ok(vec![
        ("LINKPILOT_BIN", built.bin("linkpilot")?),
        ("LINKPILOT_LAB_BIN", built.bin("linkpilot-lab")?),
        ("LINKPILOT_SHIPPED_TUNER", tuner.to_owned()),
    ])
}
