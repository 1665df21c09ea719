"""Which rank carries which shard across sites: pure arithmetic, no process group."""

from __future__ import annotations

import pytest

from linkpilot.sites import check_sites, shard_bounds, shard_owners


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
