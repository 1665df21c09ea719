"""What a rank of :class:`~linkpilot.outer.OuterSync` measures and records: its inner steps'
compute time, the exchanges as its site saw them, the bytes its leader sent, and each step for
the daemon's job report. Separate from the rounds: they only add to it, and the plan source and
the patience read it."""

from __future__ import annotations

import collections
import itertools
import time
from typing import Callable

from linkpilot.jobreport import JobReport
from linkpilot.outer.plan import RoundPlan, RoundStats

#: Inner steps whose compute time makes ``compute_s``; exchanges whose times make
#: ``exchange_s``.
MEASURED = 16


class StepClock:
    """The compute time between step calls (their own waiting taken out), the latest few."""

    def __init__(self) -> None:
        self.intervals: list[float] = []
        #: When the latest step call returned; None before the first.
        self.returned_at: float | None = None

    def called(self) -> tuple[float, float | None]:
        """A step call begins: when, and when the previous one returned (None: the first);
        the time between them is an inner step's compute."""
        called = time.monotonic()
        last_returned = self.returned_at
        if last_returned is not None:
            self.intervals = [*self.intervals[-(MEASURED - 1):], called - last_returned]
        return called, last_returned

    def returned(self) -> float:
        """A step call returns: when."""
        self.returned_at = time.monotonic()
        return self.returned_at

    @property
    def compute_s(self) -> float:
        """The median of the latest inner steps' compute time (0 until 3 were measured)."""
        if len(self.intervals) < 3:
            return 0.0
        return sorted(self.intervals)[len(self.intervals) // 2]


class Ledger:
    """The exchanges this site finished (handed to ``on_round`` too), the bytes its leader sent,
    and the job report each step goes to (None: none)."""

    def __init__(self, on_round: Callable[[RoundStats], None] | None,
                 job_report: JobReport | None) -> None:
        self.on_round = on_round
        self.job_report = job_report
        #: The latest exchanges as this site saw them (the oldest dropped past 10,000).
        self.history: collections.deque[RoundStats] = collections.deque(maxlen=10_000)
        self.failed_exchanges = 0
        #: Bytes this site's leader handed to the exchange (headers and payloads), so far.
        self.sent_bytes = 0
        self._reported = (0, 0)  # sent bytes and failed exchanges already reported

    def record(self, stats: RoundStats) -> None:
        self.history.append(stats)
        self.failed_exchanges += stats.outcome == "failed"
        if self.on_round is not None:
            self.on_round(stats)

    def exchange_s(self, plan: RoundPlan) -> float:
        """The median of the latest exchanges applied with ``plan``'s fragments and codec."""
        took = [s.exchange_s for s in itertools.islice(reversed(self.history), MEASURED)
                if s.outcome == "applied" and s.exchange_s > 0
                and (s.plan.fragments, s.plan.codec) == (plan.fragments, plan.codec)]
        return sorted(took)[len(took) // 2] if took else 0.0

    def report(self, step_s: float, wait_s: float, plan: RoundPlan) -> None:
        """The step since the previous call returned: its wall time (the inner step and this
        call) and this call's own wait; bytes and failures since the last report, under the
        plan in force."""
        assert self.job_report is not None
        failed = self.failed_exchanges
        sent, was_failed = self._reported
        self._reported = (self.sent_bytes, failed)
        self.job_report.step(step_s=step_s, wait_s=wait_s, wire_bytes=self.sent_bytes - sent,
                             codec=plan.codec, sync_every=plan.sync_every,
                             failed=max(0, failed - was_failed))
