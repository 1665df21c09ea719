//! Every fuzz target's committed seeds (`fuzz/seeds/<target>/`), each run once through what the
//! target checks: the seed corpora as regression tests, on the ordinary build. The timed,
//! coverage-guided runs are `cargo xtask fuzz`.

use std::{fs, path::Path};

/// Runs `check` on every seed of `target`, naming the seed in the output first so that a failure
/// says which one.
fn each_seed(target: &str, check: impl Fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds").join(target);
    let mut seeds: Vec<_> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    for seed in seeds {
        eprintln!("seed {}", seed.display());
        let data = fs::read(&seed).unwrap_or_else(|e| panic!("reading {}: {e}", seed.display()));
        check(&data);
    }
}

#[test]
fn policy() {
    each_seed("policy", linkpilot_fuzz::policy::check);
}

#[test]
fn scenario() {
    each_seed("scenario", linkpilot_fuzz::scenario::check);
}

#[test]
fn replay_trace() {
    each_seed("replay_trace", linkpilot_fuzz::replay_trace::check);
}

#[test]
fn packet() {
    each_seed("packet", linkpilot_fuzz::packet::check);
}

#[test]
fn tuner_decision() {
    each_seed("tuner_decision", |d| linkpilot_fuzz::tuner_decision::check(d, None));
}

#[test]
fn tuner_stats() {
    each_seed("tuner_stats", linkpilot_fuzz::tuner_stats::check);
}

#[test]
fn job_report() {
    each_seed("job_report", linkpilot_fuzz::job_report::check);
}

#[test]
fn status_request() {
    each_seed("status_request", linkpilot_fuzz::status_request::check);
}
