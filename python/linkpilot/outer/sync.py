"""``OuterSync``: a rank's side of the rounds (see :mod:`linkpilot.outer`): its inner steps, what
each brings to the site (a fragment to apply, a resync, or nothing), the fragments the leader
sends then, and ``close()``. The rest is held by the collaborators it composes: settings,
topology, flat parameters, outer state, schedule, fragments, site hand-over and ledger."""

from __future__ import annotations

import collections
import logging
import time
from typing import Callable, Literal, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch._C._distributed_c10d import PrefixStore, Store

from linkpilot.codecs import get_codec
from linkpilot.jobreport import JobReport
from linkpilot.outer.config import SyncConfig
from linkpilot.outer.exchange import RESYNC, Exchanger
from linkpilot.outer.flat import FlatParams
from linkpilot.outer.fragments import Fragments, Note
from linkpilot.outer.ledger import Ledger, StepClock
from linkpilot.outer.plan import PlanInputs, RoundPlan, RoundStats, pack_header
from linkpilot.outer.rounds import Schedule, fragment_range
from linkpilot.outer.site import SiteLink
from linkpilot.outer.state import OuterState
from linkpilot.outer.topology import local, topology

log = logging.getLogger("linkpilot.outer")

__all__ = ["OuterSync"]


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
        numel = sum(local(p).numel() for p in self.params)
        plan = plan.check(numel)
        config = SyncConfig.checked(
            plan, outer_lr=outer_lr, outer_momentum=outer_momentum, nesterov=nesterov,
            deadline_s=deadline_s, patience_s=patience_s, max_drift=max_drift, pace=pace,
            samples_per_step=samples_per_step)
        self.topology = topo = topology(self.params, sites, numel, shard_state)
        self.n_sites, self.site_index, self.leader = topo.n_sites, topo.site_index, topo.leader
        self.shard, self.shards = topo.shard, topo.shards
        self.site_group = topo.site_group
        # Every replica starts from the first holder's parameters and rank 0's plan: the first
        # round runs before any proposal was exchanged.
        self.config, plan = config.adopt_rank0(plan, topo.length, topo.host)
        self.flat = FlatParams(self.params, topo.base, topo.length)
        outer = self.flat.replicate(topo.spread, topo.host, topo.first, topo.replicas)
        # The outer step runs at the leader only: the others keep the outer values (handed
        # over); without momentum there is none to keep.
        velocity = (torch.zeros_like(outer) if topo.leader and self.config.momentum > 0
                    else torch.zeros(0))
        c = self.config
        self.state = OuterState(outer, velocity, c.outer_lr, c.momentum, c.nesterov)
        # Each step's time, exposed wait (this class's own) and bytes, for the daemon ("auto":
        # its job-report directory when it exists).
        report = (JobReport.auto(rank=dist.get_rank(), world=dist.get_world_size(), kind="outer")
                  if job_report == "auto" else job_report)
        self.ledger = Ledger(on_round, report)
        self.clock = StepClock()
        self.fragments = Fragments(self.state, self.ledger, c.deadline_s)
        self.schedule = Schedule(plan, self.config, topo.site_index, topo.n_sites, plan_source,
                                 self.ledger, self.clock)
        self.site = SiteLink(topo, self.flat, self.state)
        self.epoch = 0
        self.step_count = 0
        #: Rounds whose last fragment this site sent (or skipped), of every shard: the same
        #: count at every rank of the site, never reset; stop a paced run on it.
        self.rounds_done = 0
        #: Whether close() ended with every site holding the same parameters (see close()).
        self.agreed_at_close: bool | None = None
        #: Set once this site closes (close(), the exchange thread's stop): nothing waits for
        #: the link any more.
        self.closing = False
        self._since_sync = 0
        self._exchanger: Exchanger | None = None
        if topo.leader:
            store = store or dist.distributed_c10d._get_default_store()
            if topo.shards > 1:  # each shard's leaders meet on keys of their own
                store = PrefixStore(f"linkpilot-outer-shard/{topo.shard}", store)
            self._exchanger = Exchanger(self, store, topo.site_index, topo.n_sites, topo.leaders)

    # -- what callers read of the collaborators (the settings: ``config``) ----------------------

    @property
    def plan(self) -> RoundPlan:
        """The plan in force."""
        return self.schedule.plan

    @property
    def site_plan(self) -> RoundPlan:
        """This site's share of the round in force (the plan's when paced by steps)."""
        return self.schedule.site_plan

    @property
    def deadline_s(self) -> float:
        """How long an exchange may take before it is given up on."""
        return self.config.deadline_s

    @property
    def applied(self) -> int:
        """Fragment updates applied since the start (a resync adopts the count it brings)."""
        return self.fragments.applied

    @property
    def outer(self) -> torch.Tensor:
        """This rank's outer state: the outer values of its shard of the flat parameters."""
        return self.state.outer

    @property
    def history(self) -> collections.deque[RoundStats]:
        """The latest exchanges as this site saw them (the oldest dropped past 10,000)."""
        return self.ledger.history

    @property
    def sent_bytes(self) -> int:
        """Bytes this site's leader handed to the exchange (headers and payloads), so far."""
        return self.ledger.sent_bytes

    @property
    def job_report(self) -> JobReport | None:
        """Where each step's time, wait and bytes go for the daemon (None: nowhere)."""
        return self.ledger.job_report

    def patience(self) -> float:
        """How long an apply step waits for its exchange before going on without it: by
        default about one inner step (a late exchange costs a few steps of staleness, a wait
        costs the steps themselves)."""
        return self.config.patience(self.clock.compute_s)

    # -- the training side's step ----------------------------------------------------------------

    def step(self) -> None:
        """Call after every inner optimizer step."""
        if self._exchanger is not None and self._exchanger.error is not None:
            raise RuntimeError("the cross-site exchange thread stopped") from self._exchanger.error
        called, last_returned = self.clock.called()
        try:
            self._step()
        finally:
            returned = self.clock.returned()
        if self.job_report is not None and last_returned is not None:
            self.ledger.report(returned - last_returned, returned - called, self.plan)

    def _step(self) -> None:
        self.step_count += 1
        self._since_sync += 1
        note = self._leader_step() if self.leader else None
        note = self._hand_over(note)
        self._apply(note)
        self._sync_site(note)

    def _hand_over(self, note: Note | None) -> Note | None:
        """The leader's note to the other holders of its shard in the site, if any."""
        if self.topology.handover is None:
            return note
        note, self.schedule.plan, self.schedule.rounds_sent = self.site.hand_over(
            note, self.schedule.plan, self.schedule.rounds_sent)
        return note

    def _sync_site(self, note: Note | None, ok: bool = True) -> bool:
        """The site's rounds done, and what its shards' leaders wrote, across the site (see
        SiteLink.sync); whether every shard's ``ok`` held."""
        self.rounds_done, ok = self.site.sync(note, self.schedule.rounds_sent, ok)
        return ok

    def _leader_step(self) -> Note | None:
        """What this step brings to the site (the leader decides): a resync, a fragment to
        apply, or nothing; this step's send is made here too."""
        ex, sched, frags = self._exchanger, self.schedule, self.fragments
        assert ex is not None
        resync = self.state.take_resync()
        if resync is not None:
            return ("resync", resync.epoch, resync.applied, resync.plan, None, None)
        at = self.step_count - sched.round_start
        note = None
        job = frags.inflight.pop(self.step_count, None)
        if job is not None:
            note = frags.finish(job, ex, self.step_count, self.patience())
        if sched.pending is not None:
            self._begin_round()
            at = self.step_count - sched.round_start
        mine = sched.site_plan
        fragment = sched.fragment_due(at)
        if fragment is not None:
            self._send(fragment, mine)
            job = frags.inflight.pop(self.step_count, None)  # overlap 0: applied at once
            if job is not None:
                note = frags.finish(job, ex, self.step_count, self.patience()) or note
        if note is None:
            note = frags.land_late(ex, self.step_count)
        bound = max(self.config.max_drift, mine.sync_every + mine.overlap)
        if self._since_sync > bound and not ex.finished:
            note = self._wait_for_link(note)
        return note

    def _send(self, fragment: int, mine: RoundPlan) -> None:
        """Sends ``fragment`` under the plan in force, this site's share of it being ``mine``."""
        ex, sched = self._exchanger, self.schedule
        assert ex is not None
        plan = sched.plan
        numel = self.state.outer.numel()
        lo, hi = fragment_range(fragment, plan, numel)
        stats = RoundStats(self.epoch, sched.round, fragment, self.step_count, plan,
                           get_codec(plan.codec).wire_bytes(hi - lo), lo, hi,
                           site_steps=mine.sync_every,
                           weight=mine.sync_every * self.config.samples_per_step)
        if ex.final_agreed:
            pass  # another site closed: this one trains on alone, with nothing to send
        elif not ex.up or self.state.resync_waiting():
            stats.outcome = "skipped"
            self.ledger.record(stats)
        else:
            proposal = sched.proposal(plan, numel)
            header = pack_header(self.epoch, sched.round, fragment, self.applied, plan, proposal,
                                 step_us=round(self.clock.compute_s * 1e6), weight=stats.weight)

            def pseudo(a: int, b: int) -> torch.Tensor:
                with self.state.lock:  # a chunk's outer values are read whole
                    return self.state.outer[lo + a:lo + b] - self.flat.read(lo + a, lo + b)

            job = self.fragments.send(ex, stats, header, self.step_count + mine.overlap, pseudo)
            if fragment == 0:
                sched.plan_jobs[sched.round] = job
        if fragment == plan.fragments - 1 and sched.round_sent(self.step_count):
            self._begin_round()

    def _begin_round(self) -> None:
        """The next round, once its plan's exchange allows (see Schedule.begin_round)."""
        assert self._exchanger is not None
        if self.schedule.begin_round(self.step_count, self.fragments.inflight,
                                     self.state.outer.numel(), self._exchanger):
            self.fragments.feedback.clear()

    def _wait_for_link(self, note: Note | None) -> Note | None:
        """Past the drift bound: wait for the exchange to come back (it resyncs first), unless
        another site ended its run (then nothing will come back: training goes on alone)."""
        ex, frags = self._exchanger, self.fragments
        assert ex is not None
        if note is not None and note[0] == "apply":
            return note  # this step syncs a fragment
        log.warning("%d inner steps since the last sync (max_drift %d): waiting for the link",
                    self._since_sync, self.config.max_drift)
        # Late exchanges first: the link may be slow rather than gone, and one that lands is a
        # sync. Only when none is left (landed, failed or past its deadline) is a resync asked.
        while frags.late and ex.up and not self.closing:
            landed = frags.land_late(ex, self.step_count)
            if landed is not None:
                return landed
            if frags.late:
                frags.late[0].done.wait(0.05)
        if note is not None:
            self._apply(note)
        asked = False
        while True:
            if ex.error is not None:
                raise RuntimeError("the cross-site exchange thread stopped") from ex.error
            resync = self.state.take_resync()
            if resync is not None:
                return ("resync", resync.epoch, resync.applied, resync.plan, None, None)
            if ex.finished or self.closing:
                return None
            if not asked:
                ex.jobs.put((RESYNC, self.epoch))
                asked = True
            time.sleep(0.05)

    def _apply(self, note: Note | None) -> None:
        if note is None:
            return
        kind, a, b, plan, stats, values = note
        if kind == "apply":
            assert values is not None
            self.flat.write(a, b, values)
            if stats is not None:  # recorded once written: on_round sees the values in place
                self.ledger.record(stats)
            self._since_sync = 0
            return
        # A resync: the whole outer state, a new round from here.
        assert plan is not None
        values = self.state.restart()
        self.flat.write(0, values.numel(), values)
        self.epoch = a
        self.fragments.reset(applied=b)
        self._since_sync = 0
        self.schedule.restart(self.step_count, plan)
        log.info("resync: epoch %d, %d fragment updates, plan %s", a, b, plan)

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
        self.closing = True
        frags = self.fragments
        count = torch.tensor([len(frags.late) + len(frags.inflight)], dtype=torch.int64)
        self.site.from_leader(count)
        for _ in range(int(count[0])):
            note = None
            if self.leader and frags.late:
                job = frags.late.popleft()
                job.done.wait(max(0.0, self.deadline_s - (time.monotonic() - job.sent_at)))
                note = frags.settle(job)
            elif self.leader:
                assert self._exchanger is not None
                note = frags.finish(frags.inflight.pop(min(frags.inflight)), self._exchanger,
                                    self.step_count, self.deadline_s)
            self._apply(self._hand_over(note))
        agreed = self._exchanger.final() if self._exchanger is not None else False
        final = self.state.snapshot()
        flag = torch.tensor([agreed], dtype=torch.int64)
        if self.topology.handover is not None:
            self.site.from_leader(flag)
            self.site.from_leader(final)
            self.state.outer.copy_(final)
        self.flat.write(0, final.numel(), final)
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
