"""The rounds as a shard's leader follows them: the plan in force and this site's share of it,
which fragment is due at which step of the round, and when the next round begins under the plan
agreed from the proposals of an earlier exchange (or this site's proposal, from the plan
source, for the exchanges it sends). Separate from the fragments' exchanges, which it only
schedules."""

from __future__ import annotations

import logging
import time
from typing import Callable

from linkpilot.outer.config import SyncConfig
from linkpilot.outer.exchange import Exchanger, Job
from linkpilot.outer.ledger import Ledger, StepClock
from linkpilot.outer.plan import PlanInputs, RoundPlan, agree_plans, paced_share

log = logging.getLogger("linkpilot.outer")


def fragment_range(fragment: int, plan: RoundPlan, numel: int) -> tuple[int, int]:
    """Fragment ``fragment`` of ``plan``'s cut of an outer state of ``numel`` values: [lo, hi)."""
    return fragment * numel // plan.fragments, (fragment + 1) * numel // plan.fragments


class Schedule:
    """The rounds of one shard at one site (``site_index`` of ``n_sites``), from ``plan``;
    proposals come from ``plan_source``, which reads ``ledger`` and ``clock``'s measurements."""

    def __init__(self, plan: RoundPlan, config: SyncConfig, site_index: int, n_sites: int,
                 plan_source: Callable[[PlanInputs], RoundPlan | None] | None,
                 ledger: Ledger, clock: StepClock) -> None:
        self.plan = plan
        #: This site's share of the round in force (its steps and overlap; the plan's when
        #: paced by steps).
        self.site_plan = plan
        self.config, self.site_index, self.n_sites = config, site_index, n_sites
        self.plan_source = plan_source
        self.ledger, self.clock = ledger, clock
        self.round = 0
        #: The step the round in force began at (its steps are counted from there).
        self.round_start = 0
        #: Rounds whose last fragment this site sent (or skipped), of this shard: never reset.
        self.rounds_sent = 0
        self.carry = 0.0  # of paced_share, from round to round
        #: Each round's first fragment exchange, by round (the latest two): its proposals decide
        #: the plan of a later round.
        self.plan_jobs: dict[int, Job] = {}
        #: The exchange whose proposals decide the round that has ended but not yet begun (its
        #: sends wait for it to land); None when the round in force has begun.
        self.pending: Job | None = None

    def fragment_due(self, at: int) -> int | None:
        """The fragment this site sends ``at`` steps into the round in force, if one is due
        then (none while the next round waits for its plan)."""
        plan = self.site_plan
        between = plan.sync_every // plan.fragments
        if (self.pending is None and at > 0 and at % between == 0
                and at // between <= plan.fragments):
            return at // between - 1
        return None

    def round_sent(self, step: int) -> bool:
        """The round's last send, at ``step``: the next round's plan is in the proposals of this
        round's first exchange (with one fragment a round, the previous round's); whether the
        next round waits for that exchange (``begin_round``), which it does unless it was
        skipped (the exchange was down: the plan holds, and the round begins now)."""
        source = self.round - (1 if self.plan.fragments == 1 else 0)
        self.round += 1
        self.rounds_sent += 1
        self.pending = self.plan_jobs.pop(source, None)
        self.plan_jobs = {r: j for r, j in self.plan_jobs.items() if r >= source}
        if self.pending is None:
            self.round_start = step
            return False
        return True

    def begin_round(self, step: int, inflight: dict[int, Job], numel: int, ex: Exchanger
                    ) -> bool:
        """Begins the round that ended waiting for its plan's exchange, if that exchange landed
        (its proposals' agreement), failed or ran out of time (the plan in force holds: a
        failure is followed by a resync, which sets the plan). A new plan waits until nothing
        sent under the old one is ``inflight`` (a new cut of the parameters, or apply steps that
        would collide). Whether the plan's cut changed (each fragment's feedback is void)."""
        job = self.pending
        assert job is not None
        new, mine, carry = self.plan, self.site_plan, self.carry
        if job.done.is_set():
            if job.ok:
                new = agree_plans(job.proposals).check(numel)
                mine, carry = (paced_share(new, job.step_us, self.site_index, self.carry)
                               if self.config.pace == "time" else (new, 0.0))
        elif not (job.abandoned or not ex.up
                  or time.monotonic() - job.sent_at >= self.config.deadline_s):
            return False
        self.pending = None
        self.round_start = step
        self.carry = carry if new == self.plan else 0.0
        recut = False
        if (new, mine) != (self.plan, self.site_plan):
            # A share that only moved by the carry begins now, unless its first apply step
            # would come before one still in flight (the steps must stay in send order).
            first = step + mine.sync_every // mine.fragments + mine.overlap
            if new != self.plan or any(k >= first for k in inflight):
                self.round_start = max([step, *inflight])
            recut = new.fragments != self.plan.fragments
            self.plan, self.site_plan = new, mine
        return recut

    def restart(self, step: int, plan: RoundPlan) -> None:
        """A resync: a new round from ``step`` under ``plan`` (paced again from the next
        agreement)."""
        self.round, self.round_start = 0, step
        self.plan_jobs.clear()
        self.pending = None
        self.plan = self.site_plan = plan
        self.carry = 0.0

    def proposal(self, plan: RoundPlan, numel: int) -> RoundPlan:
        """The plan source's proposal, checked; the plan in force when it has none or a bad
        one (a proposal must never stop training: it is logged)."""
        if self.plan_source is None:
            return plan
        try:
            got = self.plan_source(PlanInputs(plan, numel, self.n_sites, self.clock.compute_s,
                                              self.ledger.exchange_s(plan)))
            return got.check(numel) if got is not None else plan
        except Exception as e:  # a board gone bad mid-run must not stop training
            log.warning("plan source failed (%s): proposing the plan in force", e)
            return plan
