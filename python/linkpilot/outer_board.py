"""The knob board as linkpilot.outer's plan source: the daemon's per-state synchronization knobs
(``sync_every``, ``outer_codec``, ``fragments``, ``overlap``) become the round plan this site
proposes, with ``sync_every = "auto"`` resolved here, where the job's compute time is known.

    plans = BoardPlan(KnobBoard(path))          # raises BoardError now for a board it cannot read
    sync = OuterSync(model, plans.initial(fallback), plan_source=plans,
                     max_drift=plans.max_drift or None)

A stale or missing board proposes nothing (the plan in force holds): a site does not know the
link better than its peers then, and the agreement takes the other sites' proposals.
"""

from __future__ import annotations

import logging
import math

from linkpilot.board import (BoardBusy, BoardError, BoardMissing, BoardSnapshot, KnobBoard,
                             LinkKnobs)
from linkpilot.outer import PlanInputs, RoundPlan, auto_sync_every

log = logging.getLogger("linkpilot.outer")

__all__ = ["BoardPlan"]

#: An auto H is proposed again only when the new one differs from the last by more than this
#: share: every change of H restarts a round, and compute time and rates are noisy.
HYSTERESIS = 0.2


class BoardPlan:
    """Proposals from ``board``'s link ``link`` (default: the link in the worst state). Reads the
    board once now, so that a board this reader does not know (another layout version, a file
    that is not a board) fails before training starts; a missing or busy board is allowed (the
    daemon may start later)."""

    def __init__(self, board: KnobBoard, *, link: str | None = None) -> None:
        self.board, self.link_name = board, link
        self._auto: tuple[int, int] | None = None  # the last auto (H, overlap) proposed
        self._warned = ""
        self.max_drift = 0
        try:
            snap = board.read()
        except (BoardMissing, BoardBusy):
            return
        knobs = self._knobs(snap)
        if link is not None and knobs is None:
            raise BoardError(board.path, f"no link named {link!r} (it has "
                             f"{[k.name for k in snap.links]})")
        if knobs is not None:
            self.max_drift = knobs.max_drift

    def _knobs(self, snap: BoardSnapshot) -> LinkKnobs | None:
        return snap.link(self.link_name) if self.link_name is not None else snap.worst()

    def initial(self, fallback: RoundPlan) -> RoundPlan:
        """The plan to start with: the board's when it holds a fixed H, else ``fallback`` (an
        auto H needs compute time that is not measured yet). OuterSync adopts rank 0's."""
        try:
            snap = self.board.read()
        except BoardError:
            return fallback
        knobs = self._knobs(snap)
        if snap.stale or knobs is None or knobs.sync_every == 0:
            return fallback
        return _fixed(knobs, knobs.fragments)

    def __call__(self, inputs: PlanInputs) -> RoundPlan | None:
        try:
            snap = self.board.read()
        except BoardError as e:
            self._warn(f"board unreadable ({e}): proposing the plan in force")
            return None
        knobs = self._knobs(snap)
        if snap.stale or knobs is None:
            self._warn("board stale or without the link: proposing the plan in force")
            return None
        self._warned = ""
        fragments = min(knobs.fragments, max(1, inputs.numel))
        if knobs.sync_every != 0:
            self._auto = None
            return _fixed(knobs, fragments)
        if inputs.compute_s <= 0:
            return None  # not measured yet
        # What the link carries now; its capacity until a rate was measured.
        rate = knobs.delivery_bps or knobs.capacity_bps
        h, overlap = auto_sync_every(
            rate_bps=rate, rtt_s=knobs.rtt_us / 1e6, compute_s=inputs.compute_s,
            numel=inputs.numel, codec=knobs.outer_codec, sites=inputs.sites,
            fragments=fragments, margin=knobs.sync_margin,
            bounds=(max(knobs.sync_min, fragments), max(knobs.sync_max, fragments)),
            # What this job's exchanges took, where they were of the size proposed now.
            measured_s=inputs.exchange_s if (fragments, knobs.outer_codec) == (
                inputs.plan.fragments, inputs.plan.codec) else 0.0)
        if self._auto is not None and _close(self._auto[0], h):
            h = self._auto[0]  # the overlap follows the new estimate, within the kept H
        self._auto = (h, overlap)
        fragments = min(fragments, h)
        return RoundPlan(h, fragments, min(overlap, h // fragments - 1), knobs.outer_codec)

    def _warn(self, why: str) -> None:
        if why != self._warned:
            log.warning("%s", why)
            self._warned = why


def _fixed(knobs: LinkKnobs, fragments: int) -> RoundPlan:
    """A fixed H's plan, its fragments and overlap kept to what such a round can hold."""
    h = knobs.sync_every
    fragments = min(fragments, h)
    return RoundPlan(h, fragments, min(knobs.overlap, h // fragments - 1), knobs.outer_codec)


def _close(last: int, new: int) -> bool:
    return math.isclose(last, new, rel_tol=HYSTERESIS) or abs(new - last) <= 1
