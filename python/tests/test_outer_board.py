"""linkpilot.outer.board: round plans from the daemon's knob board (written by the daemon's own
writer, `linkpilot board feed`), and sites whose boards disagree and change mid-round still
running the same plan in every round, with identical replicas after every outer step."""

from __future__ import annotations

import struct
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import pytest
from conftest import Feeder
from outer_runs import (
    applied_digests,
    finish,
    only_common_exchanges_applied,
    start,
    stop_a_site,
)
from test_train_lm import SCRIPT, TINY, free_port

from linkpilot.board import MAGIC, SIZE, BoardError, BoardFormatError, KnobBoard
from linkpilot.outer import PlanInputs, RoundPlan, auto_sync_every
from linkpilot.outer.board import BoardPlan

NUMEL = 3_323_648
START = RoundPlan(4, 1, 0, "int8")


def wan(**knobs: Any) -> dict[str, Any]:
    return {"name": "hk-us", "decision_id": 1, "rtt_us": 180_000, **knobs}


def ask(plans: BoardPlan, compute_s: float = 0.22) -> RoundPlan | None:
    return plans(PlanInputs(START, NUMEL, 2, compute_s))


#: Auto H on the board: between 8 and 400 steps, 4 fragments, a 20% margin.
AUTO: dict[str, Any] = dict(sync_every=0, sync_min=8, sync_max=400, fragments=4,
                            sync_margin_bp=2000)


def auto_board(tmp_path: Path, board_feeder: Callable[..., Feeder]
               ) -> tuple[Feeder, BoardPlan]:
    """A board with auto H on a 200 Mbit/s link that delivered nothing yet, and its plans."""
    feeder = board_feeder(tmp_path / "knobs")
    feeder.publish([wan(**AUTO, capacity_bps=200_000_000)])
    return feeder, BoardPlan(KnobBoard(tmp_path / "knobs"))


def test_a_fixed_plan_on_the_board_is_proposed_and_starts_the_run(
        tmp_path: Path, board_feeder: Callable[..., Feeder]) -> None:
    feeder = board_feeder(tmp_path / "knobs")
    feeder.publish([wan(sync_every=40, fragments=4, overlap=12, outer_compression="int4",
                        max_drift=160)])
    plans = BoardPlan(KnobBoard(tmp_path / "knobs"))
    assert plans.max_drift == 160
    assert plans.initial(START) == RoundPlan(40, 4, 9, "int4")  # overlap below 40 / 4 steps
    assert ask(plans) == RoundPlan(40, 4, 9, "int4")
    feeder.publish([wan(sync_every=1)])  # per-step exchange
    assert ask(plans) == RoundPlan(1, 1, 0, "int8")


def test_auto_h_follows_the_delivered_rate_and_the_measured_compute(
        tmp_path: Path, board_feeder: Callable[..., Feeder]) -> None:
    # Nothing delivered yet: the link's capacity.
    feeder, plans = auto_board(tmp_path, board_feeder)
    assert plans.initial(START) == START  # auto needs compute time: the caller's plan
    assert ask(plans, compute_s=0.0) is None
    expected = auto_sync_every(rate_bps=200e6, rtt_s=0.18, compute_s=0.22, numel=NUMEL,
                               codec="int8", sites=2, fragments=4, margin=0.2, bounds=(8, 400))
    assert expected == (12, 2)
    assert ask(plans) == RoundPlan(12, 4, 2, "int8")
    # A small move of the rate keeps H (every change restarts a round) ...
    feeder.publish([wan(**AUTO, capacity_bps=200_000_000, delivery_bps=180_000_000)])
    assert ask(plans) == RoundPlan(12, 4, 2, "int8")
    # ... a congested link (10 Mbit/s delivered) moves it: (0.67 + 0.18) x 1.2 s -> overlap 5.
    feeder.publish([wan(**AUTO, capacity_bps=200_000_000, delivery_bps=10_000_000)])
    assert ask(plans) == RoundPlan(24, 4, 5, "int8")
    # Slower compute (1.1 s a step) hides the same 1.02 s exchange in one step.
    assert ask(plans, compute_s=1.1) == RoundPlan(8, 4, 1, "int8")


def test_auto_h_makes_room_for_exchanges_that_took_longer_than_the_link_model(
        tmp_path: Path, board_feeder: Callable[..., Feeder]) -> None:
    _, plans = auto_board(tmp_path, board_feeder)
    in_force = RoundPlan(12, 4, 2, "int8")

    def ask_measured(exchange_s: float, plan: RoundPlan = in_force) -> RoundPlan | None:
        return plans(PlanInputs(plan, NUMEL, 2, 0.22, exchange_s))

    # The model's 0.26 s fits 2 steps; exchanges of this size took 0.9 s (a window restarted
    # after each idle gap): 0.9 x 1.2 = 1.08 s -> 5 steps of overlap, H = 4 x 6.
    assert ask_measured(0.0) == RoundPlan(12, 4, 2, "int8")
    assert ask_measured(0.9) == RoundPlan(24, 4, 5, "int8")
    # Faster than the model: the model stands.
    assert ask_measured(0.05) == RoundPlan(12, 4, 2, "int8")
    # Measured under other fragments or another codec: not comparable, the model alone.
    assert ask_measured(0.9, RoundPlan(12, 2, 2, "int8")) == ask_measured(0.0)
    assert ask_measured(0.9, RoundPlan(12, 4, 2, "int4")) == ask_measured(0.0)


def test_a_stale_board_proposes_nothing(tmp_path: Path,
                                        board_feeder: Callable[..., Feeder]) -> None:
    feeder = board_feeder(tmp_path / "knobs", heartbeat_ms=50)
    feeder.publish([wan(sync_every=40, fragments=4)])
    plans = BoardPlan(KnobBoard(tmp_path / "knobs"))
    assert ask(plans) == RoundPlan(40, 4, 0, "int8")
    feeder.close()
    deadline = time.monotonic() + 5
    while ask(plans) is not None:
        assert time.monotonic() < deadline, "the board never went stale"
        time.sleep(0.05)
    assert plans.initial(START) == START


def test_boards_it_cannot_follow_are_refused_before_training(
        tmp_path: Path, board_feeder: Callable[..., Feeder]) -> None:
    old = tmp_path / "old"
    old.write_bytes(struct.pack("<8sII", MAGIC, 2, SIZE) + bytes(SIZE - 16))
    with pytest.raises(BoardFormatError, match="layout version 2, this reader knows 3"):
        BoardPlan(KnobBoard(old))
    board_feeder(tmp_path / "knobs").publish([wan()])
    with pytest.raises(BoardError, match="no link named 'eu-us'"):
        BoardPlan(KnobBoard(tmp_path / "knobs"), link="eu-us")
    # A missing board is not an error: the daemon may start after the job.
    assert BoardPlan(KnobBoard(tmp_path / "none")).initial(START) == START
    # The training script says so and stops before its first step.
    port = free_port()
    out = subprocess.run([sys.executable, str(SCRIPT), "--rank", "0", "--world", "1", "--master",
                          f"127.0.0.1:{port}", *TINY, "--steps", "5", "--hook", "outer",
                          "--board", str(old)], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "layout version 2" in out.stderr, out.stderr
    assert '"step"' not in out.stdout


@pytest.mark.parametrize("sites", [None, "0,1/2,3"])
def test_sites_whose_boards_disagree_and_change_mid_round_run_the_same_plans(
        tmp_path: Path, board_feeder: Callable[..., Feeder], sites: str | None) -> None:
    boards = [tmp_path / "knobs0", tmp_path / "knobs1"]
    feeders = [board_feeder(b, heartbeat_ms=500) for b in boards]
    feeders[0].publish([wan(sync_every=4, fragments=2, overlap=1, outer_compression="int8")])
    feeders[1].publish([wan(sync_every=6, fragments=3, overlap=0, outer_compression="int4")])
    per_site = 2 if sites else 1
    procs, outs = start(tmp_path, 2 * per_site, "--steps", "90", "--plan", "4,1,0,int8",
                        "--sleep", "0.03", *(["--sites", sites] if sites else []),
                        rank_args=[["--board", str(b)] for b in boards for _ in range(per_site)])

    def steps(r: int) -> int:
        return sum('"step"' in line for line in outs[r].read_text().splitlines())

    deadline = time.monotonic() + 120
    while steps(0) < 30:
        assert time.monotonic() < deadline and procs[0].poll() is None
        time.sleep(0.02)
    # Mid-run and mid-round: site 0's link turns bad (int4, longer rounds), site 1's recovers.
    feeders[0].publish([wan(sync_every=12, fragments=4, overlap=2, outer_compression="int4")])
    feeders[1].publish([wan(sync_every=4, fragments=2, overlap=1, outer_compression="int8")])
    every_rank = finish(tmp_path, procs, outs)
    # A site's ranks report the plan in force at every step, as its leader does.
    for leader, other in zip(every_rank[::per_site], every_rank[per_site - 1::per_site]):
        in_force = [[v["plan"] for v in lines if "step" in v] for lines in (leader, other)]
        assert in_force[0] == in_force[1]
    runs = every_rank[::per_site]
    plans: list[dict[tuple[int, int], tuple[Any, ...]]] = [defaultdict(tuple) for _ in runs]
    outcomes: list[dict[tuple[int, int], set[str]]] = [defaultdict(set) for _ in runs]
    for r, lines in enumerate(runs):
        for v in lines:
            for x in v.get("exchanges", []):
                plans[r][(x["epoch"], x["round"])] = tuple(x["plan"])
                outcomes[r][(x["epoch"], x["round"])].add(x["outcome"])
    both = plans[0].keys() & plans[1].keys()
    assert {k: plans[0][k] for k in both} == {k: plans[1][k] for k in both}
    # A round only one site began is the run's last: the other ended before the proposals
    # deciding it landed there, so none of its exchanges was applied.
    for r in (0, 1):
        for k in plans[r].keys() - both:
            assert k == max(plans[r]) and "applied" not in outcomes[r][k], (k, outcomes[r][k])
    used = set(plans[0].values())
    # The first round runs the starting plan; then the agreement of both boards (the larger
    # H, fragments and overlap, the stronger codec); after the change, the new agreement.
    assert (4, 1, 0, "int8") in used and (6, 3, 1, "int4") in used, used
    assert (12, 4, 2, "int4") in used, used
    assert applied_digests(runs[0]) == applied_digests(runs[1])
    assert runs[0][-1]["outer"] == runs[1][-1]["outer"]


def test_a_plan_changed_while_exchanges_are_late_is_adopted_alike_without_a_resync(
        tmp_path: Path, board_feeder: Callable[..., Feeder]) -> None:
    """Site 1 stops for 3 s (past the patience, inside the deadline) and both boards ask for
    longer rounds meanwhile: site 0 has exchanges late, site 1 none once it is back. Both adopt
    the new plan at the same round, from the exchange that carries it, and nobody resyncs (a
    site that held its plan while it had late exchanges disagreed with one that had none)."""
    boards = [tmp_path / "knobs0", tmp_path / "knobs1"]
    feeders = [board_feeder(b, heartbeat_ms=500) for b in boards]
    for f in feeders:
        f.publish([wan(sync_every=4, fragments=2, overlap=1, outer_compression="int8")])
    procs, outs = start(tmp_path, 2, "--steps", "120", "--plan", "4,2,1,int8", "--sleep",
                        "0.05", "--deadline", "20", "--patience", "0.5", "--max-drift", "1000",
                        rank_args=[["--board", str(b)] for b in boards])

    def longer_rounds() -> None:
        for f in feeders:
            f.publish([wan(sync_every=8, fragments=2, overlap=2, outer_compression="int4")])

    during = stop_a_site(procs, outs, procs[1:], 3.0, longer_rounds)
    runs = finish(tmp_path, procs, outs)
    assert during >= 20, during
    exchanges = [[x for v in lines if "exchanges" in v for x in v["exchanges"]] for lines in runs]
    assert max(x["late_steps"] for x in exchanges[0]) >= 5
    assert {x["epoch"] for ex in exchanges for x in ex} == {0}, "a resync"
    plans: list[dict[tuple[int, int], tuple[Any, ...]]] = [defaultdict(tuple) for _ in runs]
    for r, ex in enumerate(exchanges):
        for x in ex:
            plans[r][(x["epoch"], x["round"])] = tuple(x["plan"])
    both = only_common_exchanges_applied(exchanges)
    rounds = {k[:2] for k in both}
    assert {k: v for k, v in plans[0].items() if k in rounds} == {
        k: v for k, v in plans[1].items() if k in rounds}
    assert (8, 2, 2, "int4") in plans[0].values(), plans[0]
    assert applied_digests(runs[0]) == applied_digests(runs[1])
    assert runs[0][-1]["outer"] == runs[1][-1]["outer"]


def test_an_auto_outer_codec_is_chosen_with_h(
        tmp_path: Path, board_feeder: Callable[..., Feeder]) -> None:
    feeder = board_feeder(tmp_path / "knobs")
    auto = dict(AUTO, outer_codec_auto=True, outer_weakest="none", outer_compression="int4")
    plans = BoardPlan(KnobBoard(tmp_path / "knobs"))

    def h_with(codec: str, rate: float) -> tuple[int, int]:
        return auto_sync_every(rate_bps=rate, rtt_s=0.18, compute_s=0.22, numel=NUMEL,
                               codec=codec, sites=2, fragments=4, margin=0.2, bounds=(8, 400))

    # 10 Gbit/s: every codec's exchange is the round trip; the same H, so the weakest.
    feeder.publish([wan(**auto, capacity_bps=10_000_000_000)])
    h, overlap = h_with("none", 10e9)
    assert h == h_with("int4", 10e9)[0]
    assert ask(plans) == RoundPlan(h, 4, overlap, "none")
    # 10 Mbit/s: uncompressed fragments take 2.8 s, int4 ones 0.5: int4 syncs most often.
    feeder.publish([wan(**auto, capacity_bps=10_000_000_000, delivery_bps=10_000_000)])
    h, overlap = h_with("int4", 10e6)
    assert h < h_with("int8", 10e6)[0] < h_with("none", 10e6)[0]
    assert ask(plans) == RoundPlan(h, 4, overlap, "int4")
    # Bounds: never weaker than the board's weakest.
    feeder.publish([wan(**{**auto, "outer_weakest": "int8"}, capacity_bps=10_000_000_000)])
    assert ask(plans).codec == "int8"  # type: ignore[union-attr]


def test_an_auto_outer_codec_with_a_fixed_h_is_the_weakest_that_fits(
        tmp_path: Path, board_feeder: Callable[..., Feeder]) -> None:
    feeder = board_feeder(tmp_path / "knobs")
    fixed = dict(sync_every=40, fragments=4, overlap=9, sync_margin_bp=2000,
                 outer_codec_auto=True, outer_weakest="none", outer_compression="int4")
    plans = BoardPlan(KnobBoard(tmp_path / "knobs"))
    # 9 inner steps of 0.22 s hide 1.98 s: at 10 Mbit/s an uncompressed fragment takes 2.84 s
    # (3.41 with the margin), an fp16 one 1.51 (1.81).
    feeder.publish([wan(**fixed, capacity_bps=10_000_000)])
    assert ask(plans) == RoundPlan(40, 4, 9, "fp16")
    feeder.publish([wan(**fixed, capacity_bps=10_000_000_000)])
    assert ask(plans) == RoundPlan(40, 4, 9, "none")
    # At 1 Mbit/s nothing fits: the strongest.
    feeder.publish([wan(**fixed, capacity_bps=1_000_000)])
    assert ask(plans) == RoundPlan(40, 4, 9, "int4")


def test_a_measured_exchange_shifts_every_codecs_estimate() -> None:
    from linkpilot.board import LinkKnobs
    from linkpilot.outer.board import _Exchange, candidates

    knobs = LinkKnobs(name="wan", state="s", state_index=0, compression="none", topk_ratio=0.0,
                      chunk_bytes=0, tcp_buffer_bytes=0, watchdog_s=0, nccl_ib_timeout=0,
                      nccl_ib_retry_cnt=0, dscp=0, roce_traffic_class=0, decision_id=1,
                      nccl_min_bytes=0, nccl_algo="auto", nccl_proto="auto",
                      nccl_max_channels=0, rtt_us=180_000, outer_codec="topk:0.01",
                      outer_codec_auto=True, outer_weakest="fp16")
    assert candidates(knobs) == ["fp16", "int8", "int4", "topk:0.01"]
    plan = RoundPlan(40, 4, 9, "int8")
    model = _Exchange(knobs, PlanInputs(plan, NUMEL, 2, 0.22), 4, 200e6)
    assert model.measured("int8") == 0.0  # nothing measured yet
    base = {c: model.seconds(c) for c in ("none", "int8", "int4")}
    # int8's fragments took 1 s where the model says 0.21: every codec is 0.79 s slower.
    measured = _Exchange(knobs, PlanInputs(plan, NUMEL, 2, 0.22, exchange_s=1.0), 4, 200e6)
    for codec, s in base.items():
        assert abs(measured.seconds(codec) - (s + 1.0 - base["int8"])) < 1e-9
    assert abs(measured.measured("int8") - 1.0) < 1e-9
    # Measured with other fragments: another size, not this one's.
    other = _Exchange(knobs, PlanInputs(plan, NUMEL, 2, 0.22, exchange_s=1.0), 2, 200e6)
    assert other.measured("int8") == 0.0
