""":class:`~linkpilot.outer.OuterSync`'s settings: its arguments, checked before any collective
runs, then rank 0's plan, pace and momentum adopted by every rank (the first round runs before
any proposal was exchanged). Separate from the rounds, which only read them."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from linkpilot.outer.plan import RoundPlan, pack_header, plan_of

log = logging.getLogger("linkpilot.outer")

#: The least an apply step waits for its exchange by default.
MIN_PATIENCE_S = 0.1


@dataclass(frozen=True)
class SyncConfig:
    """The checked arguments (see :class:`~linkpilot.outer.OuterSync`)."""

    outer_lr: float
    #: The outer momentum (rank 0's, once adopted).
    momentum: float
    nesterov: bool
    deadline_s: float
    patience_s: float | None
    max_drift: int
    #: "time": a round lasts H steps of the fastest site and each site takes as many of its
    #: own as fit; "steps": every site takes H (rank 0's choice holds, once adopted).
    pace: Literal["steps", "time"]
    samples_per_step: int

    @classmethod
    def checked(cls, plan: RoundPlan, *, outer_lr: float, outer_momentum: float,
                nesterov: bool, deadline_s: float, patience_s: float | None,
                max_drift: int | None, pace: Literal["steps", "time"],
                samples_per_step: int) -> SyncConfig:
        """The arguments, with ``max_drift``'s default (4 rounds of ``plan``); ValueError
        for one out of its range."""
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
        drift = max_drift if max_drift is not None else 4 * plan.sync_every
        if drift < plan.sync_every:
            raise ValueError(f"max_drift {drift}: at least one round "
                             f"({plan.sync_every} steps)")
        return cls(outer_lr, outer_momentum, nesterov, deadline_s, patience_s, drift, pace,
                   samples_per_step)

    def adopt_rank0(self, plan: RoundPlan, numel: int, host: dist.ProcessGroup
                    ) -> tuple[SyncConfig, RoundPlan]:
        """Rank 0's momentum, pace and plan, which every rank of ``host`` uses (each one that
        differs here is logged); the plan checked against ``numel``, this rank's outer state's
        size."""
        words = torch.cat([pack_header(0, 0, 0, 0, plan, plan)[4:8],
                           torch.tensor([self.pace == "time", round(self.momentum * 1e9)])])
        dist.broadcast(words, src=0, group=host)
        adopted = self
        if int(words[5]) != round(self.momentum * 1e9):
            log.warning("outer_momentum %g differs from rank 0's %g: rank 0's is used",
                        self.momentum, int(words[5]) / 1e9)
            adopted = dataclasses.replace(adopted, momentum=int(words[5]) / 1e9)
        if plan_of(words[:4].tolist()) != plan:
            log.warning("plan %s differs from rank 0's %s: rank 0's is used", plan,
                        plan_of(words[:4].tolist()))
            plan = plan_of(words[:4].tolist()).check(numel)
        pace: Literal["steps", "time"] = "time" if int(words[4]) else "steps"
        if pace != self.pace:
            log.warning("pace %r differs from rank 0's %r: rank 0's is used", self.pace, pace)
            adopted = dataclasses.replace(adopted, pace=pace)
        return adopted, plan.check(numel)

    def patience(self, compute_s: float) -> float:
        """How long an apply step waits for its exchange before going on without it: by
        default about one inner step (``compute_s``: a late exchange costs a few steps of
        staleness, a wait costs the steps themselves)."""
        if self.patience_s is not None:
            return self.patience_s
        return min(self.deadline_s, max(MIN_PATIENCE_S, compute_s))
