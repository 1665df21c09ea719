//! What the programs could not count: the per-CPU loss counters the controller exports, and the
//! timestamps that rate-limit the programs' own warnings about them.

use super::add_each;
use crate::packet::LOSS_KINDS;

/// Per-CPU array of one [`DatapathLosses`]: what the programs lost, by kind.
pub const MAP_LOSSES: &str = "LP_LOSSES";
/// Array of `u64`, one per [`crate::packet::Loss`] kind: `bpf_ktime_get_ns` of the last
/// warning the programs logged about that kind (at most one per [`LOSS_WARN_INTERVAL_NS`]).
pub const MAP_LOSS_WARNED: &str = "LP_LOSS_WARNED";
/// The programs warn about a kind of loss at most this often.
pub const LOSS_WARN_INTERVAL_NS: u64 = 10_000_000_000;

/// What the programs could not count, per CPU. Evictions from the flow table are not seen by
/// the programs: the controller derives them as inserts - removes - entries present.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DatapathLosses {
    /// By [`crate::packet::Loss`] kind.
    pub by_kind: [u64; LOSS_KINDS],
    /// Flow-table inserts of a key that was absent, and removes of one that was present.
    pub flow_inserts: u64,
    pub flow_removes: u64,
}

impl DatapathLosses {
    pub fn accumulate(&mut self, o: &Self) {
        add_each(&mut self.by_kind, &o.by_kind);
        add_wrapping!(self, o; flow_inserts, flow_removes);
    }
}
