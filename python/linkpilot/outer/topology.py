"""Who does what in :class:`~linkpilot.outer.OuterSync`: the sites, the shards of the outer state
and their holders, whether this rank leads its shard at its site, and the gloo groups each of
the class's collectives goes over. Worked out once, at construction, from the job's layout and
the parameters' sharding: apart from the rounds, which only read it."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from linkpilot.pgtimeout import member
from linkpilot.sites import check_sites, replica_sets, state_shards

#: How long a site's other ranks wait for their leader's hand-over (it may be waiting out an
#: outage).
HANDOVER_TIMEOUT = datetime.timedelta(days=1)


def local(p: torch.Tensor) -> torch.Tensor:
    """What this rank holds of a parameter: its shard of a sharded one (FSDP2's DTensor)."""
    return p.to_local() if isinstance(p, DTensor) else p


def shard_of(params: Sequence[torch.Tensor]) -> tuple[int, int]:
    """This rank's (shard index, shard count) among the ranks its parameters are sharded over
    (FSDP2, or HSDP's shard dimension); (0, 1) for whole parameters. ValueError for a mix."""
    found = set()
    for p in params:
        if not isinstance(p, DTensor):
            found.add((0, 1))
            continue
        dims = [i for i, pl in enumerate(p.placements) if isinstance(pl, Shard)]
        if len(dims) > 1:
            raise ValueError(f"a parameter of shape {tuple(p.shape)} is sharded over "
                             f"{len(dims)} mesh dimensions: one is supported")
        if not dims:
            found.add((0, 1))
            continue
        ranks = dist.get_process_group_ranks(p.device_mesh.get_group(dims[0]))
        found.add((ranks.index(dist.get_rank()), len(ranks)))
    if len(found) > 1:
        raise ValueError("the parameters are sharded over different groups, or some are "
                         f"sharded and some whole ({sorted(found)} as (shard, of)): shard the "
                         "whole model over one group")
    return found.pop() if found else (0, 1)


@dataclass(frozen=True)
class Topology:
    """This rank's place in the job, as :func:`topology` worked it out."""

    n_sites: int
    site_index: int
    #: This site's ranks, sorted.
    members: list[int]
    #: Every rank of the job, over gloo: this class's own collectives run on host tensors.
    host: dist.ProcessGroup
    #: Whole parameters in sites of several ranks, the outer state sharded over each site's
    #: ranks: what a shard's outer step writes is spread to the rest of its site.
    spread: bool
    shard: int
    shards: int
    #: This rank's outer state: [base, base + length) of its flat local parameters.
    base: int
    length: int
    #: Whether this rank exchanges its shard for its site (the shard's first holder there).
    leader: bool
    #: This shard's leaders, by site.
    leaders: list[int]
    #: This shard's first holder: every replica starts from its parameters.
    first: int
    #: The user's group of this site (DDP, on the job's backend); None for a one-rank site.
    site_group: dist.ProcessGroup | None
    #: Carries the leader's results to the other holders of its shard in its site.
    handover: dist.ProcessGroup | None
    #: Every holder of this rank's shard, at every site.
    replicas: dist.ProcessGroup
    #: This site's ranks, where the outer state has several shards: their rounds are agreed.
    site_ranks: dist.ProcessGroup | None


def topology(params: Sequence[torch.Tensor], sites: Sequence[Sequence[int]] | None,
             numel: int, shard_state: bool) -> Topology:
    """This rank's place among ``sites`` (None: every rank is a site), with ``numel`` local
    parameter values; makes the groups (every rank makes every group, in the same order, as
    torch requires). ValueError for sites that do not cover the job once."""
    world, rank = dist.get_world_size(), dist.get_rank()
    # Sorted: a group's rank 0 is its smallest global rank, and the leader must be it.
    sites = [sorted(s) for s in sites] if sites else [[r] for r in range(world)]
    sites = check_sites(sites, world)
    site_index = next(i for i, s in enumerate(sites) if rank in s)
    site = sites[site_index]
    # The outer state lives in host memory (beside a large model on a GPU it would not fit)
    # and NCCL takes CUDA tensors only: whatever the job's backend, this class's own
    # collectives go over gloo groups of its own.
    host = member(dist.new_group(backend="gloo"))
    # Parameters sharded inside the sites (FSDP2, HSDP): each shard is synchronized among
    # the ranks that hold it, as a job of its own (its replica set, by site); whole
    # parameters: one set, the whole job.
    mine = torch.tensor(shard_of(params), dtype=torch.int64)
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine, group=host)
    cuts = [(int(t[0]), int(t[1])) for t in everyone]
    # Whole parameters (DDP) in sites of several ranks: each rank of a site keeps and
    # exchanges a contiguous shard of the flat outer state, as many shards as the smallest
    # site has ranks (8 against 16: each of the 8 shards held by one rank there and two
    # here, the first of which exchanges it). Every rank holds the whole model, so what a
    # shard's outer step writes is spread to the rest of its site (SiteLink.sync).
    spread = (shard_state and min(len(s) for s in sites) > 1
              and all(c == (0, 1) for c in cuts))
    if spread:
        cuts = state_shards(sites)
    sets = replica_sets(sites, cuts)
    shard, shards = cuts[rank][0], len(sets)
    base = numel * shard // shards if spread else 0
    length = numel * (shard + 1) // shards - base if spread else numel
    holders = sets[shard]  # this shard's holders, by site
    # The site group is the user's (DDP, on the job's backend); a hand-over group carries
    # the leader's results to the other holders of its shard in its site, and waits while
    # the leader waits for a dead link: a day, not the default.
    users = [dist.new_group(s) for s in sites] if any(len(s) > 1 for s in sites) else []
    set_groups = [dist.new_group(sorted(r for h in by_site for r in h), backend="gloo")
                  for by_site in sets] if len(sets) > 1 else [host]
    handovers = [[dist.new_group(h, timeout=HANDOVER_TIMEOUT, backend="gloo")
                  for h in by_site] for by_site in sets] if any(
        len(h) > 1 for by_site in sets for h in by_site) else []
    site_group = member(users[site_index]) if len(site) > 1 else None
    handover = (member(handovers[shard][site_index])
                if len(holders[site_index]) > 1 else None)
    replicas = member(set_groups[shard])
    # Each shard's rounds follow its own exchange, so one may begin a step later than
    # another's: the site's rounds_done is the least of its shards', agreed every step, so
    # that every rank of a site stops at the same step (their FSDP collectives must match).
    counts = [dist.new_group(s, timeout=HANDOVER_TIMEOUT, backend="gloo") for s in sites
              ] if len(sets) > 1 else []
    site_ranks = member(counts[site_index]) if len(sets) > 1 and len(site) > 1 else None
    return Topology(
        n_sites=len(sites), site_index=site_index, members=site, host=host, spread=spread,
        shard=shard, shards=shards, base=base, length=length,
        leader=holders[site_index][0] == rank, leaders=[h[0] for h in holders],
        first=holders[0][0], site_group=site_group, handover=handover, replicas=replicas,
        site_ranks=site_ranks)
