//! What each fuzz target checks, one module a target, as plain functions over the input bytes:
//! `fuzz_targets/` hands them to libFuzzer (`cargo xtask fuzz`, nightly), and `tests/seeds.rs`
//! runs every committed seed through them as an ordinary test in `cargo xtask test`.

pub mod job_report;
pub mod packet;
pub mod policy;
pub mod replay_trace;
pub mod scenario;
pub mod status_request;
pub mod tuner_decision;
pub mod tuner_stats;
