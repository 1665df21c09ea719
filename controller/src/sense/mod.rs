//! Sensing: counter readings turned into one snapshot per tick (`sensors`, pure, with the RTT
//! window of `rtt_window`), and `linkpilot watch`'s rates and DSCP selectors (`watch`).

pub mod job_marks;
pub(crate) mod rtt_window;
pub mod sensors;
pub mod watch;
pub mod watch_run;
