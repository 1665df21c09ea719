//! Address -> peer id: the LPM trie the controller fills, behind a small per-CPU direct-mapped
//! cache, because a trie lookup costs more than everything else a packet does here.

use aya_ebpf::{
    macros::map,
    maps::{lpm_trie::Key, Array, LpmTrie, PerCpuArray},
};
use linkpilot_common::{PeerCacheEntry, MAX_PEERS, PEER_CACHE_SLOTS, PEER_OTHER};

/// BPF_F_NO_PREALLOC, which LPM tries require.
const NO_PREALLOC: u32 = 1;

#[map(name = "LP_PEERS")]
static PEERS: LpmTrie<[u8; 16], u32> = LpmTrie::with_max_entries(MAX_PEERS * 4, NO_PREALLOC);

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

/// The peer id of `addr` (IPv4-mapped for IPv4), [`PEER_OTHER`] if no prefix covers it.
#[inline(always)]
pub(crate) fn peer_of(addr: &[u8; 16]) -> u32 {
    let generation = PEER_GENERATION.get(0).copied().unwrap_or(0);
    let w = words(addr);
    // Fold the low bits of both words: IPv4-mapped addresses differ only in the second.
    let x = w[0] ^ w[1];
    let slot = ((x ^ (x >> 32) ^ (x >> 16)) as u32) & (PEER_CACHE_SLOTS - 1);
    let Some(e) = PEER_CACHE.get_ptr_mut(slot) else { return lookup(addr) };
    // SAFETY: a per-CPU value, used only by programs on this CPU with BH disabled.
    let e = unsafe { &mut *e };
    // One join point for hit and miss keeps the verifier's path count (and the egress
    // program's DSCP rule scan after it) from doubling.
    let hit = generation != 0 && e.generation == generation && e.addr == w;
    let peer = if hit { e.peer } else { lookup(addr) };
    *e = PeerCacheEntry { addr: w, peer, generation };
    peer
}

#[inline(always)]
fn lookup(addr: &[u8; 16]) -> u32 {
    PEERS.get(Key::new(128, *addr)).copied().unwrap_or(PEER_OTHER)
}
