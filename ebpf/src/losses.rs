//! What the programs could not count, by kind, and a warning about it through aya-log: at most
//! one per kind every [`LOSS_WARN_INTERVAL_NS`], never on the path of a packet that was counted.

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::map,
    maps::{Array, PerCpuArray},
    EbpfContext,
};
use aya_log_ebpf::warn;
use linkpilot_common::{packet::Loss, DatapathLosses, LOSS_WARN_INTERVAL_NS};

#[map(name = "LP_LOSSES")]
pub(crate) static LOSSES: PerCpuArray<DatapathLosses> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "LP_LOSS_WARNED")]
static WARNED: Array<u64> = Array::with_max_entries(linkpilot_common::packet::LOSS_KINDS as u32, 0);

/// Counts one loss of `kind` on this CPU and warns if this kind has not warned lately.
#[inline(always)]
pub(crate) fn lost<C: EbpfContext>(ctx: &C, kind: Loss) {
    let Some(l) = LOSSES.get_ptr_mut(0) else { return };
    // SAFETY: a per-CPU value; programs on one CPU do not preempt each other mid-update except
    // a TC program interrupting a tracepoint, which costs at most one count.
    let total = unsafe {
        let n = &mut (*l).by_kind[kind as usize];
        *n += 1;
        *n
    };
    let Some(last) = WARNED.get_ptr_mut(kind as u32) else { return };
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: a plain u64 shared by all CPUs: a race lets two CPUs warn at once, nothing worse.
    unsafe {
        if *last != 0 && now.wrapping_sub(*last) < LOSS_WARN_INTERVAL_NS {
            return;
        }
        *last = now;
    }
    match kind {
        Loss::TruncatedHeader => {
            warn!(ctx, "datapath loss: truncated or malformed header (this CPU: {} so far)", total)
        }
        Loss::UnknownLinkType => warn!(
            ctx,
            "datapath loss: unknown link-layer type or stacked VLAN tags (this CPU: {} so far)",
            total
        ),
        Loss::MapInsertFailed => warn!(
            ctx,
            "datapath loss: a map insert failed, the table is full (this CPU: {} so far)", total
        ),
        Loss::MapRemoveFailed => warn!(
            ctx,
            "datapath loss: a closed flow's remove failed, it stays until evicted (this CPU: {} so far)",
            total
        ),
    }
}

/// Counts a flow-table insert of an absent key (`removed` false) or a remove of a present one:
/// the controller derives evictions from them.
#[inline(always)]
pub(crate) fn flow_table(removed: bool) {
    if let Some(l) = LOSSES.get_ptr_mut(0) {
        // SAFETY: a per-CPU value, as above.
        unsafe {
            if removed {
                (*l).flow_removes += 1;
            } else {
                (*l).flow_inserts += 1;
            }
        }
    }
}
