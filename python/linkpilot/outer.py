"""Synchronizing across sites every H steps: inner steps stay inside a site, and every round the
sites exchange compressed pseudo-gradients (the change of the parameters since the last sync),
fragment by fragment, overlapped with the inner steps that follow, and apply them with an outer
optimizer (the DiLoCo family: DiLoCo, Streaming DiLoCo).

    sync = OuterSync(model, RoundPlan(sync_every=50, fragments=4, overlap=5, codec="int8"))
    for batch in data:
        inner_optimizer.zero_grad(); loss(model, batch).backward(); inner_optimizer.step()
        sync.step()

One rank per site (``sites`` None: every rank is a site) trains with a plain optimizer; with
several ranks per site, wrap the model in DDP over ``sync.site_group`` and the site's leader
(its first rank) exchanges for the site, handing every result to its site in the same step.

The schedule is counted in each site's own inner steps. A round of H steps sends fragment f
(of F contiguous parts of the flat parameters) at step (f + 1) * H / F of the round and applies
it ``overlap`` steps later: then every replica holds the same values for that fragment, the
outer optimizer's result from the same averaged pseudo-gradient. The exchange runs on a thread
of its own over a process group of the site leaders, built on a prefix of the job's store so
that it can be built again after a failure.

Agreement without a round trip: every message carries the sender's plan proposal (H, F,
overlap, codec; from ``plan_source``, e.g. the knob board), and a round starts with the
agreement of the proposals of the last exchange applied before it (the largest H, F and
overlap, the strongest codec): every site applied the same exchanges at the same points, so
every site computes the same plan.

Riding through an outage: an exchange that fails (its peer gone, the link dead past
``deadline_s``) is given up on; sites keep taking inner steps (sends are skipped while the
exchange is down) up to ``max_drift`` steps since their last sync, then wait. The exchange
thread builds its process group again (a new generation on the store, numbered by the first
site's leader once every leader said it is ready for it) and starts with a resync: the sites compare how many fragment updates each applied,
the one that applied most (the first of equals) sends its whole outer state, and every site
adopts it, sets its parameters to it, and starts a new round: all replicas are identical again.
"""

from __future__ import annotations

import collections
import datetime
import itertools
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, Store

from linkpilot.codecs import CODEC_NAMES, ErrorFeedback, get_codec

log = logging.getLogger("linkpilot.outer")

__all__ = ["OuterSync", "PlanInputs", "RoundPlan", "RoundStats", "auto_sync_every", "agree_plans"]


@dataclass(frozen=True)
class RoundPlan:
    """How a round runs: ``sync_every`` inner steps per round, the parameters cut into
    ``fragments`` parts, each applied ``overlap`` steps after it is sent, pseudo-gradients sent
    with ``codec`` (with error feedback)."""

    sync_every: int
    fragments: int = 1
    overlap: int = 0
    codec: str = "int8"

    def check(self, numel: int | None = None) -> RoundPlan:
        """Raises ValueError naming what is wrong; returns the plan with the codec's canonical
        name."""
        codec = get_codec(self.codec).name  # raises for an unknown codec
        _, _, ratio = codec.partition(":")
        if ratio and round(float(ratio) * 1e6) < 1:
            raise ValueError(f"codec {self.codec}: a kept fraction below 1e-6 cannot be "
                             "carried in a message's header")
        if self.sync_every < 1:
            raise ValueError(f"sync_every {self.sync_every}: at least 1 inner step per round")
        if self.fragments < 1 or self.fragments > self.sync_every:
            raise ValueError(f"fragments {self.fragments}: from 1 to sync_every "
                             f"({self.sync_every}), one send per step at most")
        if numel is not None and self.fragments > numel:
            raise ValueError(f"fragments {self.fragments}: more than the {numel} parameters")
        if self.overlap < 0 or self.overlap >= self.sync_every // self.fragments:
            raise ValueError(f"overlap {self.overlap}: from 0 to below the steps between two "
                             f"sends ({self.sync_every // self.fragments})")
        return replace(self, codec=codec)


def _strength(codec: str) -> tuple[int, float]:
    name, _, ratio = codec.partition(":")
    return CODEC_NAMES.index(name), -float(ratio) if ratio else 0.0


def agree_plans(plans: Sequence[RoundPlan]) -> RoundPlan:
    """What every site runs given every site's proposal: the largest H, fragment count and
    overlap and the strongest codec (the site that sees the worst link decides), with the
    overlap kept below the steps between two sends."""
    h = max(p.sync_every for p in plans)
    f = min(max(p.fragments for p in plans), h)
    overlap = min(max(p.overlap for p in plans), h // f - 1)
    codec = max((p.codec for p in plans), key=_strength)
    return RoundPlan(h, f, overlap, codec)


def auto_sync_every(*, rate_bps: float, rtt_s: float, compute_s: float, numel: int,
                    codec: str, sites: int, fragments: int, margin: float, bounds: tuple[int, int],
                    measured_s: float = 0.0) -> tuple[int, int]:
    """H and the overlap for which one fragment's exchange fits inside the compute it overlaps
    with, with ``margin`` to spare: an exchange is one all_gather of every site's fragment
    (a round trip and the bytes of the other sites at ``rate_bps``, or ``measured_s`` when the
    exchanges of this size took longer: a connection that idled between sends restarts from a
    small window and takes several round trips); it gets ``overlap`` inner steps of
    ``compute_s`` each, and sends come H / F steps apart. H within ``bounds``."""
    if rate_bps <= 0 or compute_s <= 0:
        return bounds[1], max(0, min(bounds[1] // fragments - 1, bounds[1] - 1))
    frag = math.ceil(numel / fragments)
    wire = get_codec(codec).wire_bytes(frag) * (sites - 1)
    exchange_s = max(rtt_s + 8 * wire / rate_bps, measured_s) * (1 + margin)
    overlap = math.ceil(exchange_s / compute_s)
    h = max(bounds[0], min(bounds[1], fragments * (overlap + 1)))
    return h, min(overlap, h // fragments - 1)


@dataclass(frozen=True)
class PlanInputs:
    """What a ``plan_source`` is told when it is asked for a proposal: the plan in force, the
    synchronized parameters' count, the number of sites, the median compute time of this
    site's recent inner steps (everything between two ``step`` calls but their own waiting;
    0 until a few steps were measured), and the median time of this site's latest exchanges
    under the plan in force's fragments and codec (0 until one completed)."""

    plan: RoundPlan
    numel: int
    sites: int
    compute_s: float
    exchange_s: float = 0.0


# -- the messages --------------------------------------------------------------------------------

_HEADER = 16  # int64 words
_PLAN_AT = 8


def _header(epoch: int, rnd: int, fragment: int, applied: int, plan: RoundPlan,
            proposal: RoundPlan) -> torch.Tensor:
    def words(p: RoundPlan) -> list[int]:
        name, _, ratio = p.codec.partition(":")
        ppm = round(float(ratio) * 1e6) if ratio else 0
        return [p.sync_every, p.fragments, p.overlap, CODEC_NAMES.index(name) << 32 | ppm]
    h = [epoch, rnd, fragment, applied, *words(plan), *words(proposal)]
    return torch.tensor(h + [0] * (_HEADER - len(h)), dtype=torch.int64)


def _plan_of(words: Sequence[int]) -> RoundPlan:
    name = CODEC_NAMES[min(int(words[3]) >> 32, len(CODEC_NAMES) - 1)]
    ppm = int(words[3]) & 0xFFFFFFFF
    codec = f"topk:{ppm / 1e6:g}" if name == "topk" else name
    return RoundPlan(int(words[0]), int(words[1]), int(words[2]), codec)


@dataclass
class RoundStats:
    """One exchange as this site saw it: what was sent, how long the exchange took, whether it
    was applied, given up on, or a resync."""

    epoch: int
    round: int
    fragment: int
    step: int
    plan: RoundPlan
    wire_bytes: int
    #: The fragment's place in the flat parameters: [lo, hi).
    lo: int = 0
    hi: int = 0
    outcome: str = "pending"  # applied, late, failed, skipped
    exchange_s: float = 0.0
    waited_s: float = 0.0


class _Job:
    def __init__(self, stats: RoundStats, message: torch.Tensor | None, lo: int, hi: int) -> None:
        self.stats, self.message, self.lo, self.hi = stats, message, lo, hi
        self.sent_at = time.monotonic()
        self.done = threading.Event()
        self.ok = False
        self.abandoned = False
        self.proposals: list[RoundPlan] = []
        self.lock = threading.Lock()


@dataclass
class _Resync:
    epoch: int
    applied: int
    plan: RoundPlan


#: What a step brings to the site: ("apply", lo, hi, None, the exchange's stats) or ("resync",
#: epoch, applied, plan, None).
_Note = tuple[str, int, int, RoundPlan | None, "RoundStats | None"]
#: Asks the exchange thread for a resync (past the drift bound), with the epoch it was asked in.
_RESYNC = "resync"


class _PeerDone(Exception):
    """Another site's leader ended its run."""
#: The store key of the generation the first leader announced, and how often a leader tries
#: again after a failed build.
_GENERATION = "linkpilot-outer/generation"
_RETRY_S = 1.0
#: Store keys of the sites' leaders that ended their run, and how long one wait on the store
#: lasts before the thread looks whether to stop waiting.
_CLOSED = "linkpilot-outer/closed"
_WAIT_S = 10.0
#: How long building a group may take (its collectives get ``deadline_s``).
_CONNECT_S = 60.0
#: How long a site's other ranks wait for their leader's hand-over (it may be waiting out an
#: outage).
_HANDOVER_TIMEOUT = datetime.timedelta(days=1)
#: Inner steps whose compute time makes ``compute_s``.
_MEASURED = 16


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
        max_drift: int | None = None,
        on_round: Callable[[RoundStats], None] | None = None,
        store: Store | None = None,
    ) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        numel = sum(p.numel() for p in self.params)
        self.plan = plan.check(numel)
        self._next_plan = self.plan
        if outer_lr <= 0 or not 0 <= outer_momentum < 1:
            raise ValueError(f"outer_lr {outer_lr} must be > 0 and outer_momentum "
                             f"{outer_momentum} in [0, 1)")
        if deadline_s <= 0:
            raise ValueError(f"deadline_s {deadline_s} must be > 0")
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
        if sorted(r for s in sites for r in s) != list(range(world)) or len(
                {len(s) for s in sites}) != 1:
            raise ValueError(f"sites {sites} must be equal-sized groups covering ranks "
                             f"0..{world - 1}")
        self.n_sites = len(sites)
        self.site_index = next(i for i, s in enumerate(sites) if rank in s)
        site = sites[self.site_index]
        self.leader = site[0] == rank
        # Every rank makes every group (torch requires it); the site group is the user's (DDP),
        # the second one carries this class's hand-over inside the site.
        # The hand-over waits while the leader waits for a dead link: a day, not the default.
        groups = [(dist.new_group(s), dist.new_group(s, timeout=_HANDOVER_TIMEOUT))
                  for s in sites] if len(site) > 1 else []
        self.site_group: dist.ProcessGroup | None = None
        self._handover: dist.ProcessGroup | None = None
        if groups:
            user, handover = groups[self.site_index]
            assert isinstance(user, dist.ProcessGroup) and isinstance(handover, dist.ProcessGroup)
            self.site_group, self._handover = user, handover
        # Every replica starts from rank 0's parameters and plan: the first round runs before
        # any proposal was exchanged.
        words = _header(0, 0, 0, 0, self.plan, self.plan)[4:8].clone()
        dist.broadcast(words, src=0)
        if _plan_of(words.tolist()) != self.plan:
            log.warning("plan %s differs from rank 0's %s: rank 0's is used", self.plan,
                        _plan_of(words.tolist()))
            self.plan = _plan_of(words.tolist()).check(numel)
        self._next_plan = self.plan
        flat = self._flatten()
        dist.broadcast(flat, src=0)
        self._write(0, flat.numel(), flat)
        self.outer = flat.clone()
        self.velocity = torch.zeros_like(self.outer)
        self._feedback: dict[int, ErrorFeedback] = {}
        self.epoch = 0
        self.applied = 0  # fragment updates applied since the start
        self.step_count = 0
        #: Bytes this site's leader handed to the exchange (headers and payloads), so far.
        self.sent_bytes = 0
        self._round = 0
        self._round_start = 0
        self._since_sync = 0
        self._inflight: dict[int, _Job] = {}  # apply step -> job
        self._resync: _Resync | None = None
        self._lock = threading.Lock()
        self._exchanger: _Exchanger | None = None
        self._closing = False
        # Compute time between step calls (their own waiting taken out), the latest few.
        self._intervals: list[float] = []
        self._returned_at: float | None = None
        if self.leader:
            leaders = [s[0] for s in sites]
            self._exchanger = _Exchanger(self, store or dist.distributed_c10d._get_default_store(),
                                         self.site_index, self.n_sites, leaders)

    # -- the flat parameters ---------------------------------------------------------------------

    def _flatten(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1).to("cpu", torch.float32) for p in self.params])

    def _read(self, lo: int, hi: int) -> torch.Tensor:
        parts, at = [], 0
        for p in self.params:
            n = p.numel()
            a, b = max(lo, at), min(hi, at + n)
            if a < b:
                parts.append(p.detach().reshape(-1)[a - at:b - at].to("cpu", torch.float32))
            at += n
        return torch.cat(parts)

    def _write(self, lo: int, hi: int, values: torch.Tensor) -> None:
        at = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                a, b = max(lo, at), min(hi, at + n)
                if a < b:
                    p.view(-1)[a - at:b - at].copy_(values[a - lo:b - lo])
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
        if self._returned_at is not None:
            self._intervals = [*self._intervals[-(_MEASURED - 1):], called - self._returned_at]
        try:
            self._step()
        finally:
            self._returned_at = time.monotonic()

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

    def _leader_step(self, plan: RoundPlan, at: int) -> _Note | None:
        """What this step brings to the site (the leader decides): a resync, a fragment to
        apply, or nothing; this step's send is made here too."""
        assert self._exchanger is not None
        with self._lock:
            resync, self._resync = self._resync, None
        if resync is not None:
            return ("resync", resync.epoch, resync.applied, resync.plan, None)
        note = None
        job = self._inflight.pop(self.step_count, None)
        if job is not None:
            note = self._finish(job)
        between = plan.sync_every // plan.fragments
        if at > 0 and at % between == 0 and at // between <= plan.fragments:
            self._send(at // between - 1, plan)
            job = self._inflight.pop(self.step_count, None)  # overlap 0: applied at once
            if job is not None:
                note = self._finish(job)
        if self._since_sync > max(self.max_drift, plan.sync_every + plan.overlap) and not (
                self._exchanger.finished):
            note = self._wait_for_link(note)
        return note

    def _send(self, fragment: int, plan: RoundPlan) -> None:
        assert self._exchanger is not None
        lo, hi = self._range(fragment, plan)
        stats = RoundStats(self.epoch, self._round, fragment, self.step_count, plan,
                           get_codec(plan.codec).wire_bytes(hi - lo), lo, hi)
        with self._lock:
            resync_pending = self._resync is not None
            outer = self.outer[lo:hi].clone()
        if not self._exchanger.up or resync_pending:
            stats.outcome = "skipped"
            self._record(stats)
        else:
            pseudo = outer - self._read(lo, hi)
            fb = self._feedback.setdefault(fragment, ErrorFeedback())
            payload = fb.encode(get_codec(plan.codec), pseudo.contiguous())
            proposal = self._proposal(plan)
            header = _header(self.epoch, self._round, fragment, self.applied, plan, proposal)
            message = torch.cat([header.view(torch.uint8), payload.reshape(-1).view(torch.uint8)])
            job = _Job(stats, message, lo, hi)
            self.sent_bytes += message.numel()
            self._inflight[self.step_count + plan.overlap] = job
            self._exchanger.jobs.put(job)
        if fragment == plan.fragments - 1:
            # The round's last send: the next round begins, with the plan agreed so far. A new
            # cut of the parameters waits until nothing of the old one is in flight.
            self._round += 1
            self._round_start = self.step_count
            if self._next_plan != plan:
                self._round_start = max([self.step_count, *self._inflight])
                if self._next_plan.fragments != plan.fragments:
                    self._feedback.clear()
            self.plan = self._next_plan

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

    def _finish(self, job: _Job) -> _Note | None:
        """The job's result at its apply step: waits for it unless the exchange is down."""
        assert self._exchanger is not None
        started = time.monotonic()
        # Until the deadline, or until the exchange thread found the link down (a job queued
        # behind a failed one would wait its whole deadline for nothing).
        while self._exchanger.up and not job.done.is_set():
            left = self.deadline_s - (time.monotonic() - job.sent_at)
            if left <= 0:
                break
            job.done.wait(min(left, 0.05))
        with job.lock:
            if not job.done.is_set():
                job.abandoned = True
                job.stats.outcome = "late"
            elif not job.ok:
                job.stats.outcome = "failed"
            else:
                job.stats.outcome = "applied"
        job.stats.waited_s = time.monotonic() - started
        self._record(job.stats)
        if job.stats.outcome != "applied":
            return None
        self.applied += 1
        self._next_plan = agree_plans(job.proposals).check(self.outer.numel())
        return ("apply", job.lo, job.hi, None, job.stats)

    def _wait_for_link(self, note: _Note | None) -> _Note | None:
        """Past the drift bound: wait for the exchange to come back (it resyncs first), unless
        another site ended its run (then nothing will come back: training goes on alone)."""
        ex = self._exchanger
        assert ex is not None
        log.warning("%d inner steps since the last sync (max_drift %d): waiting for the link",
                    self._since_sync, self.max_drift)
        if note is not None:
            self._apply(note)
        asked = False
        while True:
            if ex.error is not None:
                raise RuntimeError("the cross-site exchange thread stopped") from ex.error
            with self._lock:
                resync, self._resync = self._resync, None
            if resync is not None:
                return ("resync", resync.epoch, resync.applied, resync.plan, None)
            if ex.finished or self._closing:
                return None
            if not asked:
                ex.jobs.put((_RESYNC, self.epoch))
                asked = True
            time.sleep(0.05)

    def _hand_over(self, note: _Note | None) -> _Note | None:
        """The leader's note, and the values it brings, to every rank of the site."""
        assert self._handover is not None
        head = torch.zeros(12, dtype=torch.int64)
        if self.leader and note is not None:
            kind, a, b, plan, stats = note
            head[:3] = torch.tensor([1 if kind == "apply" else 2, a, b])
            if stats is not None:
                plan = stats.plan
                head[7:12] = torch.tensor([stats.epoch, stats.round, stats.fragment, stats.step,
                                           stats.wire_bytes])
            if plan is not None:
                head[3:7] = _header(0, 0, 0, 0, plan, plan)[4:8]
        src = dist.get_global_rank(self._handover, 0)
        dist.broadcast(head, src=src, group=self._handover)
        kind_code, a, b = (int(x) for x in head[:3])
        if kind_code == 0:
            return None
        plan = _plan_of(head[3:7].tolist())
        if kind_code == 1:
            with self._lock:
                values = self.outer[a:b].clone() if self.leader else torch.empty(b - a)
            dist.broadcast(values, src=src, group=self._handover)
            if self.leader:
                return note
            self.outer[a:b] = values
            e, r, f, sent, wire = (int(x) for x in head[7:12])
            stats = RoundStats(e, r, f, sent, plan, wire, a, b, "applied")
            self._record(stats)
            return ("apply", a, b, None, stats)
        with self._lock:
            full = self.outer.clone() if self.leader else torch.empty_like(self.outer)
        dist.broadcast(full, src=src, group=self._handover)
        if not self.leader:
            self.outer.copy_(full)
        return ("resync", a, b, plan, None)

    def _apply(self, note: _Note | None) -> None:
        if note is None:
            return
        kind, a, b, plan, _ = note
        if kind == "apply":
            with self._lock:  # the exchange thread may be writing other fragments
                values = self.outer[a:b].clone()
            self._write(a, b, values)
            self._since_sync = 0
            return
        # A resync: the whole outer state, a new round from here.
        assert plan is not None
        with self._lock:
            values = self.outer.clone()
        self._write(0, values.numel(), values)
        self.epoch, self.applied = a, b
        self._inflight.clear()
        self._feedback.clear()
        self._round, self._round_start, self._since_sync = 0, self.step_count, 0
        self.plan = self._next_plan = plan
        log.info("resync: epoch %d, %d fragment updates, plan %s", a, b, plan)

    def _record(self, stats: RoundStats) -> None:
        self.history.append(stats)
        if self.on_round is not None:
            self.on_round(stats)

    # -- the outer step, on the exchange thread ----------------------------------------------------

    def _outer_step(self, lo: int, hi: int, pseudo: torch.Tensor) -> None:
        v = self.velocity[lo:hi]
        v.mul_(self.momentum).add_(pseudo)
        step = pseudo + self.momentum * v if self.nesterov else v
        self.outer[lo:hi] -= self.outer_lr * step

    def close(self) -> None:
        """Finishes the exchanges in flight as their apply steps would (each waited for up to
        its deadline, then applied or given up on), stops the exchange thread, and tells the
        other sites this one ended, so that none waits for it. Every rank of a site calls it."""
        self._closing = True
        count = torch.tensor([len(self._inflight)], dtype=torch.int64)
        if self._handover is not None:
            dist.broadcast(count, src=dist.get_global_rank(self._handover, 0),
                           group=self._handover)
        for _ in range(int(count[0])):
            note = None
            if self.leader:
                note = self._finish(self._inflight.pop(min(self._inflight)))
            if self._handover is not None:
                note = self._hand_over(note)
            self._apply(note)
        if self._exchanger is not None:
            self._exchanger.stop()


class _Exchanger:
    """The site leader's thread: exchanges jobs with the other sites' leaders in order, builds
    the process group again after a failure, and resyncs first thing after each build."""

    def __init__(self, sync: OuterSync, store: Store, rank: int, size: int,
                 leaders: list[int]) -> None:
        self.sync, self.store, self.rank, self.size = sync, store, rank, size
        self.jobs: queue.Queue[_Job | tuple[str, int] | None] = queue.Queue()
        self.generation = 0
        #: The epoch of this thread's last resync: jobs and resync requests from before it are
        #: dropped (the training side learns of a resync a step later).
        self.epoch = 0
        #: A peer site ended its run: no more exchanges, no more waiting for the link.
        self.finished = False
        self.up = True
        self.error: Exception | None = None
        self.pg = self._build()
        self.thread = threading.Thread(target=self._run, name="linkpilot-outer", daemon=True)
        self.thread.start()

    def _build(self) -> Any:  # a ProcessGroupGloo (its stubs lack the collectives)
        prefix = PrefixStore(f"linkpilot-outer/{self.generation}", self.store)
        # Connecting takes several round trips through the store, which may be longer than an
        # exchange's deadline on a long link: connect with time to spare, then hold every
        # collective to the deadline.
        pg = ProcessGroupGloo(prefix, self.rank, self.size,
                              datetime.timedelta(seconds=max(_CONNECT_S, self.sync.deadline_s)))
        pg.set_timeout(datetime.timedelta(seconds=self.sync.deadline_s))
        return pg

    def stop(self) -> None:
        """Serves what is queued (the peers' matching exchanges), then tells the peers this site
        ended (they stop waiting for it) and stops."""
        self.sync._closing = True
        self.jobs.put(None)
        self.thread.join(timeout=self.sync.deadline_s + _WAIT_S + 5)
        try:
            self.store.set(f"{_CLOSED}/{self.rank}", "1")
        except RuntimeError as e:  # the store is across a dead link: the peers time out
            log.warning("could not tell the other sites this one ended: %s", e)

    def _peer_closed(self) -> bool:
        keys = [f"{_CLOSED}/{r}" for r in range(self.size) if r != self.rank]
        return any(self.store.check([k]) for k in keys)

    def _run(self) -> None:
        try:
            self._serve()
        except Exception as e:  # a bug, not the link: the training side raises it
            log.exception("the cross-site exchange thread stopped")
            self.error = e
            self.up = False

    def _serve(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            if isinstance(job, tuple):  # (_RESYNC, the epoch it was asked in)
                if job[1] >= self.epoch and not self.finished:
                    self._recover()
                continue
            assert isinstance(job, _Job)
            if job.stats.epoch < self.epoch or self.finished:
                job.done.set()  # from before a resync, or no peer left: dropped
                continue
            if job.abandoned:
                # Given up on before it started: the peers' copies of it cannot complete
                # without this site, so everyone recovers.
                job.done.set()
                self._recover()
                continue
            started = time.monotonic()
            try:
                assert job.message is not None
                gathered = self._all_gather(job.message)
                ok = self._commit(job, gathered, started)
            except RuntimeError as e:
                log.warning("cross-site exchange failed (%s): inner steps go on", e)
                ok = False
            if not ok:
                with job.lock:
                    job.stats.exchange_s = time.monotonic() - started
                    job.done.set()
                self._recover()

    def _all_gather(self, message: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(message) for _ in range(self.size)]
        self.pg.allgather([out], [message]).wait()
        return out

    def _commit(self, job: _Job, gathered: list[torch.Tensor], started: float) -> bool:
        """Checks every site sent the same round and fragment, then takes the outer step (unless
        the job was given up on meanwhile); the job is done (ok) under its lock, so the
        training side sees either nothing or the whole result."""
        heads = [g[: _HEADER * 8].clone().view(torch.int64).tolist() for g in gathered]
        mine = heads[self.rank]
        if any(h[:3] != mine[:3] or h[3] != mine[3] or h[4:8] != mine[4:8] for h in heads):
            log.warning("sites disagree on the round (%s): resync", [h[:4] for h in heads])
            return False
        plan = _plan_of(mine[4:8])
        codec = get_codec(plan.codec)
        n = job.hi - job.lo
        total = torch.zeros(n)
        for g in gathered:  # site order: the same sum, bit for bit, on every site
            payload = g[_HEADER * 8:]
            if codec.payload_dtype != torch.uint8:
                payload = payload.clone().view(codec.payload_dtype)
            total += codec.decode(payload, n)
        with job.lock:
            if job.abandoned:
                return False
            job.proposals = [_plan_of(h[_PLAN_AT:_PLAN_AT + 4]) for h in heads]
            with self.sync._lock:
                self.sync._outer_step(job.lo, job.hi, total / self.size)
            job.stats.exchange_s = time.monotonic() - started
            job.ok = True
            job.done.set()
        return True

    def _recover(self) -> None:
        """A failure: build the group again, then resync (the sites may have applied different
        updates, or none). Generations are numbered by the first leader: after any failure it
        announces the next one and waits until every other leader said it is ready for it;
        the others wait for a generation newer than the one that failed them, say they are
        ready, and build. A group is never built twice under one prefix (gloo would read the
        addresses of the failed attempt), and no leader builds a generation the others left."""
        self.up = False
        failed = self.generation
        while True:
            built = False
            try:
                self.generation = self._next_generation(failed)
                self.pg = self._build()
                built = True
                self._resync()
                break
            except _PeerDone:
                log.warning("another site ended its run: no more cross-site syncs")
                self.finished = True
                return
            except RuntimeError as e:  # the store or the group timed out: the link is down
                if self.sync._closing:
                    return
                log.warning("cross-site group (generation %d) %s: %s", self.generation,
                            "failed in the resync" if built else "not built", e)
                failed = self.generation
                time.sleep(_RETRY_S)
        self.up = True

    def _next_generation(self, failed: int) -> int:
        """The generation to build next (see _recover); store errors propagate."""
        # The wait ends when the keys come; each timeout logs a line, and between two the
        # thread looks whether it should stop waiting.
        timeout = datetime.timedelta(seconds=_WAIT_S)
        if self.rank == 0:
            generation = failed + 1
            self.store.set(_GENERATION, str(generation))
            ready = [f"{_GENERATION}/{generation}/{r}" for r in range(1, self.size)]
            while True:
                try:
                    self.store.wait(ready, timeout)
                    return generation
                except RuntimeError:  # not everyone yet (a stopped or cut-off site)
                    if self.sync._closing:
                        raise
                    if self._peer_closed():
                        raise _PeerDone() from None
        while not self.sync._closing:
            if self._peer_closed():
                raise _PeerDone()
            if self.store.check([_GENERATION]):
                generation = int(self.store.get(_GENERATION))
                if generation > failed:
                    self.store.set(f"{_GENERATION}/{generation}/{self.rank}", "1")
                    return generation
            time.sleep(_RETRY_S / 5)
        raise RuntimeError("closing")

    def _resync(self) -> None:
        """The outer state of the site that applied the most updates (the first of equals),
        to every site."""
        s = self.sync
        mine = torch.tensor([s.applied, max(s.epoch, self.epoch),
                             *_header(0, 0, 0, 0, s.plan, s.plan)[4:8]], dtype=torch.int64)
        heads = [torch.empty_like(mine) for _ in range(self.size)]
        self.pg.allgather([heads], [mine]).wait()
        counts = [int(h[0]) for h in heads]
        root = counts.index(max(counts))
        with s._lock:
            state = torch.cat([s.outer, s.velocity])
        self.pg.broadcast(state, root).wait()
        n = s.outer.numel()
        epoch = max(int(h[1]) for h in heads) + 1
        self.epoch = epoch
        with s._lock:
            s.outer.copy_(state[:n])
            s.velocity.copy_(state[n:])
            s._resync = _Resync(epoch, counts[root], _plan_of(heads[root][2:6].tolist()))
        # Jobs queued before the resync belong to the old epoch.
        while not self.jobs.empty():
            job = self.jobs.get_nowait()
            if job is None:
                self.jobs.put(None)
                break
            if isinstance(job, _Job):
                job.done.set()
