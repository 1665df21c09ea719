//! `cargo xtask fuzz`: the coverage-guided fuzz targets of `fuzz/` (cargo-fuzz, libFuzzer, on
//! nightly) and the Python env-file target (atheris), each for a while, starting from the seeds
//! committed in `fuzz/seeds/<target>` (read only: new inputs go to `fuzz/corpus/<target>`).
//! Fails on the first crash, naming the input that caused it. Run on purpose (before a release,
//! after a parser changes); `cargo xtask test` runs every seed once as a plain test instead.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{bail, Context as _};

use crate::run::{status, workspace_root};

/// The cargo-fuzz targets (fuzz/fuzz_targets/NAME.rs), then the Python one.
pub const RUST_TARGETS: &[&str] = &[
    "policy",
    "scenario",
    "replay_trace",
    "packet",
    "tuner_decision",
    "tuner_stats",
    "job_report",
    "status_request",
];
pub const PYTHON_TARGETS: &[&str] = &["envfile"];

/// libFuzzer's runtime, which the fuzz package links only when asked (its seeds' test needs none).
const FEATURES: [&str; 2] = ["--features", "libfuzzer"];

/// An input that takes longer than this is a hang, reported as a failure.
const INPUT_TIMEOUT_S: u64 = 10;

/// What one target's run did.
pub struct Outcome {
    pub runs: u64,
    pub seconds: f64,
    /// Inputs in the corpus libFuzzer kept (`corp:` of its last line).
    pub corpus: u64,
}

/// Builds every target, then runs `only` (or all) for `seconds` each.
pub fn run(seconds: u64, only: Option<&str>) -> anyhow::Result<Vec<Outcome>> {
    let all: Vec<&str> = RUST_TARGETS.iter().chain(PYTHON_TARGETS).copied().collect();
    if let Some(t) = only {
        if !all.contains(&t) {
            bail!("no fuzz target {t:?}; the targets are {}", all.join(", "));
        }
    }
    let started = Instant::now();
    crate::setup::cargo_fuzz().context("installing cargo-fuzz")?;
    status(
        "building the fuzz targets",
        Command::new("rustup").args(["run", "nightly", "cargo", "fuzz", "build"]).args(FEATURES),
    )?;
    eprintln!("fuzz: targets built in {:.0} s", started.elapsed().as_secs_f64());
    let mut out = Vec::new();
    for target in all.into_iter().filter(|t| only.is_none_or(|o| o == *t)) {
        let o = run_one(target, seconds)?;
        eprintln!(
            "fuzz: {target}: {} executions in {:.0} s ({:.0}/s), corpus {} inputs",
            o.runs,
            o.seconds,
            o.runs as f64 / o.seconds.max(1e-9),
            o.corpus
        );
        out.push(o);
    }
    eprintln!("fuzz: every target ran {seconds} s without a crash");
    Ok(out)
}

fn run_one(target: &str, seconds: u64) -> anyhow::Result<Outcome> {
    let fuzz = workspace_root().join("fuzz");
    let corpus = fuzz.join("corpus").join(target);
    let artifacts = fuzz.join("artifacts").join(target);
    let seeds = fuzz.join("seeds").join(target);
    for d in [&corpus, &artifacts] {
        fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let log = fuzz.join("artifacts").join(format!("{target}.log"));
    let flags = [
        format!("-max_total_time={seconds}"),
        format!("-timeout={INPUT_TIMEOUT_S}"),
        format!("-artifact_prefix={}/", artifacts.display()),
        "-print_final_stats=1".to_owned(),
    ];
    let mut cmd = if PYTHON_TARGETS.contains(&target) {
        let mut c = Command::new(crate::python::python());
        c.arg(fuzz.join("python").join(format!("{target}.py")));
        c
    } else {
        let mut c = Command::new("rustup");
        c.args(["run", "nightly", "cargo", "fuzz", "run"]).args(FEATURES).arg(target);
        c
    };
    cmd.arg(&corpus).arg(&seeds);
    if !PYTHON_TARGETS.contains(&target) {
        cmd.arg("--");
    }
    cmd.args(&flags);
    eprintln!("fuzz: {target} for {seconds} s (log {})", log.display());
    let file = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let ran = cmd
        .current_dir(workspace_root())
        .stdout(file.try_clone()?)
        .stderr(file)
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("could not start {cmd:?}"))?;
    let text = fs::read_to_string(&log).unwrap_or_default();
    if !ran.success() {
        let input = crash_input(&text);
        bail!(
            "fuzz target {target} failed ({ran}): {}; its output is in {}",
            input.map_or("no input was written".to_owned(), |p| format!(
                "the input is {}, rerun it with `cargo +nightly fuzz run {target} {}`",
                p.display(),
                p.display()
            )),
            log.display()
        );
    }
    outcome(&text).with_context(|| format!("reading {}", log.display()))
}

/// The input libFuzzer saved for a crash ("Test unit written to PATH").
fn crash_input(log: &str) -> Option<PathBuf> {
    log.lines()
        .rev()
        .find_map(|l| l.split_once("Test unit written to ").map(|(_, p)| p.trim()))
        .map(|p| workspace_root().join(Path::new(p)))
}

/// Executions, seconds and corpus size from libFuzzer's last lines ("Done N runs in S
/// second(s)"; the last status line's "corp: N/..").
fn outcome(log: &str) -> anyhow::Result<Outcome> {
    let done = log
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("Done ")?.split_once(" runs in "))
        .context("no \"Done N runs\" line")?;
    let runs = done.0.trim().parse().context("the run count")?;
    let seconds = done.1.split_whitespace().next().unwrap_or("0").parse().unwrap_or(0.0);
    let corpus = log
        .lines()
        .rev()
        .find_map(|l| l.split_once(" corp: ").map(|(_, r)| r.split('/').next().unwrap_or("")))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    Ok(Outcome { runs, seconds, corpus })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libfuzzers_summary_and_crash_path() {
        let log = "#4096\tpulse  cov: 28 ft: 58 corp: 12/55b lim: 20 exec/s: 455 rss: 43Mb\n\
                   #4284\tDONE   cov: 28 ft: 58 corp: 13/60b lim: 20 exec/s: 389 rss: 43Mb\n\
                   Done 4284 runs in 11 second(s)\n";
        let o = outcome(log).unwrap();
        assert_eq!((o.runs, o.seconds, o.corpus), (4284, 11.0, 13));
        assert!(outcome("==1== ERROR: libFuzzer: deadly signal\n").is_err());
        let crash = "SUMMARY: libFuzzer: deadly signal\n\
                     Test unit written to fuzz/artifacts/policy/crash-da39a3ee\n";
        assert!(crash_input(crash).unwrap().ends_with("fuzz/artifacts/policy/crash-da39a3ee"));
    }
}
