//! linkpilot: an eBPF-based adaptive link controller.
//!
//! The library holds everything; the `linkpilot` binary is a thin CLI over it. By concept:
//! `kernel` (the only part that talks to aya and the running system), `sense` (counter readings
//! into per-tick snapshots, pure), `rdma` (devices, ports and their counters), `control` (the
//! pure core: policy, estimator, decisions), `actuate` (what decisions change on the host:
//! sysctls, RoCE class, env file, and their crash-safe originals), `board` (the knob board the
//! training side reads, and the tuner plugin's counters), `daemon` (`linkpilot run`), `cli`
//! (the other commands: `watch`, `replay`, `policy check`), `bench` (the datapath, sensor and
//! core benchmarks).

pub mod actuate;
pub mod bench;
pub mod board;
pub mod cli;
pub mod control;
pub mod daemon;
pub mod kernel;
pub mod paths;
pub mod rdma;
pub mod sense;
