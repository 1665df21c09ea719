"""linkpilot.outer riding through outages, with real ranks (separate processes, gloo on
loopback): a site stopped past the exchange deadline (no failed step, the other site keeps
stepping, a resync, then identical again), an exchange slower than the patience applied late,
the drift bound; and, without ranks, an apply step that lands late writing its own outer
step's values."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from outer_runs import (
    applied_digests,
    finish,
    holders,
    only_common_exchanges_applied,
    site_members,
    start,
    stop_a_site,
)

from linkpilot.codecs import get_codec
from linkpilot.outer.exchange import Exchanger, Job
from linkpilot.outer.fragments import Fragments
from linkpilot.outer.ledger import Ledger
from linkpilot.outer.plan import RoundPlan, RoundStats, pack_header
from linkpilot.outer.state import OuterState


# "0/1,2": a one-rank site and a two-rank one (whose ranks hand over), the cluster's shape;
# "0,1/2,3": two-rank sites, each shard of the outer state ridden through by its own exchange.
@pytest.mark.parametrize("sites", [None, "0/1,2", "0,1/2,3"])
def test_a_site_stopped_past_the_deadline_is_ridden_through(tmp_path: Path,
                                                            sites: str | None) -> None:
    members = site_members(sites)
    world = sum(len(m) for m in members)
    procs, outs = start(tmp_path, world, "--steps", "200", "--plan", "4,2,1,int8", "--sleep",
                        "0.05", "--deadline", "1.5", "--max-drift", "1000",
                        *(["--sites", sites] if sites else []))
    stopped = [procs[r] for r in members[1]]  # the second site, all of its ranks

    # The second site stops (a dead link, as the first sees it) for longer than the deadline.
    during = stop_a_site(procs, outs, stopped, 4.0)
    runs = finish(tmp_path, procs, outs)
    # Site 0 kept taking inner steps (0.05 s of sleep each and the model's compute).
    assert during >= 20, during
    outcomes = [x["outcome"] for v in runs[0] if "exchanges" in v for x in v["exchanges"]]
    assert {"late", "failed", "skipped"} & set(outcomes), outcomes
    # Every rank resynced (a new epoch) and holds the same fragments after every later outer
    # step; inside a site the ranks hold the same parameters.
    epochs = {lines[-2]["outer_epoch"] for lines in runs}
    assert len(epochs) == 1 and min(epochs) >= 1, epochs
    digests = [applied_digests(lines) for lines in runs]
    for ranks in holders(runs):
        last = runs[ranks[0]][-2]["outer_epoch"]
        after = {k: v for k, v in digests[ranks[0]].items() if k[0] == last}
        assert len(after) >= 4
        for r in ranks[1:]:
            assert all(digests[r].get(k) == v for k, v in after.items()), (after, digests[r])
        assert len({runs[r][-1]["outer"] for r in ranks}) == 1
    for m in members:
        assert len({runs[r][-1]["digest"] for r in m}) == 1, m


def test_an_exchange_slower_than_the_patience_is_applied_late_and_no_step_waits(
        tmp_path: Path) -> None:
    # The second site stops for 3 s: less than the deadline, more than the patience.
    procs, outs = start(tmp_path, 2, "--steps", "140", "--plan", "4,2,1,int8", "--sleep",
                        "0.05", "--deadline", "20", "--patience", "1", "--max-drift", "1000")
    during = stop_a_site(procs, outs, procs[1:], 3.0)
    runs = finish(tmp_path, procs, outs)
    # Site 0 waited 1 s once, then stepped on (0.05 s of sleep and the model's compute a step).
    # (It cannot tell a stopped site from a dead link.)
    assert during >= 20, during
    # Nothing was given up on and nobody resynced: every exchange both sites made was applied,
    # site 0's late ones as they landed, with the same values as site 1 wrote on time. Rounds
    # wait for their plan's exchange, steps do not: site 0 lost rounds to the stop, so site 1
    # may end with a round site 0 never began, given up on when it closes.
    exchanges = [[x for v in lines if "exchanges" in v for x in v["exchanges"]] for lines in runs]
    both = only_common_exchanges_applied(exchanges)
    late = [x["late_steps"] for x in exchanges[0]]
    assert max(late) >= 5, late
    # Once the link is back, the site ahead waits for the other to catch up: on time again.
    assert late[-10:] == [0] * 10, late
    assert {lines[-2]["outer_epoch"] for lines in runs} == {0}
    # While its exchanges were late, site 0 sent no new round: a round begins once the exchange
    # that carries its plan has landed (the stop cost rounds, not steps). Both sites applied
    # the same exchanges with the same values.
    digests = [applied_digests(lines) for lines in runs]
    assert 40 <= len(digests[0]) < 140 // 2 and digests[1] == digests[0], len(digests[0])
    assert set(digests[0]) == both
    assert runs[0][-1]["outer"] == runs[1][-1]["outer"]


def test_past_the_drift_bound_a_site_waits_and_an_ended_site_is_not_waited_for(
        tmp_path: Path) -> None:
    """Site 1 stops for 4 s: site 0 takes inner steps up to the drift bound (8), then waits,
    and both resync when site 1 is back. Site 1 then ends its run 60 steps before site 0:
    site 0 does not wait for it at the drift bound again, and finishes."""
    procs, outs = start(tmp_path, 2, "--plan", "4,2,1,int8", "--sleep", "0.05", "--deadline",
                        "1.5", "--max-drift", "8", rank_args=[["--steps", "160"],
                                                              ["--steps", "100"]])

    during = stop_a_site(procs, outs, procs[1:], 4.0)
    runs = finish(tmp_path, procs, outs)
    # At most the drift bound since the last applied fragment (one at most in flight).
    assert during <= 8 + 1, f"{during} steps while site 1 was stopped"
    assert runs[0][-1]["done"] and runs[1][-1]["done"]
    assert sum("step" in v for v in runs[0]) == 160
    assert max(v.get("outer_epoch", 0) for v in runs[0]) >= 1


def test_an_apply_step_writes_its_own_outer_steps_values_even_after_a_later_one_landed() -> None:
    # The exchange thread's commit and the training side's settle, as OuterSync runs them: a
    # fragment's exchange lands (its outer step taken), and the same fragment's next exchange
    # lands before the first is applied (it was late). Each apply must write the values of its
    # own outer step; no copy is kept while nothing else writes the range.
    n, plan = 600, RoundPlan(4, 1, 1, "int8")
    codec = get_codec(plan.codec)
    state = OuterState(torch.zeros(n), torch.zeros(0), lr=1.0, momentum=0.0, nesterov=True)
    ledger = Ledger(on_round=None, job_report=None)
    fragments = Fragments(state, ledger, deadline_s=30.0)
    exchanger = SimpleNamespace(rank=0, size=2, sync=SimpleNamespace(state=state), landed_at=0.0)
    g = torch.Generator().manual_seed(0)

    def land(rnd: int) -> tuple[Job, torch.Tensor]:
        """An exchange of round ``rnd`` landing: its job and the outer values it leaves."""
        stats = RoundStats(0, rnd, 0, 0, plan, codec.wire_bytes(n), 0, n)
        job = Job(stats, None, 0, n)
        sent = [torch.randn(n, generator=g) for _ in range(2)]
        heads = [pack_header(0, rnd, 0, 0, plan, plan).tolist() for _ in range(2)]
        payloads = [codec.encode(x) for x in sent]
        want = state.outer - sum(codec.decode(p, n) for p in payloads) / 2
        assert Exchanger._commit(exchanger, job, heads, payloads, 0.0)  # type: ignore[arg-type]
        assert torch.allclose(state.outer, want) and job.values is None
        return job, want

    first, after_first = land(0)
    second, after_second = land(1)  # before the first is applied
    assert first.values is not None and second.values is None
    for job, want in ((first, after_first), (second, after_second)):
        note = fragments.settle(job)
        assert note is not None and note[0] == "apply" and note[5] is not None
        assert torch.equal(note[5], want)
    assert state.unapplied == [] and fragments.applied == 2
    assert [s.outcome for s in ledger.history] == []  # recorded by the apply step, not here
