"""Inside a site of several ranks: the leader's note of each step (and the outer values it
brings) handed over to the other holders of its shard, the rounds every shard completed agreed,
and what each shard's outer step wrote spread to the rest of the site. Separate from the rounds,
which only the leaders follow: this keeps a site's ranks in step with them."""

from __future__ import annotations

import torch
import torch.distributed as dist

from linkpilot.outer.flat import FlatParams
from linkpilot.outer.fragments import Note
from linkpilot.outer.plan import RoundPlan, RoundStats, pack_header, plan_of
from linkpilot.outer.state import OuterState
from linkpilot.outer.topology import Topology

#: Values a site's spread of a shard's outer step moves per broadcast (4 MiB of fp32).
SPREAD_CHUNK = 1 << 20


class SiteLink:
    """This rank's side of its site's collectives (``topo``'s hand-over and site groups);
    ``flat`` and ``state`` are what they read and write. Every rank of the site calls each
    method at the same points."""

    def __init__(self, topo: Topology, flat: FlatParams, state: OuterState) -> None:
        self.topo, self.flat, self.state = topo, flat, state

    def from_leader(self, t: torch.Tensor) -> None:
        """``t`` from the shard's leader to the other holders in the site (none: unchanged)."""
        if self.topo.handover is not None:
            dist.broadcast(t, src=dist.get_global_rank(self.topo.handover, 0),
                           group=self.topo.handover)

    def hand_over(self, note: Note | None, plan: RoundPlan, rounds_sent: int
                  ) -> tuple[Note | None, RoundPlan, int]:
        """The leader's note, and the values it brings, to every holder of the shard in the
        site; with it the plan in force and the rounds sent, which the other holders report
        (only the leader follows the rounds): what each rank then has of the three."""
        handover, leader = self.topo.handover, self.topo.leader
        assert handover is not None
        head = torch.zeros(17, dtype=torch.int64)
        if leader:
            head[12:16] = pack_header(0, 0, 0, 0, plan, plan)[4:8]
            head[16] = rounds_sent
        if leader and note is not None:
            kind, a, b, brought, stats, _ = note
            head[:3] = torch.tensor([1 if kind == "apply" else 2, a, b])
            if stats is not None:
                brought = stats.plan
                head[7:12] = torch.tensor([stats.epoch, stats.round, stats.fragment, stats.step,
                                           stats.wire_bytes])
            if brought is not None:
                head[3:7] = pack_header(0, 0, 0, 0, brought, brought)[4:8]
        src = dist.get_global_rank(handover, 0)
        dist.broadcast(head, src=src, group=handover)
        if not leader:
            plan = plan_of(head[12:16].tolist())
            rounds_sent = int(head[16])
        kind_code, a, b = (int(x) for x in head[:3])
        if kind_code == 0:
            return None, plan, rounds_sent
        brought = plan_of(head[3:7].tolist())
        if kind_code == 1:
            values = note[5] if leader and note is not None else None
            if values is None:
                values = torch.empty(b - a)
            dist.broadcast(values, src=src, group=handover)
            if leader:
                return note, plan, rounds_sent
            self.state.outer[a:b] = values
            e, r, f, sent, wire = (int(x) for x in head[7:12])
            stats = RoundStats(e, r, f, sent, brought, wire, a, b, "applied")
            return ("apply", a, b, None, stats, values), plan, rounds_sent
        full = self.state.snapshot() if leader else torch.empty_like(self.state.outer)
        dist.broadcast(full, src=src, group=handover)
        if not leader:
            self.state.outer.copy_(full)
        return ("resync", a, b, brought, None, None), plan, rounds_sent

    def sync(self, note: Note | None, rounds_sent: int, ok: bool = True) -> tuple[int, bool]:
        """With several shards in a site: the rounds every shard completed (``rounds_sent``
        here), and (DDP) what each shard's leader wrote this step, spread to the rest of the
        site; whether every shard's ``ok`` held."""
        topo = self.topo
        head = torch.tensor([rounds_sent, ok, 0, 0, 0], dtype=torch.int64)
        if topo.spread and topo.leader and note is not None:
            kind, a, b = note[:3]
            lo, hi = (a, b) if kind == "apply" else (0, self.state.outer.numel())
            head[2:] = torch.tensor([1, topo.base + lo, topo.base + hi])
        if topo.site_ranks is None:
            return rounds_sent, ok
        heads = [torch.empty_like(head) for _ in topo.members]
        dist.all_gather(heads, head, group=topo.site_ranks)
        for src, h in zip(topo.members, heads):
            if int(h[2]):
                self.spread_range(src, int(h[3]), int(h[4]))
        return min(int(h[0]) for h in heads), all(int(h[1]) for h in heads)

    def spread_range(self, src: int, lo: int, hi: int) -> None:
        """[lo, hi) of the flat parameters, from ``src`` to the rest of the site, a chunk at a
        time: a fragment's values in fp32 would be the largest buffer a rank holds (100 MB for
        a 25M-parameter fragment), above its outer state's bound."""
        mine = src == dist.get_rank()
        buf = torch.empty(0) if mine else torch.empty(min(hi - lo, SPREAD_CHUNK))
        for a in range(lo, hi, SPREAD_CHUNK):
            b = min(hi, a + SPREAD_CHUNK)
            values = self.flat.read_flat(a, b) if mine else buf[:b - a]
            dist.broadcast(values, src=src, group=self.topo.site_ranks)
            if not mine:
                self.flat.write_flat(a, b, values)
