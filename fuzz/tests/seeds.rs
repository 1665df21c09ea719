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

/// One test per target, named after it, over the target's seeds.
macro_rules! seed_tests {
    ($($target:ident: $check:expr;)*) => {$(
        #[test]
        fn $target() {
            each_seed(stringify!($target), $check);
        }
    )*};
}

seed_tests! {
    policy: linkpilot_fuzz::policy::check;
    scenario: linkpilot_fuzz::scenario::check;
    replay_trace: linkpilot_fuzz::replay_trace::check;
    packet: linkpilot_fuzz::packet::check;
    tuner_decision: |d| linkpilot_fuzz::tuner_decision::check(d, None);
    tuner_stats: linkpilot_fuzz::tuner_stats::check;
    job_report: linkpilot_fuzz::job_report::check;
    status_request: linkpilot_fuzz::status_request::check;
}
