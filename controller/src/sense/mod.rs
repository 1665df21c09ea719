//! Sensing: counter readings turned into one snapshot per tick (`sensors`, pure, with the RTT
//! window of `rtt_window` and the job-mark split of `job_marks`; the snapshot's types in
//! `snapshot`).

pub mod job_marks;
pub(crate) mod rtt_window;
pub mod sensors;
pub mod snapshot;
