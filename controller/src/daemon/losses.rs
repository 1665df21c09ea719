//! What the programs lost, as one counter per kind (`linkpilot_datapath_lost_total{kind}`).
//! The programs count and warn about truncated headers, unknown link types and failed map
//! inserts and removes themselves (aya-log); evictions from the flow table they cannot see, so they count
//! inserts and removes and the evictions are derived here, each time the table is read:
//! inserts - removes - entries present. An evicted flow was live (closed ones leave at once).
//! Runs of the tracepoint programs that the kernel skipped (another BPF program or a map
//! syscall active on that CPU) are counted by the kernel itself, per program: an event not
//! seen, e.g. a retransmission not counted or a close not seen, whose flow then stays in the
//! table until the LRU evicts it.

use std::time::{Duration, Instant};

use linkpilot_common::{packet::LOSS_KINDS, DatapathLosses};
use prometheus_client::metrics::{counter::Counter, family::Family};
use tracing::warn;

/// The `kind` label: the programs' kinds (by `Loss` value), then evictions, then skipped runs.
pub const KINDS: [&str; LOSS_KINDS + 2] = [
    "truncated_header",
    "unknown_link_type",
    "map_insert_failed",
    "map_remove_failed",
    "flow_evicted",
    "program_skipped",
];
const EVICTED: usize = LOSS_KINDS;
const SKIPPED: usize = LOSS_KINDS + 1;

/// Warnings about evictions, at most this often (the programs' own interval).
const WARN_EVERY: Duration = Duration::from_nanos(linkpilot_common::LOSS_WARN_INTERVAL_NS);

#[derive(Default)]
pub struct LossReport {
    /// Totals already added to the counters, by [`KINDS`] index.
    counted: [u64; LOSS_KINDS + 2],
    warned: Option<Instant>,
}

impl LossReport {
    /// Adds what is new in `l` and in `skipped` (the kernel's total of skipped program runs)
    /// to `family`; `flows_present` is the flow table's size when it was read this tick.
    pub fn update(
        &mut self,
        l: &DatapathLosses,
        flows_present: Option<usize>,
        skipped: u64,
        family: &Family<Vec<(String, String)>, Counter>,
    ) {
        let mut now = self.counted;
        now[..LOSS_KINDS].copy_from_slice(&l.by_kind);
        if let Some(present) = flows_present {
            let gone = l.flow_inserts.saturating_sub(l.flow_removes);
            // Reads of the counters and the table are not atomic: never step back.
            now[EVICTED] = now[EVICTED].max(gone.saturating_sub(present as u64));
        }
        now[SKIPPED] = now[SKIPPED].max(skipped);
        let evicted = now[EVICTED].saturating_sub(self.counted[EVICTED]);
        let skipped_now = now[SKIPPED].saturating_sub(self.counted[SKIPPED]);
        for (i, kind) in KINDS.iter().enumerate() {
            let new = now[i].saturating_sub(self.counted[i]);
            if new > 0 {
                family.get_or_create(&vec![("kind".into(), (*kind).into())]).inc_by(new);
            }
        }
        self.counted = now;
        if evicted > 0 && self.warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            self.warned = Some(Instant::now());
            warn!(
                "datapath loss: {evicted} live flows evicted from the full flow table (LP_FLOWS, \
                 {} in all); their RTT and retransmissions are no longer attributed per flow",
                now[EVICTED]
            );
        }
        if skipped_now > 0 {
            warn!(
                "datapath loss: the kernel skipped {skipped_now} run(s) of our tracepoint \
                 programs (another BPF program or a map syscall was active on that CPU); \
                 those events were not counted ({} in all)",
                now[SKIPPED]
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(f: &Family<Vec<(String, String)>, Counter>, kind: &str) -> u64 {
        f.get_or_create(&vec![("kind".into(), kind.into())]).get()
    }

    #[test]
    fn counters_follow_the_totals_and_evictions_never_step_back() {
        let f = Family::default();
        let mut r = LossReport::default();
        let mut l = DatapathLosses { by_kind: [2, 0, 1, 2], flow_inserts: 10, flow_removes: 3 };
        r.update(&l, Some(7), 0, &f);
        assert_eq!((value(&f, "truncated_header"), value(&f, "flow_evicted")), (2, 0));
        l.by_kind[0] = 5;
        l.flow_inserts = 20;
        r.update(&l, Some(12), 0, &f); // 20 - 3 - 12: 5 evicted
        assert_eq!((value(&f, "truncated_header"), value(&f, "flow_evicted")), (5, 5));
        // A read that raced an insert shows fewer: the counter keeps its value.
        r.update(&l, Some(14), 0, &f);
        r.update(&l, None, 3, &f);
        assert_eq!((value(&f, "flow_evicted"), value(&f, "map_insert_failed")), (5, 1));
        assert_eq!(value(&f, "map_remove_failed"), 2);
        // Skipped runs are the kernel's running total: only what is new is added.
        r.update(&l, None, 3, &f);
        r.update(&l, None, 4, &f);
        assert_eq!(value(&f, "program_skipped"), 4);
    }
}
