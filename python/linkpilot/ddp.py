"""A DistributedDataParallel comm hook that follows the knob board.

Per bucket, one collective in the hook body, in bucket order on every rank (nothing collective in
a future's callback: on gloo that mismatches sizes or hangs with several buckets). The codec of a
step is one all ranks agreed on without a round trip of its own: every bucket's collective also
carries each rank's proposal (its board's codec and watchdog), so when step N ends every rank
holds the same proposals and step N+1 uses the strongest of them. A rank whose board is stale or
missing proposes the configured safe codec.

The NCCL tuner plugin follows the same agreement: each proposal also carries the rank's board's
NCCL rule (algorithm, protocol, channels, min bytes, chunk), the rule of the worst link state any
rank proposed wins, and at the start of step N+1 every rank adopts it through the plugin's gate
(:mod:`linkpilot.tuner`) before that step's first collective; with any rank's board not fresh,
every rank withdraws it (NCCL's own choices). Every rank's NCCL thus answers the same for the same
collective.

With ``sites`` (which ranks share a site, of any sizes), a bucket is summed inside the site
uncompressed, cut into as many shards as the largest site has ranks, each shard sent compressed
across by the rank of each site that owns it (:mod:`linkpilot.sites`), and the site gathers the
reduced shards: the WAN carries one compressed bucket per site and direction whatever the number
of ranks per site.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket  # DDP's own type; not re-exported for mypy

from linkpilot.board import BoardError, KnobBoard, LinkKnobs
from linkpilot.codecs import CODEC_NAMES, Codec, ErrorFeedback, get_codec, strength
from linkpilot.jobreport import JobReport, StepClock
from linkpilot.pgtimeout import member, group_timeout, set_group_timeout
from linkpilot.sites import Sites
from linkpilot.tuner import TunerGate, TunerRule

log = logging.getLogger("linkpilot.ddp")

__all__ = ["BucketStats", "LinkpilotHook", "StepStats", "group_timeout", "hook"]

# A proposal as 16 small integers (each 0..255, exact in fp16, bf16, fp32 and uint8, and
# unchanged by a sum with zeros): codec index, top-k ratio in ppm (3 digits), watchdog seconds
# (3 digits), flags (1: from a fresh board, 2: with an NCCL rule), and the NCCL rule: state
# index, algorithm, protocol, channels, min bytes as a bit length (a power of two or 0), chunk
# in KiB (3 digits).
_PROPOSAL = 16
_PPM = 1_000_000
_FRESH, _RULE = 1, 2


@dataclass(frozen=True)
class Proposal:
    codec: str
    watchdog_s: int = 0
    fresh: bool = False
    #: The NCCL tuner plugin's rule of the rank's board (None: no fresh board).
    tuner: TunerRule | None = None

    def encode(self) -> list[int]:
        name, _, ratio = self.codec.partition(":")
        ppm = min(_PPM, max(1, round(float(ratio) * _PPM))) if ratio else 0
        wd = min(self.watchdog_s, 256**3 - 1)
        flags = (_FRESH if self.fresh else 0) | (_RULE if self.tuner else 0)
        r = self.tuner or TunerRule()
        kib = min(r.chunk_bytes >> 10, 256**3 - 1)
        return [CODEC_NAMES.index(name), ppm >> 16, (ppm >> 8) & 255, ppm & 255,
                wd >> 16, (wd >> 8) & 255, wd & 255, flags,
                min(r.state_index, 255), r.algo, r.proto, min(r.max_channels, 255),
                min(r.min_bytes.bit_length(), 255), kib >> 16, (kib >> 8) & 255, kib & 255]

    @staticmethod
    def decode(d: Sequence[int]) -> Proposal:
        name = CODEC_NAMES[min(d[0], len(CODEC_NAMES) - 1)]
        if name == "topk":
            name = f"topk:{((d[1] << 16) | (d[2] << 8) | d[3]) / _PPM:g}"
        tuner = None
        if d[7] & _RULE:
            tuner = TunerRule(algo=d[9], proto=d[10], max_channels=d[11], state_index=d[8],
                              min_bytes=1 << (d[12] - 1) if d[12] else 0,
                              chunk_bytes=((d[13] << 16) | (d[14] << 8) | d[15]) << 10)
        return Proposal(name, (d[4] << 16) | (d[5] << 8) | d[6], bool(d[7] & _FRESH), tuner)


def agree(proposals: Sequence[Proposal]) -> Proposal:
    """The strongest codec and the longest watchdog anyone proposed: the rank that sees the worst
    of the link decides (the two sites' daemons each see their own side). The NCCL rule of the
    worst link state proposed (the first of equals, in rank order), only when every proposal
    came from a fresh board with one: else none, and NCCL makes its own choices everywhere."""
    codec = max((p.codec for p in proposals), key=strength)
    tuner = None
    rules = [p.tuner for p in proposals if p.fresh and p.tuner is not None]
    if rules and len(rules) == len(proposals):
        tuner = max(rules, key=lambda r: r.state_index)  # max keeps the first of equals
    return Proposal(codec, max(p.watchdog_s for p in proposals),
                    all(p.fresh for p in proposals), tuner)


#: Nothing adopted by this hook yet (distinct from None, which withdraws).
_NOTHING_YET = object()


def _rule(knobs: LinkKnobs) -> TunerRule:
    return TunerRule.from_names(
        knobs.nccl_algo, knobs.nccl_proto, max_channels=knobs.nccl_max_channels,
        state_index=knobs.state_index, min_bytes=knobs.nccl_min_bytes,
        chunk_bytes=knobs.chunk_bytes)


@dataclass
class BucketStats:
    index: int
    numel: int
    codec: str
    wire_bytes: int
    encode_s: float = 0.0
    decode_s: float = 0.0


@dataclass
class StepStats:
    """What one step sent, for the user's logs: codec, bytes per bucket, coding time, decision."""

    step: int
    codec: str
    decision_id: int
    board_state: str
    #: What this rank proposed for the next step from its own board (the safe codec when the
    #: board is missing or stale): ``codec`` of the next step is the strongest of every rank's.
    proposed: str = ""
    #: The NCCL rule every rank adopted for this step (None: NCCL's own choices).
    tuner: TunerRule | None = None
    buckets: list[BucketStats] = field(default_factory=list)

    @property
    def wire_bytes(self) -> int:
        return sum(b.wire_bytes for b in self.buckets)

    @property
    def coding_s(self) -> float:
        return sum(b.encode_s + b.decode_s for b in self.buckets)


class LinkpilotHook:
    """State of the hook; register with ``ddp_model.register_comm_hook(state, hook)``.

    board: a KnobBoard or its path (default: LINKPILOT_BOARD or /run/linkpilot/knobs).
    link: the board link whose codec applies (default: the worst link on the board).
    large_bucket_bytes: buckets of at least this many fp32 bytes get the board's codec; smaller
        ones get ``small_codec`` or the board's, whichever is lighter.
    safe_codec: what a rank proposes when its board is missing or stale; also step 0's codec.
    sites: ranks per site (e.g. [[0, 1], [2, 3, 4, 5]]), of any sizes, covering the world.
    cross_backend: with ``sites``, the backend of the cross-site groups when it is not the job's
        (e.g. "gloo" across sites, NCCL over RoCE inside them); payloads cross on the CPU when
        that backend has none for their device.
    on_step: called with each step's stats when the next step begins (its futures are done).
    tuner: the NCCL tuner plugin's gate, where every step's agreed NCCL rule is adopted
        ("auto": the plugin NCCL_TUNER_PLUGIN names, when it is linkpilot's; None: none).
    job_report: where each step's time, exposed communication wait and wire bytes are published
        for the daemon ("auto": its job-report directory, when it exists; None: nowhere).
    """

    def __init__(
        self,
        board: KnobBoard | str | None = None,
        *,
        link: str | None = None,
        large_bucket_bytes: int = 1 << 20,
        small_codec: str = "fp16",
        safe_codec: str = "none",
        sites: Sequence[Sequence[int]] | None = None,
        cross_backend: str | None = None,
        process_group: dist.ProcessGroup | None = None,
        on_step: Callable[[StepStats], None] | None = None,
        history: int = 1000,
        tuner: TunerGate | Literal["auto"] | None = "auto",
        job_report: JobReport | Literal["auto"] | None = "auto",
    ) -> None:
        self.board = board if isinstance(board, KnobBoard) else KnobBoard(board)
        self.link = link
        self.large_bucket_bytes = large_bucket_bytes
        self.small_codec = get_codec(small_codec).name
        self.safe_codec = get_codec(safe_codec).name
        self.on_step = on_step
        self.group = member(process_group if process_group is not None else dist.group.WORLD)
        self.world = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        self.history: deque[StepStats] = deque(maxlen=history)
        self._agreed = Proposal(self.safe_codec)
        self._next = self._agreed
        self._feedback: dict[tuple[int, int], tuple[tuple[int, ...], ErrorFeedback]] = {}
        self._step = 0
        self._current: StepStats | None = None
        self._done: StepStats | None = None
        self._proposal = Proposal(self.safe_codec)
        self._pending: list[_Pending] = []
        self._job_timeout = group_timeout(self.group)
        self._timeout = self._job_timeout
        self._sites = Sites(sites, self.world, self.rank, cross_backend) if sites else None
        self.tuner = TunerGate.from_env() if tuner == "auto" else tuner
        if self.tuner is not None and not self.tuner.usable():
            self.tuner = None
        # The gate is process-wide: an earlier hook may have left a rule there, so the first
        # step adopts (or withdraws) whatever was agreed.
        self._adopted: TunerRule | None | object = _NOTHING_YET
        self._board_problem = ""
        self.job_report = (JobReport.auto(rank=self.rank, world=self.world, kind="ddp", link=link)
                           if job_report == "auto" else job_report)
        self._clock = StepClock()

    # -- per step -----------------------------------------------------------------------------

    def _begin_step(self) -> None:
        timed = self._clock.begin()
        if self._done is not None and timed is not None and self.job_report is not None:
            self.job_report.step(step_s=timed[0], wait_s=timed[1],
                                 wire_bytes=self._done.wire_bytes, codec=self._done.codec)
        if self._done is not None and self.on_step is not None:
            self.on_step(self._done)  # complete now: its decode times came with its futures
        self._done = None
        # What the previous step's collectives agreed on: identical on every rank, and complete,
        # since DDP waited for every bucket's future before this backward pass began.
        self._agreed = self._next
        self._adopt(self._agreed.tuner)
        self._proposal, state, decision = self._read_board()
        self._raise_timeout(max(self._proposal.watchdog_s, self._agreed.watchdog_s))
        self._current = StepStats(self._step, self._agreed.codec, decision, state,
                                  self._proposal.codec, self._agreed.tuner)

    def _adopt(self, rule: TunerRule | None) -> None:
        """The agreed NCCL rule into the plugin, on every rank at this same point (the start of
        a step, before its first bucket's collective), when it changed. A rank without the
        plugin proposes no rule, so then every rank's agreement is none (NCCL's own choices)."""
        if self.tuner is None or rule == self._adopted:
            return
        self.tuner.adopt(rule, self._step)
        log.info("NCCL tuner: %s from step %d", rule or "NCCL's own choices", self._step)
        self._adopted = rule

    def _finish_step(self) -> None:
        assert self._current is not None
        self.history.append(self._current)
        self._done, self._current = self._current, None
        self._step += 1

    def _read_board(self) -> tuple[Proposal, str, int]:
        try:
            snap = self.board.read()
        except BoardError as e:
            if e.problem != self._board_problem:  # once per problem
                log.warning("%s; proposing %s and NCCL's own choices", e, self.safe_codec)
                self._board_problem = e.problem
            return Proposal(self.safe_codec), "missing", 0
        self._board_problem = ""
        knobs = snap.link(self.link) if self.link else snap.worst()
        if snap.stale or knobs is None:
            return Proposal(self.safe_codec), "stale" if snap.stale else "no-link", snap.decision_id
        # A rule only from a rank whose NCCL can follow it: one without the plugin makes the
        # agreement none on every rank.
        rule = _rule(knobs) if self.tuner is not None else None
        return (Proposal(knobs.codec, knobs.watchdog_s, True, rule), knobs.state,
                knobs.decision_id)

    def _raise_timeout(self, watchdog_s: int) -> None:
        """The group's timeout follows the watchdog, never below the job's own setting; it rises
        before the next collective is issued."""
        want = max(self._job_timeout, datetime.timedelta(seconds=watchdog_s))
        if want != self._timeout:
            for group in self._groups():
                set_group_timeout(want, group)
            log.info("collective timeout %s -> %s", self._timeout, want)
            self._timeout = want

    def _groups(self) -> list[dist.ProcessGroup]:
        groups = [self.group]
        if self._sites:
            groups += [self._sites.site_group, *self._sites.cross_groups]
        return groups

    @property
    def timeout(self) -> datetime.timedelta:
        return self._timeout

    @property
    def step(self) -> int:
        return self._step

    def reset(self) -> None:
        """Forget every bucket's residual (e.g. after loading a checkpoint)."""
        self._feedback.clear()

    # -- per bucket ---------------------------------------------------------------------------

    def _codec_for(self, numel: int) -> Codec:
        codec = self._agreed.codec
        if numel * 4 < self.large_bucket_bytes:
            codec = min(codec, self.small_codec, key=strength)
        return get_codec(codec)

    def _feedback_for(self, bucket: GradBucket, shard: int = 0) -> ErrorFeedback:
        """Residuals per bucket (and shard a rank carries across), dropped when DDP rebuilds its
        buckets (other parameters)."""
        key = tuple(id(p) for p in bucket.parameters())
        held = self._feedback.get((bucket.index(), shard))
        if held is None or held[0] != key:
            held = (key, ErrorFeedback())
            self._feedback[(bucket.index(), shard)] = held
        return held[1]

    def __call__(self, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        if self._current is None:
            self._begin_step()
        assert self._current is not None
        self._clock.call()
        buf = bucket.buffer()
        codec = self._codec_for(buf.numel())
        stats = BucketStats(bucket.index(), buf.numel(), codec.name, 0)
        self._current.buckets.append(stats)
        if self._sites is None:
            fut = self._flat(buf, codec, self._feedback_for(bucket), stats)
        else:
            feedback = [self._feedback_for(bucket, k) for k in self._sites.owned]
            fut = self._hierarchical(buf, codec, feedback, stats)
        if bucket.is_last():
            self._drain()
            self._finish_step()
        return fut

    def _flat(self, buf: torch.Tensor, codec: Codec, feedback: ErrorFeedback,
              stats: BucketStats) -> torch.futures.Future[torch.Tensor]:
        exchange = _Exchange(self, codec, self.group, self.world)
        started = time.perf_counter()
        payload = feedback.encode(codec, buf.to(torch.float32).div_(self.world))
        stats.encode_s = time.perf_counter() - started
        stats.wire_bytes = codec.wire_bytes(buf.numel())
        work = exchange.issue(payload, self._proposal)

        def done(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            started = time.perf_counter()
            out = exchange.finish(fut.value(), buf.numel())
            stats.decode_s = time.perf_counter() - started
            self._clock.done()
            return out.to(buf.dtype)

        return work.then(done)

    def _hierarchical(self, buf: torch.Tensor, codec: Codec, feedback: list[ErrorFeedback],
                      stats: BucketStats) -> torch.futures.Future[torch.Tensor]:
        sites = self._sites
        assert sites is not None
        # Inside the site, uncompressed (the local fabric is not the bottleneck), with every
        # rank's proposal riding along so each cross-site message carries its site's strongest.
        flat = buf.to(torch.float32)
        local = flat.new_zeros(flat.numel() + self.world * _PROPOSAL)
        local[: flat.numel()] = flat
        offset = flat.numel() + self.rank * _PROPOSAL
        local[offset : offset + _PROPOSAL] = flat.new_tensor(self._proposal.encode())
        dist.all_reduce(local, group=sites.site_group)
        ranks = [Proposal.decode(_ints(local[flat.numel() + r * _PROPOSAL :][:_PROPOSAL]))
                 for r in sites.site_ranks]
        site_proposal = agree(ranks)
        shard_len = -(-flat.numel() // sites.shards)
        padded = flat.new_zeros(shard_len * sites.shards)
        padded[: flat.numel()] = local[: flat.numel()].div_(self.world)
        crossing = []
        for k, group, residual in zip(sites.owned, sites.cross_groups, feedback):
            exchange = _Exchange(self, codec, group, sites.n_sites)
            started = time.perf_counter()
            payload = residual.encode(codec, padded[k * shard_len :][:shard_len].contiguous())
            stats.encode_s += time.perf_counter() - started
            stats.wire_bytes += codec.wire_bytes(shard_len)
            if payload.device.type not in sites.cross_devices:
                payload = payload.cpu()
            crossing.append((exchange.issue(payload, site_proposal), exchange))
        result: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        self._pending.append(_Pending(crossing, shard_len, flat.numel(), buf, result, stats))
        # The site gathers an earlier bucket's shards here, in the hook body, so that the WAN
        # exchange of that bucket overlapped the backward pass of this one.
        while len(self._pending) > 1:
            self._complete(self._pending.pop(0))
        return result

    def _drain(self) -> None:
        while self._pending:
            self._complete(self._pending.pop(0))

    def _complete(self, p: _Pending) -> None:
        sites = self._sites
        assert sites is not None
        mine = []
        for work, exchange in p.crossing:
            gathered = work.wait()
            started = time.perf_counter()
            mine.append(exchange.finish(gathered, p.shard_len).to(p.buf.device))
            p.stats.decode_s += time.perf_counter() - started
        every = sites.gather(torch.cat(mine), p.shard_len)
        p.result.set_result(every[: p.numel].to(p.buf.dtype))
        self._clock.done()

    def _agreed_next(self, proposals: Sequence[Proposal]) -> None:
        """Called at every collective's completion with the same proposals on every rank; the
        next step uses them."""
        self._next = agree(proposals)


def hook(state: LinkpilotHook, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The function to register: ``model.register_comm_hook(LinkpilotHook(...), hook)``."""
    return state(bucket)


# DDP checks these annotations by identity; this module's are strings (PEP 563).
hook.__annotations__ = {"state": LinkpilotHook, "bucket": GradBucket,
                        "return": torch.futures.Future[torch.Tensor]}


@dataclass
class _Pending:
    #: Each owned shard's collective in flight, and its exchange.
    crossing: list[tuple[torch.futures.Future[list[torch.Tensor]], _Exchange]]
    shard_len: int
    numel: int
    buf: torch.Tensor
    result: torch.futures.Future[torch.Tensor]
    stats: BucketStats


class _Exchange:
    """One bucket's collective: the payload and the proposals, in one message."""

    def __init__(self, state: LinkpilotHook, codec: Codec, group: dist.ProcessGroup,
                 size: int) -> None:
        self.state, self.codec, self.group, self.size = state, codec, group, size
        self.me = dist.get_rank(group)

    def issue(self, payload: torch.Tensor,
              proposal: Proposal) -> torch.futures.Future[list[torch.Tensor]]:
        digits = payload.new_tensor(proposal.encode())
        if self.codec.collective == "all_reduce":
            # Summed: each rank's proposal in its own slot, zeros elsewhere.
            slots = payload.new_zeros(self.size * _PROPOSAL)
            slots[self.me * _PROPOSAL :][:_PROPOSAL] = digits
            msg = torch.cat([payload, slots])
            return dist.all_reduce(msg, group=self.group, async_op=True).get_future()
        msg = torch.cat([payload, digits])
        out = [torch.empty_like(msg) for _ in range(self.size)]
        return dist.all_gather(out, msg, group=self.group, async_op=True).get_future()

    def finish(self, value: list[torch.Tensor], numel: int) -> torch.Tensor:
        """Decodes the sum and hands every rank's proposal to the hook (no collective here)."""
        n = self.codec.payload_numel(numel)
        if self.codec.collective == "all_reduce":
            msg = value[0]
            proposals = [Proposal.decode(_ints(msg[n + r * _PROPOSAL :][:_PROPOSAL]))
                         for r in range(self.size)]
            out = self.codec.decode(msg[:n], numel)
        else:
            proposals = [Proposal.decode(_ints(m[n:])) for m in value]
            out = torch.zeros(numel, dtype=torch.float32, device=value[0].device)
            for m in value:  # rank order: the same sum, bit for bit, on every rank
                out += self.codec.decode(m[:n], numel)
        self.state._agreed_next(proposals)
        return out


def _ints(t: torch.Tensor) -> list[int]:
    return [int(v) for v in t.to(torch.float32).round().tolist()]
