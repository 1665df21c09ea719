//! The plugin's rules, pure: the adopted decision's [`Rule`] and what NCCL passes in, what to
//! hand back. Nothing else enters: every rank that adopted the same rule answers the same
//! inputs the same way.
//!
//! - Algorithm/protocol: of the cost table's entries that NCCL allowed (>= 0) and that match the
//!   rule's preference, the one NCCL itself rates cheapest gets cost 0. Entries at -1 (not
//!   supported, or excluded by NCCL_ALGO/NCCL_PROTO) are never touched, and no entry is ever set
//!   to -1, so NCCL always has a choice left.
//! - Channels: only for Ring and Tree (NCCL clamps those to the communicator's channels;
//!   CollNet would take the number as given). NCCL passes 0 and uses a nonzero answer in place
//!   of its own size-based count, which it cannot tell us: for collectives so small that NCCL
//!   would use fewer channels than the policy's cap, the cap is more. A count NCCL passed in is
//!   never raised.
//! - Chunk: for Simple Ring and Tree (the chunks NCCL_BUFFSIZE sizes), NCCL's chunk scaled as if
//!   NCCL_BUFFSIZE were the rule's chunk, at most NCCL's own (its buffer), rounded down to the
//!   Simple grain and at least one grain.
//! - Collectives below the rule's `min_bytes`, and collective types other than NCCL's five,
//!   keep NCCL's own choices.

use linkpilot_common::{board::nccl, tuner::choice};

use crate::abi::{FUNC_ALLREDUCE, SIMPLE_GRAIN};

/// What a decision asks of NCCL: the policy's `[nccl]` rule of a link state and its chunk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rule {
    /// Collectives of fewer bytes keep NCCL's own choices.
    pub min_bytes: u64,
    /// Preferred algorithm and protocol ([`nccl`] codes), or [`nccl::ANY`].
    pub algo: u8,
    pub proto: u8,
    /// Most channels a Ring or Tree collective may use; 0: NCCL's count.
    pub max_channels: u8,
    /// Bytes per pipelined chunk; 0: NCCL's own chunks.
    pub chunk_bytes: u64,
}

/// Whether the plugin tunes this `ncclFunc_t` (Broadcast .. AllReduce).
pub fn known_collective(coll: i32) -> bool {
    (0..=FUNC_ALLREDUCE).contains(&coll)
}

/// Applies the rule's algorithm/protocol preference and channel cap for a collective of
/// `n_bytes` to NCCL's `table` (`num_proto` entries per algorithm) and `n_channels`. Returns what
/// was chosen as a [`choice`] word (with [`choice::ADOPTED`]).
pub fn coll_info(
    rule: &Rule,
    coll: i32,
    n_bytes: u64,
    table: &mut [f32],
    num_proto: usize,
    n_channels: Option<&mut i32>,
) -> u32 {
    let mut flags = choice::SEEN | choice::ADOPTED;
    if !known_collective(coll) || num_proto == 0 {
        return choice::pack(nccl::ANY, nccl::ANY, 0, flags);
    }
    if n_bytes < rule.min_bytes {
        return choice::pack(nccl::ANY, nccl::ANY, 0, flags | choice::SMALL);
    }
    let (want_algo, want_proto) = (rule.algo, rule.proto);
    let (mut algo, mut proto) = (nccl::ANY, nccl::ANY);
    if want_algo != nccl::ANY || want_proto != nccl::ANY {
        let mut best: Option<(usize, f32)> = None;
        for (i, &cost) in table.iter().enumerate() {
            let (a, p) = (i / num_proto, i % num_proto);
            let matches = (want_algo == nccl::ANY || a == usize::from(want_algo))
                && (want_proto == nccl::ANY || p == usize::from(want_proto));
            // NaN and every negative cost (-1: not allowed) fail `>= 0`.
            if matches && cost >= 0.0 && best.is_none_or(|(_, c)| cost < c) {
                best = Some((i, cost));
            }
        }
        match best {
            Some((i, _)) => {
                table[i] = 0.0;
                (algo, proto) = ((i / num_proto) as u8, (i % num_proto) as u8);
            }
            None => flags |= choice::NOT_ALLOWED,
        }
    }
    let mut channels = 0u8;
    if rule.max_channels > 0 {
        if let (Some(n), Some(run)) = (n_channels, nccls_pick(table)) {
            let a = (run / num_proto) as u8;
            if a == nccl::ALGO_RING || a == nccl::ALGO_TREE {
                let cap = i32::from(rule.max_channels);
                *n = if *n > 0 { (*n).min(cap) } else { cap };
                channels = (*n).clamp(0, 255) as u8;
            }
        }
    }
    choice::pack(algo, proto, channels, flags)
}

/// The entry NCCL will run: the first smallest cost >= 0, scanning as NCCL does.
fn nccls_pick(table: &[f32]) -> Option<usize> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &cost) in table.iter().enumerate() {
        if cost >= 0.0 && best.is_none_or(|(_, c)| cost < c) {
            best = Some((i, cost));
        }
    }
    best.map(|(i, _)| i)
}

/// The chunk to ask NCCL for, or `None` to keep `incoming` (NCCL's own). `buffsize` is the
/// NCCL_BUFFSIZE the communicator was made with.
pub fn chunk(
    rule: &Rule,
    coll: i32,
    n_bytes: u64,
    algo: i32,
    proto: i32,
    incoming: usize,
    buffsize: u64,
) -> Option<usize> {
    let tuned_algo = algo == i32::from(nccl::ALGO_RING) || algo == i32::from(nccl::ALGO_TREE);
    if !known_collective(coll)
        || n_bytes < rule.min_bytes
        || !tuned_algo
        || proto != i32::from(nccl::PROTO_SIMPLE)
        || rule.chunk_bytes == 0
        || buffsize == 0
        || incoming < SIMPLE_GRAIN
    {
        return None;
    }
    // NCCL's Simple Ring/Tree chunk is NCCL_BUFFSIZE / 8 steps x chunkSteps: scaling it by
    // rule chunk / NCCL_BUFFSIZE gives the chunk NCCL would use with NCCL_BUFFSIZE = rule's.
    let want = u128::from(rule.chunk_bytes) * incoming as u128 / u128::from(buffsize);
    let want = want.min(incoming as u128) as usize;
    Some((want / SIMPLE_GRAIN * SIMPLE_GRAIN).max(SIMPLE_GRAIN))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{NUM_ALGORITHMS, NUM_PROTOCOLS};
    use linkpilot_common::board::nccl::*;

    fn link(algo: u8, proto: u8, channels: u8) -> Rule {
        Rule { algo, proto, max_channels: channels, min_bytes: 1 << 20, chunk_bytes: 2 << 20 }
    }

    /// A table like NCCL's for a multi-node AllReduce: Tree and Ring with all protocols, the
    /// rest not allowed; Ring/LL cheapest.
    fn table() -> [f32; NUM_ALGORITHMS * NUM_PROTOCOLS] {
        let mut t = [-1.0; NUM_ALGORITHMS * NUM_PROTOCOLS];
        t[..6].copy_from_slice(&[30.0, 25.0, 20.0, 5.0, 15.0, 10.0]);
        t
    }

    fn at(a: u8, p: u8) -> usize {
        usize::from(a) * NUM_PROTOCOLS + usize::from(p)
    }

    #[test]
    fn a_preference_zeroes_the_cheapest_allowed_match_only() {
        let mut t = table();
        let w = coll_info(&link(ALGO_TREE, PROTO_SIMPLE, 0), 4, 8 << 20, &mut t, 3, None);
        assert_eq!((choice::algo(w), choice::proto(w)), (ALGO_TREE, PROTO_SIMPLE));
        let mut want = table();
        want[at(ALGO_TREE, PROTO_SIMPLE)] = 0.0;
        assert_eq!(t, want);
        // Protocol only: the cheapest Simple entry (Ring, 10) wins.
        let mut t = table();
        let w = coll_info(&link(ANY, PROTO_SIMPLE, 0), 4, 8 << 20, &mut t, 3, None);
        assert_eq!((choice::algo(w), t[at(ALGO_RING, PROTO_SIMPLE)]), (ALGO_RING, 0.0));
    }

    #[test]
    fn not_allowed_entries_stay_and_nothing_else_moves() {
        let mut t = table();
        t[at(ALGO_TREE, PROTO_SIMPLE)] = -1.0; // e.g. NCCL_PROTO=^Simple for Tree
        let w = coll_info(&link(ALGO_TREE, PROTO_SIMPLE, 0), 4, 8 << 20, &mut t, 3, None);
        assert_eq!(w & choice::NOT_ALLOWED, choice::NOT_ALLOWED);
        assert_eq!(choice::algo(w), ANY);
        let mut want = table();
        want[at(ALGO_TREE, PROTO_SIMPLE)] = -1.0;
        assert_eq!(t, want);
        // PAT for AllReduce: every PAT entry is -1.
        let mut t = table();
        coll_info(&link(ALGO_PAT, ANY, 0), 4, 8 << 20, &mut t, 3, None);
        assert_eq!(t, table());
        // All -1 stays all -1 (NCCL fails such a collective itself; we never cause it).
        let mut t = [-1.0f32; 21];
        coll_info(&link(ALGO_RING, ANY, 4), 4, 8 << 20, &mut t, 3, Some(&mut 0));
        assert!(t.iter().all(|&c| c == -1.0));
    }

    #[test]
    fn small_and_unknown_collectives_keep_nccls_choice() {
        for (coll, bytes) in [(4, (1 << 20) - 1), (5, 8 << 20), (15, 8 << 20), (-1, 8 << 20)] {
            let mut t = table();
            let mut n = 0;
            coll_info(&link(ALGO_TREE, PROTO_SIMPLE, 2), coll, bytes, &mut t, 3, Some(&mut n));
            assert_eq!((t, n), (table(), 0), "coll {coll}, {bytes} bytes");
            assert_eq!(chunk(&link(ANY, ANY, 0), coll, bytes, 1, 2, 1 << 21, 4 << 20), None);
        }
    }

    #[test]
    fn channels_are_capped_for_ring_and_tree_only_never_raised() {
        let mut n = 0;
        let w =
            coll_info(&link(ALGO_TREE, PROTO_SIMPLE, 4), 4, 8 << 20, &mut table(), 3, Some(&mut n));
        assert_eq!((n, choice::channels(w)), (4, 4));
        let mut n = 2;
        coll_info(&link(ALGO_TREE, PROTO_SIMPLE, 4), 4, 8 << 20, &mut table(), 3, Some(&mut n));
        assert_eq!(n, 2);
        // NCCL would run CollNet Direct: leave its channels alone.
        let mut t = [-1.0f32; 21];
        t[at(ALGO_COLLNET_DIRECT, PROTO_SIMPLE)] = 3.0;
        t[at(ALGO_RING, PROTO_SIMPLE)] = 9.0;
        let mut n = 0;
        coll_info(&link(ANY, ANY, 4), 4, 8 << 20, &mut t, 3, Some(&mut n));
        assert_eq!(n, 0);
    }

    #[test]
    fn chunk_scales_by_rule_over_buffsize_within_ncclss_buffer() {
        let l = link(ANY, ANY, 0); // rule chunk 2 MiB
        let ring = i32::from(ALGO_RING);
        let simple = i32::from(PROTO_SIMPLE);
        // NCCL_BUFFSIZE 8 MiB: Ring AllReduce chunk 4 MiB (8 MiB / 8 x 4) -> 1 MiB.
        assert_eq!(chunk(&l, 4, 64 << 20, ring, simple, 4 << 20, 8 << 20), Some(1 << 20));
        // Tree: 8 MiB / 8 = 1 MiB -> 256 KiB.
        assert_eq!(chunk(&l, 4, 64 << 20, 0, simple, 1 << 20, 8 << 20), Some(256 << 10));
        // A rule chunk above NCCL_BUFFSIZE: NCCL's own maximum.
        assert_eq!(chunk(&l, 4, 64 << 20, ring, simple, 512 << 10, 1 << 20), Some(512 << 10));
        // Rounded to the 512-byte grain, never below one grain.
        let tiny = Rule { chunk_bytes: 1000, ..l };
        assert_eq!(chunk(&tiny, 4, 64 << 20, ring, simple, 4 << 20, 8 << 20), Some(512));
        let odd = Rule { chunk_bytes: 3 << 20, ..l };
        assert_eq!(chunk(&odd, 4, 64 << 20, ring, simple, 999_999, 8 << 20), Some(374_784));
        // LL, LL128, NVLS, CollNet, PAT: NCCL's own.
        for (a, p) in [(1, 0), (1, 1), (4, 2), (2, 2), (6, 2)] {
            assert_eq!(chunk(&l, 4, 64 << 20, a, p, 4 << 20, 8 << 20), None, "{a}/{p}");
        }
        let none = Rule { chunk_bytes: 0, ..l };
        assert_eq!(chunk(&none, 4, 64 << 20, ring, simple, 4 << 20, 8 << 20), None);
    }
}
