"""A site leader's fragment exchanges, from their message to what their apply step brings to the
site: the message encoded with the fragment's error feedback and queued for the exchange
thread, then in flight until its apply step, which waits for it up to the patience; then
applied, or put on the late list and applied the step it lands, or given up on. Separate from
the rounds: the schedule decides which fragment is sent when, under which plan; this follows
each one from there."""

from __future__ import annotations

import collections
import time
from typing import Callable

import torch

from linkpilot.codecs import ErrorFeedback, get_codec
from linkpilot.outer.exchange import Exchanger, Job
from linkpilot.outer.ledger import Ledger
from linkpilot.outer.plan import RoundPlan, RoundStats
from linkpilot.outer.state import OuterState

#: What a step brings to the site: ("apply", lo, hi, None, the exchange's stats, the fragment's
#: outer values right after its outer step) or ("resync", epoch, applied, plan, None, None).
Note = tuple[str, int, int, RoundPlan | None, "RoundStats | None", torch.Tensor | None]


class Fragments:
    """The leader's fragment exchanges; ``applied`` counts the fragment updates applied since
    the start (or the latest resync's count)."""

    def __init__(self, state: OuterState, ledger: Ledger, deadline_s: float) -> None:
        self.state, self.ledger, self.deadline_s = state, ledger, deadline_s
        self.applied = 0
        #: Apply step -> the job sent to be applied then.
        self.inflight: dict[int, Job] = {}
        #: Jobs past their apply step that had not landed, oldest first: applied as they land.
        self.late: collections.deque[Job] = collections.deque()
        self._finished_at = 0.0  # when the latest apply step began waiting
        #: Each fragment's error feedback, for the plan in force's cut of the parameters.
        self.feedback: dict[int, ErrorFeedback] = {}

    def reset(self, applied: int) -> None:
        """A resync: nothing in flight or late, no feedback, ``applied`` updates so far."""
        self.applied = applied
        self.inflight.clear()
        self.late.clear()
        self.feedback.clear()

    def send(self, ex: Exchanger, stats: RoundStats, header: torch.Tensor, due: int,
             pseudo: Callable[[int, int], torch.Tensor]) -> Job:
        """Queues the exchange of ``stats``' fragment on ``ex``, to be applied at step ``due``:
        its message is ``header`` and the pseudo-gradient (``pseudo(a, b)``: values [a, b) of
        the fragment) in the plan's codec. The payload is encoded in place behind the header,
        a chunk at a time: nothing of the fragment's size is made in float32 (see
        ErrorFeedback.encode_chunked)."""
        codec = get_codec(stats.plan.codec)
        n = stats.hi - stats.lo
        header = header.view(torch.uint8)
        message = torch.empty(header.numel() + codec.wire_bytes(n), dtype=torch.uint8)
        message[:header.numel()] = header
        fb = self.feedback.setdefault(stats.fragment, ErrorFeedback(torch.float16))
        fb.encode_chunked(codec, n, pseudo, message[header.numel():].view(codec.payload_dtype))
        job = Job(stats, message, stats.lo, stats.hi)
        self.ledger.sent_bytes += message.numel()
        self.inflight[due] = job
        ex.jobs.put(job)
        return job

    def finish(self, job: Job, ex: Exchanger, step: int, wait: float) -> Note | None:
        """The job's result at its apply step (``step``): waits for it up to ``wait``, or when
        the exchange is down not at all; not landed by then, it goes on the late list and is
        applied when it lands. Behind late jobs it waits only if an exchange landed since the
        previous apply step (the link is back: a site ahead of the others, which stepped less
        meanwhile, lets them catch up); else the link is still out and it does not wait."""
        started = time.monotonic()
        if self.late and ex.landed_at < self._finished_at:
            wait = 0.0
        self._finished_at = started
        # Until the patience or the deadline, or until the exchange thread found the link down
        # (a job queued behind a failed one would wait for nothing).
        while ex.up and not job.done.is_set():
            now = time.monotonic()
            left = min(wait - (now - started), self.deadline_s - (now - job.sent_at))
            if left <= 0:
                break
            job.done.wait(min(left, 0.05))
        job.stats.waited_s = time.monotonic() - started
        # Behind late jobs it waits its turn, even if it landed: a fragment's older values must
        # never overwrite its newer ones.
        if self.late or (not job.done.is_set() and ex.up
                         and time.monotonic() - job.sent_at < self.deadline_s):
            job.due = step
            self.late.append(job)
            return None
        return self.settle(job)

    def land_late(self, ex: Exchanger, step: int) -> Note | None:
        """The oldest late job, applied (or given up on) once it landed, failed or ran out of
        time; one applied job a step (a site's other ranks take one note a step)."""
        while self.late:
            job = self.late[0]
            if (job.done.is_set() or not ex.up
                    or time.monotonic() - job.sent_at >= self.deadline_s):
                self.late.popleft()
                job.stats.late_steps = step - job.due
                note = self.settle(job)
                if note is not None:
                    return note
            else:
                return None
        return None

    def settle(self, job: Job) -> Note | None:
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
            self.ledger.record(job.stats)
            return None
        self.applied += 1
        # The note carries the values from here: a job kept for its proposals keeps none.
        return ("apply", job.lo, job.hi, None, job.stats, self.state.take_values(job))
