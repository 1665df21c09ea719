"""Which rank carries which part of a payload across sites, for any partition of ranks into sites.

A payload is cut into as many shards as the largest site has ranks. In a site of ``n`` ranks, rank
``p`` owns the consecutive shards ``p*S//n`` up to ``(p+1)*S//n`` (``S`` shards): one each in the
largest site, one or more in a smaller one (8 ranks against 16: two shards per rank of the
8-rank site). Each shard crosses between its owners, one per site, in a process group of their
own. Every shard crosses once per site whatever the sizes, so the WAN carries what equal sites
would (within the padding of the last shard), spread over every rank's connection.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from linkpilot.pgtimeout import member


def check_sites(sites: Sequence[Sequence[int]], world: int) -> list[list[int]]:
    """The sites as lists; ValueError unless they are non-empty and hold each rank once."""
    out = [list(s) for s in sites]
    ranks = sorted(r for s in out for r in s)
    if not out or any(not s for s in out) or ranks != list(range(world)):
        raise ValueError(
            f"sites {out}: need non-empty sites that hold each rank 0..{world - 1} exactly once")
    return out


def shard_bounds(size: int, shards: int) -> list[int]:
    """First shard of each rank of a site of ``size`` ranks, and ``shards`` at the end."""
    return [p * shards // size for p in range(size + 1)]


def shard_owners(sites: Sequence[Sequence[int]]) -> list[list[int]]:
    """For each shard, its owner in each site (in site order)."""
    shards = max(len(s) for s in sites)
    owners: list[list[int]] = [[] for _ in range(shards)]
    for s in sites:
        bounds = shard_bounds(len(s), shards)
        for p, rank in enumerate(s):
            for k in range(bounds[p], bounds[p + 1]):
                owners[k].append(rank)
    return owners


def state_shards(sites: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """Each rank's (shard, shard count) of a DDP job's outer state: as many shards as the
    smallest site has ranks (``S``), the rank at position ``p`` of its site holding shard
    ``p % S`` (8 ranks against 16: shard k at rank k of the 8 and at ranks k and k + 8 of the 16,
    counted in their site). A site of one rank keeps the state whole, so all sites do."""
    fewest = min(len(s) for s in sites)
    at = {r: (p % fewest, fewest) for s in sites for p, r in enumerate(s)}
    return [at[r] for r in range(len(at))]


def replica_sets(sites: Sequence[Sequence[int]], shard_of: Sequence[tuple[int, int]]
                 ) -> list[list[list[int]]]:
    """The ranks that hold the same tensors, by site, for a job whose parameters are sharded
    inside each site (FSDP, HSDP): ``shard_of[r]`` is rank r's (shard index, shard count), (0, 1)
    when it holds whole parameters. For each shard index, its holders in each site (in site
    order). ValueError unless every site cuts the parameters into as many shards and holds
    each of them: a shard crosses between its holders only, so the cuts must match."""
    cuts = [{shard_of[r][1] for r in site} for site in sites]
    if any(len(c) != 1 for c in cuts) or len({min(c) for c in cuts}) != 1:
        raise ValueError(
            "the sites shard their parameters differently ("
            + "; ".join(f"site {i}: {sorted(c)} shards" for i, c in enumerate(cuts))
            + "): every site must cut them into as many shards (the same shard group size; "
            "HSDP's replicas inside a site may differ in number)")
    count = min(cuts[0])
    sets = [[[r for r in site if shard_of[r][0] == k] for site in sites] for k in range(count)]
    for k, by_site in enumerate(sets):
        for i, holders in enumerate(by_site):
            if not holders:
                raise ValueError(f"site {i} has no rank holding shard {k} of {count}")
    return sets


class Sites:
    """Process groups of the two-level exchange: one per site, and one per shard across sites.
    Every rank creates every group, in the same order (torch requires it)."""

    def __init__(self, sites: Sequence[Sequence[int]], world: int, rank: int,
                 cross_backend: str | None = None) -> None:
        sites = check_sites(sites, world)
        self.n_sites = len(sites)
        #: Shards a payload is cut into: the largest site's rank count.
        self.shards = max(len(s) for s in sites)
        # new_group is collective: every rank makes every group, then keeps its own.
        site_groups = [dist.new_group(s) for s in sites]
        cross_groups = [dist.new_group(o, backend=cross_backend) for o in shard_owners(sites)]
        site = next(i for i, s in enumerate(sites) if rank in s)
        self.site_ranks = sites[site]
        self.per_site = len(self.site_ranks)
        self.position = self.site_ranks.index(rank)
        self.site_group = member(site_groups[site])
        #: First shard of each rank of this site (and the shard count at the end).
        self.bounds = shard_bounds(self.per_site, self.shards)
        #: The shards this rank carries across, each with its group.
        self.owned = range(self.bounds[self.position], self.bounds[self.position + 1])
        self.cross_groups = [member(cross_groups[k]) for k in self.owned]
        #: The most shards a rank of this site owns: what each contributes to the site's gather.
        self.most_owned = max(b - a for a, b in zip(self.bounds, self.bounds[1:]))
        #: Device types the cross-site backend serves (others cross on the CPU).
        self.cross_devices = {d.type for d in getattr(self.cross_groups[0], "_device_types", [])
                              } or {"cpu"}

    def gather(self, mine: torch.Tensor, shard_len: int) -> torch.Tensor:
        """Every shard, in order, from this rank's reduced ``mine`` (its owned shards, in order)
        and its sitemates': one all_gather inside the site, each rank padded to the most any
        rank of the site owns."""
        width = self.most_owned * shard_len
        padded = mine.new_zeros(width)
        padded[: mine.numel()] = mine
        parts = [torch.empty_like(padded) for _ in range(self.per_site)]
        dist.all_gather(parts, padded, group=self.site_group)
        return torch.cat([parts[p][: (self.bounds[p + 1] - self.bounds[p]) * shard_len]
                          for p in range(self.per_site)])
