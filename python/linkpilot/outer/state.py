"""The outer optimizer's state, which two threads share: the outer values and their momentum,
stepped by the exchange thread as exchanges land and read by the training side at its apply
steps, under one lock. Separate so that both sides reach it through one small interface."""

from __future__ import annotations

import threading

import torch

from linkpilot.outer.exchange import Job, Resync


class OuterState:
    """The outer values of this rank's outer state, with their momentum (``velocity``: empty
    without momentum, or at a rank whose leader takes the outer steps); an outer step is SGD
    at ``lr`` with ``momentum`` (Nesterov's with ``nesterov``)."""

    def __init__(self, outer: torch.Tensor, velocity: torch.Tensor, lr: float, momentum: float,
                 nesterov: bool) -> None:
        self.outer, self.velocity = outer, velocity
        self.lr, self.momentum, self.nesterov = lr, momentum, nesterov
        self.lock = threading.Lock()
        #: Exchanges that landed and stepped the outer values but are not yet applied here:
        #: they take their values from the outer state at their apply step, unless the exchange
        #: thread is about to write their range first (see ``keep_values``). Under ``lock``.
        self.unapplied: list[Job] = []
        #: A resync the exchange thread made, until the training side takes it. Under ``lock``.
        self.resync: Resync | None = None

    def keep_values(self, lo: int, hi: int) -> None:
        """Before the exchange thread writes outer [lo, hi): each landed, unapplied exchange
        over that range keeps its values as they are (a late apply step writes the values of its
        own outer step, never a later one's). Held: ``lock``."""
        for job in self.unapplied:
            if job.values is None and job.lo < hi and lo < job.hi:
                job.values = self.outer[job.lo:job.hi].clone()

    def step(self, lo: int, hi: int, pseudo: torch.Tensor) -> None:
        """The outer step of [lo, hi) with the sites' averaged pseudo-gradient. Held: ``lock``."""
        if self.momentum == 0:
            self.outer[lo:hi] -= self.lr * pseudo
            return
        v = self.velocity[lo:hi]
        v.mul_(self.momentum).add_(pseudo)
        step = pseudo + self.momentum * v if self.nesterov else v
        self.outer[lo:hi] -= self.lr * step

    def take_values(self, job: Job) -> torch.Tensor:
        """A landed job's outer values, at its apply step: kept ones, else the outer state's
        (nothing wrote its range since its outer step); it is no longer unapplied."""
        with self.lock:
            values, job.values = job.values, None
            if values is None:
                values = self.outer[job.lo:job.hi].clone()
            if job in self.unapplied:
                self.unapplied.remove(job)
        return values

    def take_resync(self) -> Resync | None:
        """The resync the exchange thread made, once; None if there is none."""
        with self.lock:
            resync, self.resync = self.resync, None
        return resync

    def resync_waiting(self) -> bool:
        """Whether a resync waits for the training side to take it."""
        with self.lock:
            return self.resync is not None

    def snapshot(self) -> torch.Tensor:
        """A copy of the whole outer state, read whole."""
        with self.lock:
            return self.outer.clone()

    def restart(self) -> torch.Tensor:
        """A copy of the whole outer state, with nothing left unapplied: a resync's start."""
        with self.lock:
            values = self.outer.clone()
            self.unapplied.clear()
        return values
