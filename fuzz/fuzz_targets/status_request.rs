//! libFuzzer's entry point for `linkpilot_fuzz::status_request` (what it checks is said there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| linkpilot_fuzz::status_request::check(data));
