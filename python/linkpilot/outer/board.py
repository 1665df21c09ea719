"""The knob board as linkpilot.outer's plan source: the daemon's per-state synchronization knobs
(``sync_every``, ``outer_codec``, ``fragments``, ``overlap``) become the round plan this site
proposes, with ``sync_every = "auto"`` and ``outer_codec = "auto"`` resolved here, where the job's
compute time is known.

An auto codec is chosen with H: of the codecs from the board's weakest to its strongest, the one
that gives the smallest H (a sync more often keeps the sites' replicas closer, which is what
quality per step asks of it), the weaker on a tie; with a fixed H, the weakest whose exchange
fits the inner steps it overlaps with. The job's measured exchange time under the plan in force
shifts every codec's estimate by what the model missed for that plan.

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
from linkpilot.codecs import get_codec
from linkpilot.outer.plan import PlanInputs, RoundPlan, auto_sync_every

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
        self._auto_codec: str | None = None  # the codec that H was proposed with
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
        if knobs.sync_every != 0 and not knobs.outer_codec_auto:
            self._auto = None
            return _fixed(knobs, fragments)
        if inputs.compute_s <= 0:
            return None  # not measured yet
        # What the link carries now; its capacity until a rate was measured.
        rate = knobs.delivery_bps or knobs.capacity_bps
        codecs = candidates(knobs) if knobs.outer_codec_auto else [knobs.outer_codec]
        model = _Exchange(knobs, inputs, fragments, rate)
        if knobs.sync_every != 0:
            return self._fixed_h(knobs, fragments, codecs, model, inputs.compute_s)
        best: tuple[int, int, str] | None = None
        for codec in codecs:
            h, overlap = auto_sync_every(
                rate_bps=rate, rtt_s=knobs.rtt_us / 1e6, compute_s=inputs.compute_s,
                numel=inputs.numel, codec=codec, sites=inputs.sites,
                fragments=fragments, margin=knobs.sync_margin,
                bounds=(max(knobs.sync_min, fragments), max(knobs.sync_max, fragments)),
                measured_s=model.measured(codec))
            if best is None or h < best[0]:
                best = (h, overlap, codec)
        assert best is not None
        h, overlap, codec = best
        if self._auto is not None and self._auto_codec == codec and _close(self._auto[0], h):
            h = self._auto[0]  # the overlap follows the new estimate, within the kept H
        self._auto, self._auto_codec = (h, overlap), codec
        fragments = min(fragments, h)
        return RoundPlan(h, fragments, min(overlap, h // fragments - 1), codec)

    def _fixed_h(self, knobs: LinkKnobs, fragments: int, codecs: list[str], model: _Exchange,
                 compute_s: float) -> RoundPlan:
        """A fixed H with an auto codec: the weakest whose exchange (with the margin) fits the
        inner steps a fragment overlaps with, else the strongest."""
        plan = _fixed(knobs, fragments)
        room = max(plan.overlap, 1) * compute_s
        codec = next((c for c in codecs if model.seconds(c) * (1 + knobs.sync_margin) <= room),
                     codecs[-1])
        self._auto = None
        return RoundPlan(plan.sync_every, plan.fragments, plan.overlap, codec)

    def _warn(self, why: str) -> None:
        if why != self._warned:
            log.warning("%s", why)
            self._warned = why


def candidates(knobs: LinkKnobs) -> list[str]:
    """The codecs an auto outer codec chooses from, weakest first: the board's weakest to its
    strongest among none, fp16 (bf16 where a bound names it), int8, int4, and a top-k strongest."""
    strongest, weakest = knobs.outer_codec, knobs.outer_weakest
    half = "bf16" if "bf16" in (strongest, weakest) else "fp16"
    ladder = ["none", half, "int8", "int4"]
    if strongest.startswith("topk"):
        ladder.append(strongest)
    lo = ladder.index(weakest) if weakest in ladder else 0
    hi = ladder.index(strongest) if strongest in ladder else len(ladder) - 1
    return ladder[lo:hi + 1] if lo <= hi else [strongest]


class _Exchange:
    """A fragment's exchange time per codec: a round trip and the other sites' bytes at the
    link's rate, or what the plan in force's exchanges took where they were measured (fragments
    of the size proposed now) and took longer. With an auto codec every codec is shifted by what
    the model missed for the plan in force (the link, not the codec, was slower than the
    model), so that a codec the job outgrew is not tried again on the model's first guess; with
    a fixed one, only the plan's own codec is comparable."""

    def __init__(self, knobs: LinkKnobs, inputs: PlanInputs, fragments: int, rate: float) -> None:
        self.rtt_s, self.rate = knobs.rtt_us / 1e6, rate
        self.frag = math.ceil(inputs.numel / fragments)
        self.sites = inputs.sites
        comparable = inputs.exchange_s > 0 and fragments == inputs.plan.fragments and (
            knobs.outer_codec_auto or inputs.plan.codec == knobs.outer_codec)
        self.anchor = (inputs.plan.codec, inputs.exchange_s) if comparable else None

    def seconds(self, codec: str) -> float:
        model = self._model(codec)
        if self.anchor is None:
            return model
        return max(model, self.anchor[1] + model - self._model(self.anchor[0]))

    def measured(self, codec: str) -> float:
        """What ``auto_sync_every`` takes as measured for ``codec`` (0: nothing measured)."""
        return self.seconds(codec) if self.anchor is not None else 0.0

    def _model(self, codec: str) -> float:
        if self.rate <= 0:
            return math.inf
        wire = get_codec(codec).wire_bytes(self.frag) * (self.sites - 1)
        return self.rtt_s + 8 * wire / self.rate


def _fixed(knobs: LinkKnobs, fragments: int) -> RoundPlan:
    """A fixed H's plan, its fragments and overlap kept to what such a round can hold."""
    h = knobs.sync_every
    fragments = min(fragments, h)
    return RoundPlan(h, fragments, min(knobs.overlap, h // fragments - 1), knobs.outer_codec)


def _close(last: int, new: int) -> bool:
    return math.isclose(last, new, rel_tol=HYSTERESIS) or abs(new - last) <= 1
