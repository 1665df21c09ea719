//! The maps more than one program uses: the per-interface and per-peer counters (and the
//! interface index that finds a packet's slot), the flow table, the local addresses. Each
//! program's own maps stay beside it.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray},
};
use linkpilot_common::{
    peer_stats_index, FlowKey, FlowState, IfaceConfig, IfaceStats, LocalAddr, PeerStats,
    IFACE_INDEX_SLOTS, MAX_FLOWS, MAX_IFACES, MAX_LOCAL_ADDRS, MAX_PEERS, MAX_PEER_ENTRIES,
};

#[map(name = "LP_IFACE_STATS")]
pub(crate) static IFACE_STATS: PerCpuArray<IfaceStats> =
    PerCpuArray::with_max_entries(MAX_IFACES, 0);

#[map(name = "LP_IFACE_CONFIG")]
static IFACE_CONFIG: HashMap<u32, IfaceConfig> = HashMap::with_max_entries(MAX_IFACES, 0);

#[map(name = "LP_IFACE_INDEX")]
static IFACE_INDEX: Array<IfaceConfig> = Array::with_max_entries(IFACE_INDEX_SLOTS, 0);

/// The configuration of `ifindex`: from its slot of the direct-mapped index (an inlined array
/// access), else from the hash.
#[inline(always)]
pub(crate) fn iface_config(ifindex: u32) -> Option<(u32, u32)> {
    if let Some(c) = IFACE_INDEX.get(ifindex & (IFACE_INDEX_SLOTS - 1)) {
        if c.ifindex == ifindex {
            return Some((c.l2, c.slot));
        }
    }
    // SAFETY: the controller writes this map only with whole values.
    unsafe { IFACE_CONFIG.get(ifindex) }.map(|c| (c.l2, c.slot))
}

#[map(name = "LP_PEER_STATS")]
static PEER_STATS: PerCpuArray<PeerStats> = PerCpuArray::with_max_entries(MAX_PEER_ENTRIES, 0);

/// The counter slot of `ifindex` (a watched interface), for the tracepoints.
#[inline(always)]
pub(crate) fn iface_slot(ifindex: u32) -> Option<u32> {
    iface_config(ifindex).map(|(_, slot)| slot)
}

/// The counters of (`slot`, `peer`).
#[inline(always)]
pub(crate) fn peer_stats(slot: u32, peer: u32) -> Option<*mut PeerStats> {
    if peer > MAX_PEERS {
        return None;
    }
    PEER_STATS.get_ptr_mut(peer_stats_index(slot, peer))
}

#[map(name = "LP_FLOWS")]
pub(crate) static FLOWS: LruHashMap<FlowKey, FlowState> =
    LruHashMap::with_max_entries(MAX_FLOWS, 0);

#[map(name = "LP_LOCAL_ADDRS")]
pub(crate) static LOCAL_ADDRS: HashMap<LocalAddr, u32> =
    HashMap::with_max_entries(MAX_LOCAL_ADDRS, 0);
