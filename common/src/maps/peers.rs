//! Peers: the LPM trie that maps an address to a configured peer's id, and the per-CPU cache of
//! its answers in front of it (with the generation that invalidates the cache).

/// LPM trie: [`PeerPrefix`] -> peer id (`u32`, 1..=[`MAX_PEERS`]); IPv4 prefixes as IPv4-mapped
/// IPv6 (`::ffff:0:0/96` + the IPv4 prefix).
pub const MAP_PEERS: &str = "LP_PEERS";
/// Per-CPU array of [`PeerCacheEntry`], [`PEER_CACHE_SLOTS`] slots: recent address -> peer
/// answers in front of the LPM trie, which costs 50-70 ns a lookup.
pub const MAP_PEER_CACHE: &str = "LP_PEER_CACHE";
/// Slots of [`MAP_PEER_CACHE`] per CPU (a power of two).
pub const PEER_CACHE_SLOTS: u32 = 256;

/// The cache slot of an address given as two native-endian words: all 128 bits folded to 32,
/// then a multiplicative hash's top bits, so that every address byte reaches the slot.
#[inline(always)]
pub fn peer_cache_slot(w: [u64; 2]) -> u32 {
    let x = w[0] ^ w[1];
    let folded = (x ^ (x >> 32)) as u32;
    folded.wrapping_mul(0x9E37_79B1) >> (32 - PEER_CACHE_SLOTS.trailing_zeros())
}
/// Array of one `u32`: the generation of [`MAP_PEERS`]. The controller increments it after every
/// change of the trie; cache entries of another generation are misses. Zero disables the cache.
pub const MAP_PEER_GENERATION: &str = "LP_PEER_GEN";

/// One slot of [`MAP_PEER_CACHE`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerCacheEntry {
    /// The address (IPv4-mapped for IPv4) as two native-endian words.
    pub addr: [u64; 2],
    pub peer: u32,
    pub generation: u32,
}

/// Peers a policy can name.
pub const MAX_PEERS: u32 = 64;
/// Capacity of [`MAP_PEERS`]: prefixes (CIDRs) of all peers together.
pub const MAX_PEER_PREFIXES: u32 = MAX_PEERS * 4;
/// Peer id of traffic that matches no configured peer.
pub const PEER_OTHER: u32 = 0;

/// Key of [`MAP_PEERS`] (the layout `bpf_lpm_trie_key` requires: prefix length, then data).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerPrefix {
    pub prefix_len: u32,
    pub addr: [u8; 16],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_cache_slots_spread_hosts_of_one_prefix() {
        let words = |a: [u8; 16]| {
            let (lo, hi) = a.split_at(8);
            [u64::from_ne_bytes(lo.try_into().unwrap()), u64::from_ne_bytes(hi.try_into().unwrap())]
        };
        let mut used = [false; PEER_CACHE_SLOTS as usize];
        for host in 0..=255u8 {
            // ::ffff:10.0.0.host, then 2001:db8:2::host.
            let v4 = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, host];
            let mut v6 = [0u8; 16];
            v6[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
            v6[5] = 2;
            v6[15] = host;
            for a in [v4, v6] {
                let slot = peer_cache_slot(words(a));
                assert!(slot < PEER_CACHE_SLOTS);
                used[slot as usize] = true;
            }
        }
        // 512 addresses over 256 slots: a good hash leaves ~1/e^2 of them empty.
        let n = used.iter().filter(|u| **u).count();
        assert!(n > 180, "{n} of 256 slots used");
    }
}
