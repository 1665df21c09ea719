//! libFuzzer's entry point for `linkpilot_fuzz::tuner_stats` (what it checks is said there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| linkpilot_fuzz::tuner_stats::check(data));
