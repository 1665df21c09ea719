"""The plan of cross-site rounds (H, fragments, overlap, codec), how sites agree on one, how
"auto" H is derived, and the header every exchange message carries (linkpilot.outer)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from linkpilot.codecs import CODEC_NAMES, get_codec, strength

__all__ = ["PlanInputs", "RoundPlan", "RoundStats", "agree_plans", "auto_sync_every",
           "paced_share", "site_plan"]


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


def agree_plans(plans: Sequence[RoundPlan]) -> RoundPlan:
    """What every site runs given every site's proposal: the largest H, fragment count and
    overlap and the strongest codec (the site that sees the worst link decides), with the
    overlap kept below the steps between two sends."""
    h = max(p.sync_every for p in plans)
    f = min(max(p.fragments for p in plans), h)
    overlap = min(max(p.overlap for p in plans), h // f - 1)
    codec = max((p.codec for p in plans), key=strength)
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


def site_plan(plan: RoundPlan, step_us: Sequence[int], site: int) -> RoundPlan:
    """Site ``site``'s share of a round paced by time: about ``plan.sync_every`` inner steps of
    the fastest site. Each site's steps between two sends are rounded to whole steps (at least
    one, and two when the plan overlaps: a step to send in and one to hide the exchange
    behind); the longest such interval in wall time sets the pace, and every site takes as
    many of its steps (``step_us``, microseconds) as fit in it, so no site's interval is longer
    than another's by a step or more (the fastest may take a few more than the plan's). The
    overlap is scaled alike (the same wall time to hide an exchange in), and covers at least
    one step of the slowest site, whose sends come only at its steps' ends. Without every site's
    step time (0 for one that has not measured yet) every site takes the plan's steps."""
    return paced_share(plan, step_us, site)[0]


def paced_share(plan: RoundPlan, step_us: Sequence[int], site: int, carry: float = 0.0
                ) -> tuple[RoundPlan, float]:
    """``site_plan``, and what is left of the steps that fit: a site that carries it into its
    next round's share (``carry``) takes, round after round, as many steps on average as fit
    the interval (3.5 a send: 3, then 4), so its sends keep the same pace as the others'
    rather than running ahead by a fraction of a step every round and waiting for them."""
    if not step_us or min(step_us) <= 0:
        return plan, 0.0
    between = plan.sync_every // plan.fragments
    fastest = min(step_us)
    least = 2 if plan.overlap > 0 else 1
    interval = max(max(least, round(between * fastest / t)) * t for t in step_us)
    exact = interval / step_us[site]
    mine = max(1, math.floor(exact + carry + 1e-9))
    overlap = math.ceil(plan.overlap * mine / between)
    if plan.overlap > 0:  # the slowest site sends only at its steps' ends: hide one of them
        overlap = max(overlap, math.ceil(max(step_us) / step_us[site]))
    overlap = min(mine - 1, overlap)
    return (replace(plan, sync_every=mine * plan.fragments, overlap=overlap),
            max(0.0, carry + exact - mine))


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

HEADER = 16  # int64 words
PLAN_AT = 8
#: The sender's inner step time (microseconds; 0 before it was measured) and the samples its
#: pseudo-gradient stands for (its weight in the outer step).
STEP_US_AT = 12
WEIGHT_AT = 13
#: The fragment number of a site's last message: it is closing (linkpilot.outer's close()).
FINAL = -1


def pack_header(epoch: int, rnd: int, fragment: int, applied: int, plan: RoundPlan,
            proposal: RoundPlan, step_us: int = 0, weight: int = 1) -> torch.Tensor:
    def words(p: RoundPlan) -> list[int]:
        name, _, ratio = p.codec.partition(":")
        ppm = round(float(ratio) * 1e6) if ratio else 0
        return [p.sync_every, p.fragments, p.overlap, CODEC_NAMES.index(name) << 32 | ppm]
    h = [epoch, rnd, fragment, applied, *words(plan), *words(proposal), step_us, weight]
    return torch.tensor(h + [0] * (HEADER - len(h)), dtype=torch.int64)


def plan_of(words: Sequence[int]) -> RoundPlan:
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
    #: Steps after its apply step that it was applied at (it landed late).
    late_steps: int = 0
    #: This site's inner steps in the round (the plan's, unless paced by time) and the weight
    #: its pseudo-gradient carried (those steps times its samples per step).
    site_steps: int = 0
    weight: int = 0
