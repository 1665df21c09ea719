"""``OuterSync``: a rank's side of the rounds (see :mod:`linkpilot.outer`): its inner steps,
the fragments it sends and applies, the outer optimizer's steps, the hand-over inside a site."""

from __future__ import annotations

import collections
import datetime
import itertools
import logging
import threading
import time
from typing import Callable, Literal, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch._C._distributed_c10d import PrefixStore, Store
from torch.distributed.tensor import DTensor, Shard

from linkpilot.codecs import ErrorFeedback, get_codec
from linkpilot.jobreport import JobReport
from linkpilot.outer.exchange import RESYNC, Exchanger, Job, Resync
from linkpilot.outer.plan import (
    PlanInputs,
    RoundPlan,
    RoundStats,
    pack_header,
    plan_of,
    agree_plans,
    auto_sync_every,
    paced_share,
    site_plan,
)

from linkpilot.pgtimeout import member
from linkpilot.sites import check_sites, replica_sets, state_shards

log = logging.getLogger("linkpilot.outer")

__all__ = ["OuterSync"]

#: What a step brings to the site: ("apply", lo, hi, None, the exchange's stats, the fragment's
#: outer values right after its outer step) or ("resync", epoch, applied, plan, None, None).
_Note = tuple[str, int, int, RoundPlan | None, "RoundStats | None", torch.Tensor | None]
#: How long a site's other ranks wait for their leader's hand-over (it may be waiting out an
#: outage).
_HANDOVER_TIMEOUT = datetime.timedelta(days=1)
#: Inner steps whose compute time makes ``compute_s``.
_MEASURED = 16
#: The least an apply step waits for its exchange by default.
_MIN_PATIENCE_S = 0.1
#: Values a site's spread of a shard's outer step moves per broadcast (4 MiB of fp32).
_SPREAD_CHUNK = 1 << 20


def _local(p: torch.Tensor) -> torch.Tensor:
    """What this rank holds of a parameter: its shard of a sharded one (FSDP2's DTensor)."""
    return p.to_local() if isinstance(p, DTensor) else p


def _shard_of(params: Sequence[torch.Tensor]) -> tuple[int, int]:
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


class OuterSync:
    """See the module's doc. ``model``'s parameters must be the same on every rank when this is
    made (they are broadcast from rank 0 to make sure)."""

    def __init__(
        self,
        model: nn.Module,
        plan: RoundPlan,
        *,
        sites: Sequence[Sequence[int]] | None = None,
        plan_source: Callable[[PlanInputs], RoundPlan | None] | None = None,
        outer_lr: float = 1.0,
        outer_momentum: float = 0.0,
        nesterov: bool = True,
        deadline_s: float = 30.0,
        patience_s: float | None = None,
        max_drift: int | None = None,
        on_round: Callable[[RoundStats], None] | None = None,
        store: Store | None = None,
        job_report: JobReport | Literal["auto"] | None = "auto",
        pace: Literal["steps", "time"] = "steps",
        samples_per_step: int = 1,
        shard_state: bool = True,
    ) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        numel = sum(_local(p).numel() for p in self.params)
        self.plan = plan.check(numel)
        if outer_lr <= 0 or not 0 <= outer_momentum < 1:
            raise ValueError(f"outer_lr {outer_lr} must be > 0 and outer_momentum "
                             f"{outer_momentum} in [0, 1)")
        if deadline_s <= 0:
            raise ValueError(f"deadline_s {deadline_s} must be > 0")
        if patience_s is not None and not 0 <= patience_s <= deadline_s:
            raise ValueError(f"patience_s {patience_s} must be in [0, deadline_s {deadline_s}]")
        if pace not in ("steps", "time"):
            raise ValueError(f"pace {pace!r}: \"steps\" or \"time\"")
        if samples_per_step < 1:
            raise ValueError(f"samples_per_step {samples_per_step} must be >= 1")
        self.samples_per_step = samples_per_step
        self.patience_s = patience_s
        self.max_drift = max_drift if max_drift is not None else 4 * plan.sync_every
        if self.max_drift < plan.sync_every:
            raise ValueError(f"max_drift {self.max_drift}: at least one round "
                             f"({plan.sync_every} steps)")
        self.plan_source = plan_source
        self.outer_lr, self.momentum, self.nesterov = outer_lr, outer_momentum, nesterov
        self.deadline_s = deadline_s
        self.on_round = on_round
        #: The latest exchanges as this site saw them (the oldest dropped past 10,000).
        self.history: collections.deque[RoundStats] = collections.deque(maxlen=10_000)
        world, rank = dist.get_world_size(), dist.get_rank()
        # Sorted: a group's rank 0 is its smallest global rank, and the leader must be it.
        sites = [sorted(s) for s in sites] if sites else [[r] for r in range(world)]
        sites = check_sites(sites, world)
        self.n_sites = len(sites)
        self.site_index = next(i for i, s in enumerate(sites) if rank in s)
        site = sites[self.site_index]
        # The outer state lives in host memory (beside a large model on a GPU it would not fit)
        # and NCCL takes CUDA tensors only: whatever the job's backend, this class's own
        # collectives go over gloo groups of its own. Every rank makes every group, in the same
        # order (torch requires it).
        host = member(dist.new_group(backend="gloo"))
        # Parameters sharded inside the sites (FSDP2, HSDP): each shard is synchronized among
        # the ranks that hold it, as a job of its own (its replica set, by site); whole
        # parameters: one set, the whole job.
        mine = torch.tensor(_shard_of(self.params), dtype=torch.int64)
        everyone = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(everyone, mine, group=host)
        cuts = [(int(t[0]), int(t[1])) for t in everyone]
        # Whole parameters (DDP) in sites of several ranks: each rank of a site keeps and
        # exchanges a contiguous shard of the flat outer state, as many shards as the smallest
        # site has ranks (8 against 16: each of the 8 shards held by one rank there and two
        # here, the first of which exchanges it). Every rank holds the whole model, so what a
        # shard's outer step writes is spread to the rest of its site (_sync_site).
        self._spread = (shard_state and min(len(s) for s in sites) > 1
                        and all(c == (0, 1) for c in cuts))
        if self._spread:
            cuts = state_shards(sites)
        sets = replica_sets(sites, cuts)
        self.shard, self.shards = cuts[rank][0], len(sets)
        #: This rank's outer state: [base, base + its length) of its flat local parameters.
        self._base = numel * self.shard // self.shards if self._spread else 0
        numel = numel * (self.shard + 1) // self.shards - self._base if self._spread else numel
        self._len = numel
        self._site_members = site
        holders = sets[self.shard]  # this shard's holders, by site
        self.leader = holders[self.site_index][0] == rank
        # The site group is the user's (DDP, on the job's backend); a hand-over group carries
        # the leader's results to the other holders of its shard in its site, and waits while
        # the leader waits for a dead link: a day, not the default.
        users = [dist.new_group(s) for s in sites] if any(len(s) > 1 for s in sites) else []
        set_groups = [dist.new_group(sorted(r for h in by_site for r in h), backend="gloo")
                      for by_site in sets] if len(sets) > 1 else [host]
        handovers = [[dist.new_group(h, timeout=_HANDOVER_TIMEOUT, backend="gloo")
                      for h in by_site] for by_site in sets] if any(
            len(h) > 1 for by_site in sets for h in by_site) else []
        self.site_group: dist.ProcessGroup | None = (
            member(users[self.site_index]) if len(site) > 1 else None)
        self._handover: dist.ProcessGroup | None = (
            member(handovers[self.shard][self.site_index])
            if len(holders[self.site_index]) > 1 else None)
        replicas = member(set_groups[self.shard])
        # Each shard's rounds follow its own exchange, so one may begin a step later than
        # another's: the site's rounds_done is the least of its shards', agreed every step, so
        # that every rank of a site stops at the same step (their FSDP collectives must match).
        counts = [dist.new_group(s, timeout=_HANDOVER_TIMEOUT, backend="gloo") for s in sites
                  ] if len(sets) > 1 else []
        self._site_ranks: dist.ProcessGroup | None = (
            member(counts[self.site_index]) if len(sets) > 1 and len(site) > 1 else None)
        first = holders[0][0]
        # Every replica starts from the first holder's parameters and rank 0's plan: the first
        # round runs before any proposal was exchanged.
        words = torch.cat([pack_header(0, 0, 0, 0, self.plan, self.plan)[4:8],
                           torch.tensor([pace == "time", round(outer_momentum * 1e9)])])
        dist.broadcast(words, src=0, group=host)
        if int(words[5]) != round(outer_momentum * 1e9):
            log.warning("outer_momentum %g differs from rank 0's %g: rank 0's is used",
                        outer_momentum, int(words[5]) / 1e9)
            self.momentum = int(words[5]) / 1e9
        if plan_of(words[:4].tolist()) != self.plan:
            log.warning("plan %s differs from rank 0's %s: rank 0's is used", self.plan,
                        plan_of(words[:4].tolist()))
            self.plan = plan_of(words[:4].tolist()).check(numel)
        #: "time": a round lasts H steps of the fastest site and each site takes as many of its
        #: own as fit; "steps": every site takes H (rank 0's choice holds).
        self.pace = "time" if int(words[4]) else "steps"
        if self.pace != pace:
            log.warning("pace %r differs from rank 0's %r: rank 0's is used", pace, self.pace)
        self.plan = self.plan.check(numel)  # this rank's shard of the parameters
        #: This site's share of the round in force (its steps and overlap; the plan's when
        #: paced by steps).
        self.site_plan = self.plan
        self._carry = 0.0  # of paced_share, from round to round
        if self._spread:  # whole parameters everywhere: rank 0's, one tensor at a time
            with torch.no_grad():
                for p in self.params:
                    t = p.detach().to("cpu")  # p itself when on the host
                    dist.broadcast(t, src=0, group=host)
                    if t.data_ptr() != p.data_ptr():
                        p.copy_(t)
            flat = self._flatten()
        else:
            flat = self._flatten()
            dist.broadcast(flat, src=first, group=replicas)
            self._write(0, flat.numel(), flat)
        self.outer = flat  # a fresh copy (the flattening), written into the parameters
        # The outer step runs at the leader only: the others keep the outer values (handed
        # over); without momentum there is none to keep.
        self.velocity = (torch.zeros_like(self.outer) if self.leader and self.momentum > 0
                         else torch.zeros(0))
        self._feedback: dict[int, ErrorFeedback] = {}
        self.epoch = 0
        self.applied = 0  # fragment updates applied since the start
        self.step_count = 0
        #: Bytes this site's leader handed to the exchange (headers and payloads), so far.
        self.sent_bytes = 0
        self._round = 0
        #: Rounds whose last fragment this site sent (or skipped), of every shard: the same
        #: count at every rank of the site, never reset; stop a paced run on it.
        self.rounds_done = 0
        self._rounds_sent = 0  # of this rank's shard
        #: Whether close() ended with every site holding the same parameters (see close()).
        self.agreed_at_close: bool | None = None
        self._round_start = 0
        self._since_sync = 0
        #: Each round's first fragment exchange, by round (the latest two): its proposals decide
        #: the plan of a later round.
        self._plan_jobs: dict[int, Job] = {}
        #: The exchange whose proposals decide the round that has ended but not yet begun (its
        #: sends wait for it to land); None when the round in force has begun.
        self._pending: Job | None = None
        self._inflight: dict[int, Job] = {}  # apply step -> job
        #: Jobs past their apply step that had not landed, oldest first: applied as they land.
        self._late: collections.deque[Job] = collections.deque()
        self._finished_at = 0.0  # when the latest apply step began waiting
        self._resync: Resync | None = None
        #: Exchanges that landed and stepped the outer values but are not yet applied here:
        #: they take their values from the outer state at their apply step, unless the exchange
        #: thread is about to write their range first (see ``_keep_values``). Under ``_lock``.
        self._unapplied: list[Job] = []
        self._lock = threading.Lock()
        self._exchanger: Exchanger | None = None
        self._closing = False
        # Compute time between step calls (their own waiting taken out), the latest few.
        self._intervals: list[float] = []
        self._returned_at: float | None = None
        #: Each step's time, exposed wait (this class's own) and bytes, for the daemon ("auto":
        #: its job-report directory when it exists).
        self.job_report = (JobReport.auto(rank=rank, world=world, kind="outer")
                           if job_report == "auto" else job_report)
        self.failed_exchanges = 0
        self._reported = (0, 0)  # sent bytes and failed exchanges already reported
        if self.leader:
            leaders = [h[0] for h in holders]
            store = store or dist.distributed_c10d._get_default_store()
            if len(sets) > 1:  # each shard's leaders meet on keys of their own
                store = PrefixStore(f"linkpilot-outer-shard/{self.shard}", store)
            self._exchanger = Exchanger(self, store, self.site_index, self.n_sites, leaders)

    # -- the flat parameters ---------------------------------------------------------------------

    def _flatten(self) -> torch.Tensor:
        """This rank's outer state's part of its parameters, as one fresh fp32 host tensor."""
        return self._read(0, self._len)

    def _read(self, lo: int, hi: int) -> torch.Tensor:
        """[lo, hi) of this rank's outer state, read from its parameters."""
        return self._read_flat(self._base + lo, self._base + hi)

    def _write(self, lo: int, hi: int, values: torch.Tensor) -> None:
        self._write_flat(self._base + lo, self._base + hi, values)

    def _read_flat(self, lo: int, hi: int) -> torch.Tensor:
        parts, at = [], 0
        for p in self.params:
            local = _local(p).detach()
            n = local.numel()
            a, b = max(lo, at), min(hi, at + n)
            if a < b:
                parts.append(local.reshape(-1)[a - at:b - at].to("cpu", torch.float32))
            at += n
        return torch.cat(parts)

    def _write_flat(self, lo: int, hi: int, values: torch.Tensor) -> None:
        at = 0
        with torch.no_grad():
            for p in self.params:
                local = _local(p)
                n = local.numel()
                a, b = max(lo, at), min(hi, at + n)
                if a < b:
                    local.view(-1)[a - at:b - at].copy_(values[a - lo:b - lo])
                at += n

    def _range(self, fragment: int, plan: RoundPlan) -> tuple[int, int]:
        n = self.outer.numel()
        return fragment * n // plan.fragments, (fragment + 1) * n // plan.fragments

    # -- the training side's step ----------------------------------------------------------------

    def step(self) -> None:
        """Call after every inner optimizer step."""
        if self._exchanger is not None and self._exchanger.error is not None:
            raise RuntimeError("the cross-site exchange thread stopped") from self._exchanger.error
        called = time.monotonic()
        last_returned = self._returned_at
        if last_returned is not None:
            self._intervals = [*self._intervals[-(_MEASURED - 1):], called - last_returned]
        try:
            self._step()
        finally:
            self._returned_at = time.monotonic()
        if self.job_report is not None and last_returned is not None:
            self._report(self._returned_at - last_returned, self._returned_at - called)

    def _report(self, step_s: float, wait_s: float) -> None:
        """The step since the previous call returned: its wall time (the inner step and this
        call) and this call's own wait; bytes and failures since the last report."""
        assert self.job_report is not None
        failed = self.failed_exchanges
        sent, was_failed = self._reported
        self._reported = (self.sent_bytes, failed)
        self.job_report.step(step_s=step_s, wait_s=wait_s, wire_bytes=self.sent_bytes - sent,
                             codec=self.plan.codec, sync_every=self.plan.sync_every,
                             failed=max(0, failed - was_failed))

    @property
    def compute_s(self) -> float:
        """The median of the latest inner steps' compute time (0 until 3 were measured)."""
        if len(self._intervals) < 3:
            return 0.0
        return sorted(self._intervals)[len(self._intervals) // 2]

    def _step(self) -> None:
        self.step_count += 1
        self._since_sync += 1
        plan = self.plan
        at = self.step_count - self._round_start
        note = self._leader_step(plan, at) if self.leader else None
        if self._handover is not None:
            note = self._hand_over(note)
        self._apply(note)
        self._sync_site(note)

    def _sync_site(self, note: _Note | None, ok: bool = True) -> bool:
        """With several shards in a site: the rounds every shard completed, and (DDP) what each
        shard's leader wrote this step, spread to the rest of the site; whether every shard's
        ``ok`` held. Every rank of the site calls it at the same points."""
        head = torch.tensor([self._rounds_sent, ok, 0, 0, 0], dtype=torch.int64)
        if self._spread and self.leader and note is not None:
            kind, a, b = note[:3]
            lo, hi = (a, b) if kind == "apply" else (0, self.outer.numel())
            head[2:] = torch.tensor([1, self._base + lo, self._base + hi])
        if self._site_ranks is None:
            self.rounds_done = self._rounds_sent
            return ok
        heads = [torch.empty_like(head) for _ in self._site_members]
        dist.all_gather(heads, head, group=self._site_ranks)
        self.rounds_done = min(int(h[0]) for h in heads)
        for src, h in zip(self._site_members, heads):
            if int(h[2]):
                self._spread_range(src, int(h[3]), int(h[4]))
        return all(int(h[1]) for h in heads)

    def _spread_range(self, src: int, lo: int, hi: int) -> None:
        """[lo, hi) of the flat parameters, from ``src`` to the rest of the site, a chunk at a
        time: a fragment's values in fp32 would be the largest buffer a rank holds (100 MB for
        a 25M-parameter fragment), above its outer state's bound."""
        mine = src == dist.get_rank()
        buf = torch.empty(0) if mine else torch.empty(min(hi - lo, _SPREAD_CHUNK))
        for a in range(lo, hi, _SPREAD_CHUNK):
            b = min(hi, a + _SPREAD_CHUNK)
            values = self._read_flat(a, b) if mine else buf[:b - a]
            dist.broadcast(values, src=src, group=self._site_ranks)
            if not mine:
                self._write_flat(a, b, values)

    def _leader_step(self, plan: RoundPlan, at: int) -> _Note | None:
        """What this step brings to the site (the leader decides): a resync, a fragment to
        apply, or nothing; this step's send is made here too."""
        assert self._exchanger is not None
        with self._lock:
            resync, self._resync = self._resync, None
        if resync is not None:
            return ("resync", resync.epoch, resync.applied, resync.plan, None, None)
        note = None
        job = self._inflight.pop(self.step_count, None)
        if job is not None:
            note = self._finish(job)
        if self._pending is not None:
            self._begin_round()
            at = self.step_count - self._round_start
        plan = self.site_plan
        between = plan.sync_every // plan.fragments
        if (self._pending is None and at > 0 and at % between == 0
                and at // between <= plan.fragments):
            self._send(at // between - 1, plan)
            job = self._inflight.pop(self.step_count, None)  # overlap 0: applied at once
            if job is not None:
                note = self._finish(job) or note
        if note is None:
            note = self._land_late()
        if self._since_sync > max(self.max_drift, plan.sync_every + plan.overlap) and not (
                self._exchanger.finished):
            note = self._wait_for_link(note)
        return note

    def _send(self, fragment: int, mine: RoundPlan) -> None:
        """Sends ``fragment`` under the plan in force, this site's share of it being ``mine``."""
        assert self._exchanger is not None
        plan = self.plan
        lo, hi = self._range(fragment, plan)
        stats = RoundStats(self.epoch, self._round, fragment, self.step_count, plan,
                           get_codec(plan.codec).wire_bytes(hi - lo), lo, hi,
                           site_steps=mine.sync_every,
                           weight=mine.sync_every * self.samples_per_step)
        with self._lock:
            resync_pending = self._resync is not None
        if self._exchanger.final_agreed:
            pass  # another site closed: this one trains on alone, with nothing to send
        elif not self._exchanger.up or resync_pending:
            stats.outcome = "skipped"
            self._record(stats)
        else:
            proposal = self._proposal(plan)
            header = pack_header(self.epoch, self._round, fragment, self.applied, plan, proposal,
                             step_us=round(self.compute_s * 1e6),
                             weight=stats.weight).view(torch.uint8)
            codec = get_codec(plan.codec)
            # The payload is encoded in place behind the header, a chunk at a time: nothing of
            # the fragment's size is made in float32 (see ErrorFeedback.encode_chunked).
            message = torch.empty(header.numel() + codec.wire_bytes(hi - lo), dtype=torch.uint8)
            message[:header.numel()] = header
            fb = self._feedback.setdefault(fragment, ErrorFeedback(torch.float16))

            def pseudo(a: int, b: int) -> torch.Tensor:
                with self._lock:  # a chunk's outer values are read whole
                    return self.outer[lo + a:lo + b] - self._read(lo + a, lo + b)

            fb.encode_chunked(codec, hi - lo, pseudo,
                              message[header.numel():].view(codec.payload_dtype))
            job = Job(stats, message, lo, hi)
            self.sent_bytes += message.numel()
            self._inflight[self.step_count + mine.overlap] = job
            self._exchanger.jobs.put(job)
            if fragment == 0:
                self._plan_jobs[self._round] = job
        if fragment == plan.fragments - 1:
            # The round's last send: the next round's plan is in the proposals of this round's
            # first exchange (with one fragment a round, the previous round's); it begins once
            # that exchange has landed here.
            source = self._round - (1 if plan.fragments == 1 else 0)
            self._round += 1
            self._rounds_sent += 1
            self._pending = self._plan_jobs.pop(source, None)
            self._plan_jobs = {r: j for r, j in self._plan_jobs.items() if r >= source}
            if self._pending is None:  # skipped (the exchange was down): the plan holds
                self._round_start = self.step_count
            else:
                self._begin_round()

    def _begin_round(self) -> None:
        """Begins the round that ended waiting for its plan's exchange, if that exchange landed
        (its proposals' agreement), failed or ran out of time (the plan in force holds: a
        failure is followed by a resync, which sets the plan). A new plan waits until nothing
        sent under the old one is in flight (a new cut of the parameters, or apply steps that
        would collide)."""
        job, ex = self._pending, self._exchanger
        assert job is not None and ex is not None
        new, mine, carry = self.plan, self.site_plan, self._carry
        if job.done.is_set():
            if job.ok:
                new = agree_plans(job.proposals).check(self.outer.numel())
                mine, carry = (paced_share(new, job.step_us, self.site_index, self._carry)
                               if self.pace == "time" else (new, 0.0))
        elif not (job.abandoned or not ex.up
                  or time.monotonic() - job.sent_at >= self.deadline_s):
            return
        self._pending = None
        self._round_start = self.step_count
        self._carry = carry if new == self.plan else 0.0
        if (new, mine) != (self.plan, self.site_plan):
            # A share that only moved by the carry begins now, unless its first apply step
            # would come before one still in flight (the steps must stay in send order).
            first = self.step_count + mine.sync_every // mine.fragments + mine.overlap
            if new != self.plan or any(k >= first for k in self._inflight):
                self._round_start = max([self.step_count, *self._inflight])
            if new.fragments != self.plan.fragments:
                self._feedback.clear()
            self.plan, self.site_plan = new, mine

    def _proposal(self, plan: RoundPlan) -> RoundPlan:
        """The plan source's proposal, checked; the plan in force when it has none or a bad
        one (a proposal must never stop training: it is logged)."""
        if self.plan_source is None:
            return plan
        try:
            got = self.plan_source(PlanInputs(plan, self.outer.numel(), self.n_sites,
                                              self.compute_s, self._exchange_s(plan)))
            return got.check(self.outer.numel()) if got is not None else plan
        except Exception as e:  # a board gone bad mid-run must not stop training
            log.warning("plan source failed (%s): proposing the plan in force", e)
            return plan

    def _exchange_s(self, plan: RoundPlan) -> float:
        """The median of the latest exchanges applied with ``plan``'s fragments and codec."""
        took = [s.exchange_s for s in itertools.islice(reversed(self.history), _MEASURED)
                if s.outcome == "applied" and s.exchange_s > 0
                and (s.plan.fragments, s.plan.codec) == (plan.fragments, plan.codec)]
        return sorted(took)[len(took) // 2] if took else 0.0

    def patience(self) -> float:
        """How long an apply step waits for its exchange before going on without it: by
        default about one inner step (a late exchange costs a few steps of staleness, a wait
        costs the steps themselves)."""
        if self.patience_s is not None:
            return self.patience_s
        return min(self.deadline_s, max(_MIN_PATIENCE_S, self.compute_s))

    def _finish(self, job: Job, patience: float | None = None) -> _Note | None:
        """The job's result at its apply step: waits for it up to the patience, or when the
        exchange is down not at all; not landed by then, it goes on the late list and is
        applied when it lands. Behind late jobs it waits only if an exchange landed since the
        previous apply step (the link is back: a site ahead of the others, which stepped less
        meanwhile, lets them catch up); else the link is still out and it does not wait."""
        assert self._exchanger is not None
        started = time.monotonic()
        wait = self.patience() if patience is None else patience
        if self._late and self._exchanger.landed_at < self._finished_at:
            wait = 0.0
        self._finished_at = started
        # Until the patience or the deadline, or until the exchange thread found the link down
        # (a job queued behind a failed one would wait for nothing).
        while self._exchanger.up and not job.done.is_set():
            now = time.monotonic()
            left = min(wait - (now - started), self.deadline_s - (now - job.sent_at))
            if left <= 0:
                break
            job.done.wait(min(left, 0.05))
        job.stats.waited_s = time.monotonic() - started
        # Behind late jobs it waits its turn, even if it landed: a fragment's older values must
        # never overwrite its newer ones.
        if self._late or (not job.done.is_set() and self._exchanger.up
                          and time.monotonic() - job.sent_at < self.deadline_s):
            job.due = self.step_count
            self._late.append(job)
            return None
        return self._settle(job)

    def _land_late(self) -> _Note | None:
        """The oldest late job, applied (or given up on) once it landed, failed or ran out of
        time; one applied job a step (a site's other ranks take one note a step)."""
        assert self._exchanger is not None
        while self._late:
            job = self._late[0]
            if (job.done.is_set() or not self._exchanger.up
                    or time.monotonic() - job.sent_at >= self.deadline_s):
                self._late.popleft()
                job.stats.late_steps = self.step_count - job.due
                note = self._settle(job)
                if note is not None:
                    return note
            else:
                return None
        return None

    def _settle(self, job: Job) -> _Note | None:
        """The job's outcome, now: applied if it landed whole, else given up on."""
        with job.lock:
            if not job.done.is_set():
                job.abandoned = True
                job.stats.outcome = "late"
            elif not job.ok:
                job.stats.outcome = "failed"
            else:
                job.stats.outcome = "applied"
        if job.stats.outcome != "applied":
            self._record(job.stats)
            return None
        self.applied += 1
        # The note carries the values from here: a job kept for its proposals keeps none.
        with self._lock:
            values, job.values = job.values, None
            if values is None:  # nothing wrote its range since its outer step
                values = self.outer[job.lo:job.hi].clone()
            if job in self._unapplied:
                self._unapplied.remove(job)
        return ("apply", job.lo, job.hi, None, job.stats, values)

    def _wait_for_link(self, note: _Note | None) -> _Note | None:
        """Past the drift bound: wait for the exchange to come back (it resyncs first), unless
        another site ended its run (then nothing will come back: training goes on alone)."""
        ex = self._exchanger
        assert ex is not None
        if note is not None and note[0] == "apply":
            return note  # this step syncs a fragment
        log.warning("%d inner steps since the last sync (max_drift %d): waiting for the link",
                    self._since_sync, self.max_drift)
        # Late exchanges first: the link may be slow rather than gone, and one that lands is a
        # sync. Only when none is left (landed, failed or past its deadline) is a resync asked.
        while self._late and ex.up and not self._closing:
            landed = self._land_late()
            if landed is not None:
                return landed
            if self._late:
                self._late[0].done.wait(0.05)
        if note is not None:
            self._apply(note)
        asked = False
        while True:
            if ex.error is not None:
                raise RuntimeError("the cross-site exchange thread stopped") from ex.error
            with self._lock:
                resync, self._resync = self._resync, None
            if resync is not None:
                return ("resync", resync.epoch, resync.applied, resync.plan, None, None)
            if ex.finished or self._closing:
                return None
            if not asked:
                ex.jobs.put((RESYNC, self.epoch))
                asked = True
            time.sleep(0.05)

    def _hand_over(self, note: _Note | None) -> _Note | None:
        """The leader's note, and the values it brings, to every rank of the site; with it the
        plan in force (the other ranks report it: only the leader follows the rounds)."""
        assert self._handover is not None
        head = torch.zeros(17, dtype=torch.int64)
        if self.leader:
            head[12:16] = pack_header(0, 0, 0, 0, self.plan, self.plan)[4:8]
            head[16] = self._rounds_sent
        if self.leader and note is not None:
            kind, a, b, plan, stats, _ = note
            head[:3] = torch.tensor([1 if kind == "apply" else 2, a, b])
            if stats is not None:
                plan = stats.plan
                head[7:12] = torch.tensor([stats.epoch, stats.round, stats.fragment, stats.step,
                                           stats.wire_bytes])
            if plan is not None:
                head[3:7] = pack_header(0, 0, 0, 0, plan, plan)[4:8]
        src = dist.get_global_rank(self._handover, 0)
        dist.broadcast(head, src=src, group=self._handover)
        if not self.leader:
            self.plan = plan_of(head[12:16].tolist())
            self._rounds_sent = int(head[16])
        kind_code, a, b = (int(x) for x in head[:3])
        if kind_code == 0:
            return None
        plan = plan_of(head[3:7].tolist())
        if kind_code == 1:
            values = note[5] if self.leader and note is not None else None
            if values is None:
                values = torch.empty(b - a)
            dist.broadcast(values, src=src, group=self._handover)
            if self.leader:
                return note
            self.outer[a:b] = values
            e, r, f, sent, wire = (int(x) for x in head[7:12])
            stats = RoundStats(e, r, f, sent, plan, wire, a, b, "applied")
            return ("apply", a, b, None, stats, values)
        with self._lock:
            full = self.outer.clone() if self.leader else torch.empty_like(self.outer)
        dist.broadcast(full, src=src, group=self._handover)
        if not self.leader:
            self.outer.copy_(full)
        return ("resync", a, b, plan, None, None)

    def _apply(self, note: _Note | None) -> None:
        if note is None:
            return
        kind, a, b, plan, stats, values = note
        if kind == "apply":
            assert values is not None
            self._write(a, b, values)
            if stats is not None:  # recorded once written: on_round sees the values in place
                self._record(stats)
            self._since_sync = 0
            return
        # A resync: the whole outer state, a new round from here.
        assert plan is not None
        with self._lock:
            values = self.outer.clone()
            self._unapplied.clear()
        self._write(0, values.numel(), values)
        self.epoch, self.applied = a, b
        self._inflight.clear()
        self._late.clear()
        self._feedback.clear()
        self._round, self._round_start, self._since_sync = 0, self.step_count, 0
        self._plan_jobs.clear()
        self._pending = None
        self.plan = self.site_plan = plan  # paced again from the next agreement
        self._carry = 0.0
        log.info("resync: epoch %d, %d fragment updates, plan %s", a, b, plan)

    def _record(self, stats: RoundStats) -> None:
        self.history.append(stats)
        self.failed_exchanges += stats.outcome == "failed"
        if self.on_round is not None:
            self.on_round(stats)

    # -- the outer step, on the exchange thread ----------------------------------------------------

    def _keep_values(self, lo: int, hi: int) -> None:
        """Before the exchange thread writes outer [lo, hi): each landed, unapplied exchange
        over that range keeps its values as they are (a late apply step writes the values of its
        own outer step, never a later one's). Held: ``_lock``."""
        for job in self._unapplied:
            if job.values is None and job.lo < hi and lo < job.hi:
                job.values = self.outer[job.lo:job.hi].clone()

    def _outer_step(self, lo: int, hi: int, pseudo: torch.Tensor) -> None:
        if self.momentum == 0:
            self.outer[lo:hi] -= self.outer_lr * pseudo
            return
        v = self.velocity[lo:hi]
        v.mul_(self.momentum).add_(pseudo)
        step = pseudo + self.momentum * v if self.nesterov else v
        self.outer[lo:hi] -= self.outer_lr * step

    def close(self) -> bool:
        """Ends this site's part: finishes the exchanges in flight as their apply steps would
        (each waited for up to its deadline, then applied or given up on), then makes the
        site's last exchange, which hands every site the outer state of the one that applied
        the most updates, and writes that state into every rank's parameters. The result is
        the last synchronized model, the same at every site: inner steps since each fragment's
        last sync are dropped, and a site still training when another closed (it met the last
        exchange in place of its next one) trains on alone and, at its own close, goes back to
        that same state. Returns (and keeps in ``agreed_at_close``) whether every site holds it:
        False when the link was down at the end or another site left without the last
        exchange, and then this site's parameters are its own last outer state, which is
        logged. Tells the other sites this one ended. Every rank of a site calls it."""
        self._closing = True
        count = torch.tensor([len(self._late) + len(self._inflight)], dtype=torch.int64)
        if self._handover is not None:
            dist.broadcast(count, src=dist.get_global_rank(self._handover, 0),
                           group=self._handover)
        for _ in range(int(count[0])):
            note = None
            if self.leader and self._late:
                job = self._late.popleft()
                job.done.wait(max(0.0, self.deadline_s - (time.monotonic() - job.sent_at)))
                note = self._settle(job)
            elif self.leader:
                note = self._finish(self._inflight.pop(min(self._inflight)), self.deadline_s)
            if self._handover is not None:
                note = self._hand_over(note)
            self._apply(note)
        agreed = self._exchanger.final() if self._exchanger is not None else False
        with self._lock:
            final = self.outer.clone()
        flag = torch.tensor([agreed], dtype=torch.int64)
        if self._handover is not None:
            src = dist.get_global_rank(self._handover, 0)
            dist.broadcast(flag, src=src, group=self._handover)
            dist.broadcast(final, src=src, group=self._handover)
            self.outer.copy_(final)
        self._write(0, final.numel(), final)
        # Every shard's last state to the whole site; agreed only where every shard agreed.
        self.agreed_at_close = self._sync_site(("resync", 0, 0, None, None, None), bool(flag[0]))
        if not self.agreed_at_close:
            log.warning("closed without the last exchange (the link was down, or another site "
                        "left first): site %d's parameters are its own last outer state, which "
                        "may differ from the other sites'", self.site_index)
        if self._exchanger is not None:
            self._exchanger.stop()
        if self.job_report is not None:
            self.job_report.close()
        return self.agreed_at_close
