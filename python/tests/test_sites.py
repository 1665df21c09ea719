"""Which rank carries which shard across sites: pure arithmetic, no process group."""

from __future__ import annotations

import pytest

from linkpilot.sites import (
    check_sites,
    replica_sets,
    shard_bounds,
    shard_owners,
    state_shards,
)


def test_the_reference_clusters_8_ranks_map_onto_16() -> None:
    hk, us = list(range(8)), list(range(8, 24))
    owners = shard_owners([hk, us])
    # 16 shards: each US rank carries one, each Hong Kong rank two consecutive ones.
    assert len(owners) == 16
    assert owners == [[hk[k // 2], us[k]] for k in range(16)]


@pytest.mark.parametrize("sizes", [[1, 2], [2, 2], [3, 4], [8, 16], [5, 7, 2], [1, 1, 1]])
def test_every_shard_crosses_once_per_site_and_every_rank_carries_a_fair_part(
        sizes: list[int]) -> None:
    sites, first = [], 0
    for n in sizes:
        sites.append(list(range(first, first + n)))
        first += n
    owners = shard_owners(sites)
    assert len(owners) == max(sizes)
    for shard in owners:  # one owner per site, in site order
        assert [next(i for i, s in enumerate(sites) if r in s) for r in shard] == list(
            range(len(sites)))
    for s in sites:
        carried = [sum(o.count(r) for o in owners) for r in s]
        # Every rank carries something, and no rank of a site more than one shard over another.
        assert min(carried) >= 1 and max(carried) - min(carried) <= 1, (s, carried)
        # Each rank's shards are consecutive (its part of the site's gather is one piece).
        for r in s:
            mine = [k for k, o in enumerate(owners) if r in o]
            assert mine == list(range(mine[0], mine[0] + len(mine)))


def test_bounds() -> None:
    assert shard_bounds(3, 4) == [0, 1, 2, 4]
    assert shard_bounds(4, 4) == [0, 1, 2, 3, 4]
    assert shard_bounds(1, 2) == [0, 2]


@pytest.mark.parametrize("sites,world", [([[0, 1], [1, 2]], 3), ([[0], [2]], 3), ([[0, 1], []], 2),
                                         ([], 2), ([[0, 1], [2, 3]], 5)])
def test_sites_that_do_not_partition_the_world_are_refused(sites: list[list[int]],
                                                           world: int) -> None:
    with pytest.raises(ValueError, match="exactly once"):
        check_sites(sites, world)


def test_unequal_sites_are_accepted() -> None:
    assert check_sites([(0,), (1, 2)], 3) == [[0], [1, 2]]


def test_shards_sync_among_the_ranks_that_hold_them() -> None:
    # Whole parameters: one set, the sites themselves.
    assert replica_sets([[0, 1], [2]], [(0, 1)] * 3) == [[[0, 1], [2]]]
    # 8 ranks as HSDP (2 replicas of a 4-way shard) against 16 as HSDP (4 replicas of the same
    # cut): shard k is held by 2 ranks in one site and 4 in the other.
    hk = [(r % 4, 4) for r in range(8)]
    us = [(r % 4, 4) for r in range(16)]
    sets = replica_sets([list(range(8)), list(range(8, 24))], hk + us)
    assert sets[1] == [[1, 5], [9, 13, 17, 21]]
    assert sorted(r for s in sets for site in s for r in site) == list(range(24))


def test_a_ddp_jobs_outer_state_of_8_ranks_against_16_is_cut_in_8() -> None:
    """Hong Kong's 8 ranks (0-7) against the US's 16 (8-23): 8 shards, shard k held by rank k
    in Hong Kong and by the US's k-th and (k + 8)-th ranks (8 + k and 16 + k); the first
    holder in each site exchanges it, so 8 pairs of ranks cross, one connection each."""
    sites = [list(range(8)), list(range(8, 24))]
    cuts = state_shards(sites)
    assert cuts[:8] == [(k, 8) for k in range(8)]
    assert cuts[8:] == [(k, 8) for k in range(8)] * 2
    sets = replica_sets(sites, cuts)
    assert [s[0][0] for s in sets] == list(range(8))  # Hong Kong's holder = its leader
    assert sets[3] == [[3], [11, 19]]
    # Any order of ranks in a site, and a site of one rank: the state stays whole.
    assert state_shards([[3, 1], [0, 2]]) == [(0, 2), (1, 2), (1, 2), (0, 2)]
    assert state_shards([[0], [1, 2]]) == [(0, 1)] * 3


def test_sites_that_cut_the_parameters_differently_are_refused() -> None:
    # FSDP over 8 ranks in one site and 16 in the other: 8 shards against 16.
    with pytest.raises(ValueError, match="site 0: \\[8\\] shards; site 1: \\[16\\] shards"):
        replica_sets([list(range(8)), list(range(8, 24))],
                     [(r, 8) for r in range(8)] + [(r, 16) for r in range(16)])
    with pytest.raises(ValueError, match="site 1 has no rank holding shard 1 of 2"):
        replica_sets([[0, 1], [2, 3]], [(0, 2), (1, 2), (0, 2), (0, 2)])
