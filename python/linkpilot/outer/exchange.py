"""The site leader's exchange thread of :mod:`linkpilot.outer`: it exchanges queued fragments with
the other sites' leaders in order, rebuilds its process group after a failure (generations
numbered by the first leader) and resyncs first thing on every new group."""

from __future__ import annotations

import datetime
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, Store

from linkpilot.codecs import get_codec
from linkpilot.outer.plan import (
    FINAL,
    HEADER,
    PLAN_AT,
    STEP_US_AT,
    WEIGHT_AT,
    RoundPlan,
    RoundStats,
    pack_header,
    plan_of,
)
from linkpilot.pgtimeout import set_backend_timeout

if TYPE_CHECKING:
    from linkpilot.outer.sync import OuterSync

log = logging.getLogger("linkpilot.outer")


class Job:
    def __init__(self, stats: RoundStats, message: torch.Tensor | None, lo: int, hi: int) -> None:
        self.stats, self.message, self.lo, self.hi = stats, message, lo, hi
        self.sent_at = time.monotonic()
        self.done = threading.Event()
        self.ok = False
        self.abandoned = False
        #: The step it was due to be applied at, once it went on the late list.
        self.due = 0
        #: The fragment's outer values right after its outer step: what every site writes,
        #: however late (a later round's step of the same fragment may have landed meanwhile).
        self.values: torch.Tensor | None = None
        self.proposals: list[RoundPlan] = []
        #: Every site's inner step time as its header carried it (microseconds).
        self.step_us: list[int] = []
        self.lock = threading.Lock()


class _Final:
    """A closing site's request for its last exchange; ``agreed`` once it is answered."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.agreed = False


@dataclass
class Resync:
    epoch: int
    applied: int
    plan: RoundPlan


#: Asks the exchange thread for a resync (past the drift bound), with the epoch it was asked in.
RESYNC = "resync"


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
#: Values decoded at a time when an exchange lands.
_CHUNK = 1 << 20
#: The payloads' tag between two leaders (their headers go by all-gather).
_PAYLOAD_TAG = 7


class Exchanger:
    """The site leader's thread: exchanges jobs with the other sites' leaders in order, builds
    the process group again after a failure, and resyncs first thing after each build."""

    def __init__(self, sync: OuterSync, store: Store, rank: int, size: int,
                 leaders: list[int]) -> None:
        self.sync, self.store, self.rank, self.size = sync, store, rank, size
        self.jobs: queue.Queue[Job | _Final | tuple[str, int] | None] = queue.Queue()
        self.generation = 0
        #: The epoch of this thread's last resync: jobs and resync requests from before it are
        #: dropped (the training side learns of a resync a step later).
        self.epoch = 0
        #: A peer site ended its run: no more exchanges, no more waiting for the link.
        self.finished = False
        self.up = True
        #: Whether the sites' last exchange (a closing site's) handed every site the same outer
        #: state; None until one ran.
        self.final_agreed: bool | None = None
        #: When the latest exchange landed (monotonic seconds).
        self.landed_at = time.monotonic()
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
        set_backend_timeout(pg, datetime.timedelta(seconds=self.sync.deadline_s))
        return pg

    def final(self) -> bool:
        """This site is closing: its last exchange hands every site the outer state of the one
        that applied the most updates (the first of equals), and no exchange follows. True once
        every site holds that state (here, or earlier, when another site closed first); False
        when the link was down or another site left without it. Waits for the jobs queued
        before it."""
        request = _Final()
        self.jobs.put(request)
        if not request.done.wait(3 * self.sync.deadline_s + _WAIT_S + 5):
            log.warning("the last exchange did not end in time")
        return request.agreed

    def stop(self) -> None:
        """Serves what is queued (the peers' matching exchanges), then tells the peers this site
        ended (they stop waiting for it) and stops."""
        self.sync.closing = True
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
            if isinstance(job, tuple):  # (RESYNC, the epoch it was asked in)
                if job[1] >= self.epoch and not self.finished:
                    self._recover()
                continue
            if isinstance(job, _Final):
                job.agreed = self._final() if self.final_agreed is None else self.final_agreed
                job.done.set()
                continue
            assert isinstance(job, Job)
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
                ok = self._exchange(job, started)
            except RuntimeError as e:
                log.warning("cross-site exchange failed (%s): inner steps go on", e)
                ok = False
            # Sent or failed, the message is not needed again; the job may be kept for its
            # proposals (a round's plan exchange), and a payload is as large as the codec makes
            # a fragment.
            job.message = None
            if not ok:
                with job.lock:
                    job.stats.exchange_s = time.monotonic() - started
                    job.done.set()
                if not self.finished:
                    self._recover()

    def _all_gather(self, message: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(message) for _ in range(self.size)]
        self.pg.allgather([out], [message]).wait()
        return out

    def _exchange(self, job: Job, started: float) -> bool:
        """The headers first (a fixed size), then the payloads, whose size follows the plan:
        sites that disagree on the plan (one held it while an exchange was late, the other
        adopted a new one) must find out before gloo is handed buffers of different sizes,
        which it cannot survive. The price is one round trip per exchange."""
        assert job.message is not None
        heads = [h.clone().view(torch.int64).tolist()
                 for h in self._all_gather(job.message[: HEADER * 8].contiguous())]
        mine = heads[self.rank]
        if any(h[2] == FINAL for h in heads):
            # Another site is closing: instead of this job, the last exchange.
            self._last_exchange()
            return False
        # Epoch, round, fragment and the plan in force must match; how many updates each site
        # applied may not (a late exchange is applied when it lands, a few steps apart).
        if any(h[:3] != mine[:3] or h[4:8] != mine[4:8] for h in heads):
            log.warning("sites disagree on the round (%s): resync", [h[:8] for h in heads])
            return False
        return self._commit(job, heads, self._swap(job.message[HEADER * 8:]), started)

    def _swap(self, payload: torch.Tensor) -> list[torch.Tensor]:
        """Every site's payload, this site's its own: sent to and received from each other
        site directly, all at once. An all-gather would hold five payloads here (the message,
        a copy of it, the others', and gloo's flat buffer of all of them): with a fragment of
        25M values in int8, 75 MB more than the outer state's own bound allows for."""
        out = [payload if r == self.rank else torch.empty_like(payload)
               for r in range(self.size)]
        works = [self.pg.send([payload], r, _PAYLOAD_TAG) for r in range(self.size)
                 if r != self.rank]
        works += [self.pg.recv([out[r]], r, _PAYLOAD_TAG) for r in range(self.size)
                  if r != self.rank]
        # Point-to-point waits are not held to the group's timeout: all of them together to
        # the deadline, as one collective is.
        end = time.monotonic() + self.sync.deadline_s
        for w in works:
            left = datetime.timedelta(seconds=max(0.001, end - time.monotonic()))
            if not w.wait(left):
                raise RuntimeError("a payload exchange did not complete by the deadline")
        return out

    def _commit(self, job: Job, heads: list[list[int]], payloads: list[torch.Tensor],
                started: float) -> bool:
        """Takes the outer step from every site's payload (unless the job was given up on
        meanwhile); the job is done (ok) under its lock, so the training side sees either
        nothing or the whole result."""
        mine = heads[self.rank]
        plan = plan_of(mine[4:8])
        codec = get_codec(plan.codec)
        n = job.hi - job.lo
        # Each site's pseudo-gradient weighs what it processed (equal weights: the plain mean).
        weights = [max(1, h[WEIGHT_AT]) for h in heads]
        equal = len(set(weights)) == 1
        # Fresh buffers, and this site's behind a header of whole words: aligned.
        payloads = [p.view(codec.payload_dtype) for p in payloads]
        # Decoded, summed and stepped a chunk at a time: no float32 temporary of the
        # fragment's size (site order: the same sum, bit for bit, on every site). The outer
        # values are locked a chunk's step at a time, so the training side never waits for
        # a whole fragment's decoding.
        chunk = max(1, _CHUNK // max(1, codec.chunk_align)) * codec.chunk_align or n
        state = self.sync.state
        with job.lock:
            if job.abandoned:
                return False
            with state.lock:
                state.keep_values(job.lo, job.hi)
            for a in range(0, n, chunk):
                b = min(n, a + chunk)
                total = torch.zeros(b - a)
                for payload, weight in zip(payloads, weights):
                    decoded = codec.decode_range(payload, n, a, b)
                    total += decoded if equal else decoded * weight
                total /= self.size if equal else sum(weights)
                with state.lock:
                    state.step(job.lo + a, job.lo + b, total)
            with state.lock:
                # Its values are read at its apply step (see OuterState.keep_values): no copy
                # of the fragment is held while it waits for it.
                state.unapplied.append(job)
            job.proposals = [plan_of(h[PLAN_AT:PLAN_AT + 4]) for h in heads]
            job.step_us = [h[STEP_US_AT] for h in heads]
            job.stats.exchange_s = time.monotonic() - started
            job.ok = True
            job.done.set()
        self.landed_at = time.monotonic()
        return True

    def _final(self) -> bool:
        """A closing site's last exchange (see ``final``): a header marked final, which the
        other sites meet in place of their next exchange, then the state."""
        s = self.sync
        if self.finished or not self.up:
            return False
        head = pack_header(s.epoch, 0, FINAL, s.applied, s.plan, s.plan).view(torch.uint8)
        try:
            self._all_gather(head)
            self._last_exchange()
        except RuntimeError as e:
            log.warning("the last exchange with the other sites failed (%s)", e)
            self.up, self.finished = False, True
            return False
        return True

    def _last_exchange(self) -> None:
        """Every site adopts the outer state of the one that applied the most updates, and no
        exchange follows (the training side takes it as a resync)."""
        self._resync(final=True)
        self.final_agreed = True
        self.up, self.finished = False, True
        log.info("a site closed: its last exchange gave every site the same outer state")

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
                if self.sync.closing:
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
                    if self.sync.closing:
                        raise
                    if self._peer_closed():
                        raise _PeerDone() from None
        while not self.sync.closing:
            if self._peer_closed():
                raise _PeerDone()
            if self.store.check([_GENERATION]):
                generation = int(self.store.get(_GENERATION))
                if generation > failed:
                    self.store.set(f"{_GENERATION}/{generation}/{self.rank}", "1")
                    return generation
            time.sleep(_RETRY_S / 5)
        raise RuntimeError("closing")

    def _resync(self, final: bool = False) -> None:
        """The outer state of the site that applied the most updates (the first of equals),
        to every site; a new epoch, unless it is the last exchange (none follows)."""
        s = self.sync
        mine = torch.tensor([s.applied, max(s.epoch, self.epoch),
                             *pack_header(0, 0, 0, 0, s.plan, s.plan)[4:8]], dtype=torch.int64)
        heads = [torch.empty_like(mine) for _ in range(self.size)]
        self.pg.allgather([heads], [mine]).wait()
        counts = [int(h[0]) for h in heads]
        root = counts.index(max(counts))
        with s.state.lock:
            state = torch.cat([s.state.outer, s.state.velocity])
        self.pg.broadcast(state, root).wait()
        n = s.state.outer.numel()
        epoch = max(int(h[1]) for h in heads) + (0 if final else 1)
        self.epoch = epoch
        with s.state.lock:
            # Exchanges of the old epoch that were waiting for their apply step are not applied
            # on their own: the training side takes the resync instead.
            s.state.unapplied.clear()
            s.state.outer.copy_(state[:n])
            s.state.velocity.copy_(state[n:])
            s.state.resync = Resync(epoch, counts[root], plan_of(heads[root][2:6].tolist()))
        # Jobs queued before the resync belong to the old epoch; a closing site's request and
        # the end stay, in order.
        kept: list[_Final | None] = []
        while not self.jobs.empty():
            job = self.jobs.get_nowait()
            if job is None or isinstance(job, _Final):
                kept.append(job)
            elif isinstance(job, Job):
                job.done.set()
        for k in kept:
            self.jobs.put(k)
