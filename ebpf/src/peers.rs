//! Address -> peer id: the LPM trie the controller fills, behind a small per-CPU direct-mapped
//! cache, because a trie lookup costs more than everything else a packet does here.

use aya_ebpf::{
    macros::map,
    maps::{lpm_trie::Key, Array, LpmTrie, PerCpuArray},
};
use linkpilot_common::{
    peer_cache_slot, PeerCacheEntry, MAX_PEER_PREFIXES, PEER_CACHE_SLOTS, PEER_OTHER,
};

/// BPF_F_NO_PREALLOC, which LPM tries require.
const NO_PREALLOC: u32 = 1;

#[map(name = "LP_PEERS")]
static PEERS: LpmTrie<[u8; 16], u32> = LpmTrie::with_max_entries(MAX_PEER_PREFIXES, NO_PREALLOC);

#[map(name = "LP_PEER_CACHE")]
static PEER_CACHE: PerCpuArray<PeerCacheEntry> = PerCpuArray::with_max_entries(PEER_CACHE_SLOTS, 0);

#[map(name = "LP_PEER_GEN")]
static PEER_GENERATION: Array<u32> = Array::with_max_entries(1, 0);

#[inline(always)]
fn words(a: &[u8; 16]) -> [u64; 2] {
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(&a[..8]);
    hi.copy_from_slice(&a[8..]);
    [u64::from_ne_bytes(lo), u64::from_ne_bytes(hi)]
}

/// The peer id of `addr` (IPv4-mapped for IPv4), [`PEER_OTHER`] if no prefix covers it,
/// through the per-CPU cache. For the TC programs only: they run in softirq, so nothing on
/// this CPU interleaves with their use of the cache. Tracepoints can fire in process context
/// with BH enabled, where a TC program could interrupt a half-written entry: they use
/// [`peer_of_uncached`].
#[inline(always)]
pub(crate) fn peer_of(addr: &[u8; 16]) -> u32 {
    let generation = PEER_GENERATION.get(0).copied().unwrap_or(0);
    let w = words(addr);
    let slot = peer_cache_slot(w);
    let Some(e) = PEER_CACHE.get_ptr_mut(slot) else { return peer_of_uncached(addr) };
    // SAFETY: a per-CPU value, used only by the TC programs (softirq) on this CPU.
    let e = unsafe { &mut *e };
    let hit = generation != 0 && e.generation == generation && e.addr == w;
    if hit {
        return e.peer;
    }
    let peer = peer_of_uncached(addr);
    *e = PeerCacheEntry { addr: w, peer, generation };
    peer
}

/// The peer id of `addr` from the LPM trie itself.
#[inline(always)]
pub(crate) fn peer_of_uncached(addr: &[u8; 16]) -> u32 {
    PEERS.get(Key::new(128, *addr)).copied().unwrap_or(PEER_OTHER)
}
