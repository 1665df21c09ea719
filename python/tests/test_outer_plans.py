"""linkpilot.outer's plans, without ranks: checked and agreed, H chosen to hide the exchange,
a round paced by time shared out among sites of unequal speed, and the measured exchange time
the plan source is given."""

from __future__ import annotations

import pytest

from linkpilot.outer import RoundPlan, agree_plans, auto_sync_every, paced_share, site_plan
from linkpilot.outer.ledger import Ledger
from linkpilot.outer.plan import RoundStats


def test_plans_are_checked_and_agreed() -> None:
    assert RoundPlan(10, 2, 4, "INT8").check() == RoundPlan(10, 2, 4, "int8")
    for bad, words in [(RoundPlan(0), "sync_every 0"), (RoundPlan(4, 5), "fragments 5"),
                       (RoundPlan(8, 2, 4), "overlap 4"), (RoundPlan(4, codec="int3"), "int3")]:
        with pytest.raises(ValueError, match=words):
            bad.check()
    with pytest.raises(ValueError, match="more than the 3 parameters"):
        RoundPlan(8, 4).check(numel=3)
    got = agree_plans([RoundPlan(10, 2, 1, "int8"), RoundPlan(40, 4, 2, "int4"),
                       RoundPlan(20, 8, 9, "none")])
    assert got == RoundPlan(40, 8, 4, "int4")  # overlap kept below 40 / 8 steps


def test_auto_sync_every_fits_the_exchange_inside_the_overlap() -> None:
    # 13.3 MB of fp32 in 4 fragments at int8: 0.83 MB each way; 200 Mbit/s, 180 ms RTT,
    # 0.22 s of compute a step, 20% margin: (0.18 + 0.033) x 1.2 = 0.26 s -> 2 steps.
    h, overlap = auto_sync_every(rate_bps=200e6, rtt_s=0.18, compute_s=0.22, numel=3_323_648,
                                 codec="int8", sites=2, fragments=4, margin=0.2,
                                 bounds=(8, 500))
    assert (h, overlap) == (12, 2)
    # A slower link needs more overlap and H grows with it: at 10 Mbit/s (0.67 + 0.18) x 1.2 =
    # 1.02 s -> 5 steps; at 2 Mbit/s 20 steps, but H stops at its bound and the overlap below
    # the 10 steps between sends.
    assert auto_sync_every(rate_bps=10e6, rtt_s=0.18, compute_s=0.22, numel=3_323_648,
                           codec="int8", sites=2, fragments=4, margin=0.2,
                           bounds=(8, 40)) == (24, 5)
    assert auto_sync_every(rate_bps=2e6, rtt_s=0.18, compute_s=0.22, numel=3_323_648,
                           codec="int8", sites=2, fragments=4, margin=0.2,
                           bounds=(8, 40)) == (40, 9)


def test_the_measured_exchange_time_is_the_median_of_the_latest_of_the_plans_size() -> None:
    int8, int4 = RoundPlan(12, 4, 2, "int8"), RoundPlan(12, 4, 2, "int4")

    def stats(plan: RoundPlan, took: float, outcome: str = "applied") -> RoundStats:
        return RoundStats(0, 0, 0, 0, plan, 0, outcome=outcome, exchange_s=took)

    # Older than the latest 16: the 9 s ones. Not applied: the late and the skipped ones.
    history = [stats(int8, 9.0)] * 20 + [stats(int8, t) for t in (0.5, 0.9, 0.7)] + [
        stats(int4, 3.0), stats(int8, 5.0, "late")] + [stats(int8, 0.0, "skipped")] * 11
    ledger = Ledger(on_round=None, job_report=None)
    ledger.history.extend(history)
    assert ledger.exchange_s(int8) == 0.7
    assert ledger.exchange_s(int4) == 3.0
    assert ledger.exchange_s(RoundPlan(12, 2, 2, "int8")) == 0.0


def test_a_round_paced_by_time_gives_each_site_the_steps_that_fit() -> None:
    plan = RoundPlan(24, 2, 3, "int8")
    # Site 1's steps take 3x as long: 4 of its steps between two sends to site 0's 12, and
    # the overlap (3 steps of site 0) becomes 1 of its own.
    assert site_plan(plan, [20_000, 60_000], 0) == plan
    assert site_plan(plan, [20_000, 60_000], 1) == RoundPlan(8, 2, 1, "int8")
    # 2.5x: the slow site's 4.8 steps round to 5 (0.25 s), and the fast site takes the 12.5
    # of its own that fit, 12: neither waits a step for the other.
    assert site_plan(plan, [20_000, 50_000], 1) == RoundPlan(10, 2, 2, "int8")
    assert site_plan(plan, [20_000, 50_000], 0) == RoundPlan(24, 2, 3, "int8")
    # 3.3x: 3.64 steps round to 4 (0.264 s a send); the fast site fits 13 of its own in that.
    assert site_plan(plan, [20_000, 66_000], 1) == RoundPlan(8, 2, 1, "int8")
    assert site_plan(plan, [20_000, 66_000], 0) == RoundPlan(26, 2, 4, "int8")
    # Far slower: two steps between sends (one to send in, one to hide the exchange behind),
    # and the fast site fills their time, hiding its exchange behind one slow step.
    assert site_plan(plan, [1_000, 900_000], 1) == RoundPlan(4, 2, 1, "int8")
    assert site_plan(plan, [1_000, 900_000], 0) == RoundPlan(3600, 2, 900, "int8")
    # Without an overlap in the plan one step is enough.
    assert site_plan(RoundPlan(24, 2, 0), [1_000, 900_000], 1) == RoundPlan(2, 2, 0, "int8")
    # A site that has not measured its steps yet: every site takes the plan's.
    assert site_plan(plan, [0, 60_000], 1) == plan


def test_a_paced_site_carries_the_fraction_of_a_step_that_did_not_fit() -> None:
    """3.3x slower: 4 slow steps (0.264 s) a send set the pace, and the fast site fits 13.2 of
    its own: 13 a send for four rounds, then 14, so that its sends keep the slow site's pace
    instead of running ahead by 0.2 of a step a send and waiting for it."""
    plan, carry, taken = RoundPlan(24, 2, 3, "int8"), 0.0, []
    for _ in range(10):
        share, carry = paced_share(plan, [20_000, 66_000], 0, carry)
        taken.append(share.sync_every // share.fragments)
        assert 0 <= carry < 1
    assert taken == [13, 13, 13, 13, 14, 13, 13, 13, 13, 14], taken
    assert paced_share(plan, [20_000, 66_000], 1, 0.0) == (RoundPlan(8, 2, 1, "int8"), 0.0)
