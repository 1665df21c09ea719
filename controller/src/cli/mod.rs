//! The commands around the daemon and its core, each a driver over the library: `watch` (the
//! programs' counters as rates), `replay`'s plot, `policy check` and `policy init`. `linkpilot run` is `daemon`;
//! the benchmarks are `bench`.

pub mod plot;
pub mod policy_check;
pub mod policy_init;
pub mod replay;
pub mod watch;
