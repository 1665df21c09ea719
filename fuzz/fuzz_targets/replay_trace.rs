//! libFuzzer's entry point for `linkpilot_fuzz::replay_trace` (what it checks is said there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| linkpilot_fuzz::replay_trace::check(data));
