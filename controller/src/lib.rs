//! linkpilot: an eBPF-based adaptive link controller.
//!
//! The library holds everything; the `linkpilot` binary is a thin CLI over it.
//! `probes` is the only module that talks to aya; `kernel` and `iface` read the running system;
//! `sensors` turns counter readings into per-tick snapshots (pure); `watch` prints rates.

pub mod batch;
pub mod bench;
pub mod bench_sensors;
pub mod board;
pub mod board_feed;
pub mod control;
pub mod crash_state;
pub mod daemon;
pub mod envfile;
pub mod files;
pub mod iface;
pub mod kernel;
pub mod paths;
pub mod peers;
pub mod probes;
pub mod rdma;
pub mod rdma_nl;
pub mod roce_tc;
pub mod rtt_window;
pub mod sensors;
pub mod sysctl;
pub mod tuner_stats;
pub mod verbs;
pub mod watch;
