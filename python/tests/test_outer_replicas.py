"""linkpilot.outer with real ranks (separate processes, gloo on loopback): every replica holds
the same fragment after each outer step and the same model after close(), whatever the job's
layout: one or several ranks per site, sites of unequal size, a job group that refuses CPU
tensors, FSDP2 and HSDP shards, a site that ends first."""

from __future__ import annotations

from pathlib import Path

import pytest
from outer_runs import applied_digests, finish, holders, site_members, start


# "1,0/4,3,2": sites of 2 and 3 ranks, each in any order (a leader is its shard's smallest
# rank): the outer state in 2 shards, each exchanged by its own pair of leaders, shard 0 held by
# two ranks in site 1 (a hand-over); each shard's outer steps spread to the rest of its site 150
# values a broadcast, several for each fragment (~400), the last one partial. A one-rank site
# against a two-rank one is checked on a group that refuses CPU tensors (below).
@pytest.mark.parametrize("sites", [None, "1,0/4,3,2"])
def test_every_replica_holds_the_same_fragment_after_its_outer_step(
        tmp_path: Path, sites: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "jobs").mkdir()
    monkeypatch.setenv("LINKPILOT_JOBS", str(tmp_path / "jobs"))
    monkeypatch.setenv("LINKPILOT_JOB", "outer-test")
    members = site_members(sites)
    world = sum(len(m) for m in members)
    # Apply steps wait for their exchange (patience = the deadline), so the schedule is fixed:
    # each round's plan exchange (its first) has been applied before the round ends.
    args = ["--steps", "30", "--plan", "6,3,1,int8", "--patience", "30"] + (
        ["--sites", sites, "--spread-chunk", "150"] if sites else [])
    runs = finish(tmp_path, *start(tmp_path, world, *args))
    digests = [applied_digests(lines) for lines in runs]
    shards = holders(runs)
    assert len(shards) == (2 if sites else 1), shards
    # 30 steps of rounds of 6: 5 rounds x 3 fragments of each shard, each applied one step
    # after its send (the last one's by close(), after the last step), the same values at
    # every holder of the shard, and its outer state the same at all of them.
    done = [lines[-1] for lines in runs]
    for ranks in shards:
        assert len(digests[ranks[0]]) == 15, sorted(digests[ranks[0]])
        for r in ranks[1:]:
            assert digests[r] == digests[ranks[0]], (ranks, r)
        assert len({done[r]["outer"] for r in ranks}) == 1, ranks
    if sites:
        assert set(digests[shards[0][0]].values()).isdisjoint(digests[shards[1][0]].values())
    # After close() every rank holds the whole last synchronized model (a DDP site's ranks
    # were handed the other shards' outer steps), and says so.
    assert len({d["digest"] for d in done}) == 1 and all(d["agreed"] for d in done), done
    # Every rank's job report: the 29 steps after the first (a step is its interval between two
    # calls), the bytes its leader handed to the exchange, the plan in force; removed on close.
    for d in done:
        r = d["report"]
        assert (r["job"], r["kind"], r["world"], r["steps"]) == ("outer-test", "outer", world, 29)
        assert (r["codec"], r["sync_every"], r["wire_bytes"]) == ("int8", 6, d["sent_bytes"])
        assert 0 <= r["wait_s"] <= r["step_s"] and d["report_removed"]
    assert sum(d["sent_bytes"] > 0 for d in done) == len(members) * len(shards)


# Unequal sites: a one-rank site (no hand-over) and a two-rank one (a hand-over) in one job.
@pytest.mark.parametrize("sites", ["0/1,2"])
def test_a_job_whose_group_refuses_cpu_tensors_syncs_over_groups_of_its_own(
        tmp_path: Path, sites: str | None) -> None:
    """The job's process group serves CUDA tensors only, as an NCCL-only one does: OuterSync
    still starts, exchanges, hands over inside a site and closes, and every replica holds the
    same fragments after each outer step."""
    members = site_members(sites)
    world = sum(len(m) for m in members)
    args = ["--steps", "24", "--plan", "6,3,1,int8", "--patience", "30", "--cuda-only"] + (
        ["--sites", sites] if sites else [])
    runs = finish(tmp_path, *start(tmp_path, world, *args))
    digests = [applied_digests(lines) for lines in runs]
    assert len(digests[0]) == 12, sorted(digests[0])
    for d in digests[1:]:
        assert d == digests[0]
    assert len({runs[m[0]][-1]["outer"] for m in members}) == 1
    for m in members:
        assert len({runs[r][-1]["digest"] for r in m}) == 1, m


def test_a_site_that_ends_first_leaves_every_replica_with_the_same_model(
        tmp_path: Path) -> None:
    """The case that used to end with two models: equal step counts (96), site 1 slowed by
    20 ms a step, H 8 in 2 fragments overlapped by a step. Site 0 finishes first; its last
    exchange gives site 1 the same outer state in place of its next exchange; site 1 trains on
    alone and, at close(), goes back to that state: both end with the same parameters."""
    args = ["--steps", "96", "--plan", "8,2,1,int8"]
    runs = finish(tmp_path, *start(tmp_path, 2, *args,
                                   rank_args=[[], ["--sleep", "0.02"]]))
    done = [lines[-1] for lines in runs]
    assert done[0]["agreed"] and done[1]["agreed"], done
    assert done[0]["digest"] == done[1]["digest"] and done[0]["outer"] == done[1]["outer"]


def test_fsdp_and_hsdp_shards_sync_among_their_holders_and_close_identical(
        tmp_path: Path) -> None:
    """Site 0: 4 ranks, HSDP (two replicas of a 2-way shard); site 1: 2 ranks, FSDP2 (one
    2-way shard). Each shard is synchronized among the ranks that hold it (a leader per site
    and shard, handing over to its replica in site 0): after every outer step every holder of a
    shard holds the same values, and after close() every rank holds the same whole model."""
    args = ["--steps", "24", "--plan", "6,3,1,int8", "--patience", "30", "--sites",
            "0,1,2,3/4,5", "--fsdp", "2"]
    runs = finish(tmp_path, *start(tmp_path, 6, *args))
    shard = [lines[0]["shard"] for lines in runs]
    assert shard == [0, 1, 0, 1, 0, 1], shard
    digests = [applied_digests(lines) for lines in runs]
    for k in (0, 1):
        holders = [digests[r] for r in range(6) if shard[r] == k]
        assert len(holders[0]) == 12 and all(d == holders[0] for d in holders), (k, holders)
    assert set(digests[0].values()).isdisjoint(digests[1].values())
    done = [lines[-1] for lines in runs]
    assert len({d["whole"] for d in done}) == 1 and all(d["agreed"] for d in done), done


def test_every_rank_of_a_sharded_site_counts_the_same_rounds_and_stops_together(
        tmp_path: Path) -> None:
    """Each shard of an FSDP2 site has its own exchange, whose round may begin a step later
    than another shard's (its plan's exchange had not landed): a loop on ``rounds_done`` must
    still stop every rank of a site at the same step, or their FSDP collectives mismatch. H 2
    in 2 fragments, with no patience, makes late plan exchanges the rule."""
    args = ["--steps", "400", "--rounds", "12", "--plan", "2,2,0,int8", "--patience", "0",
            "--sites", "0,1/2,3", "--fsdp", "2"]
    runs = finish(tmp_path, *start(tmp_path, 4, *args))
    for site in ((0, 1), (2, 3)):
        counts = [[(x["step"], x["rounds_done"]) for x in runs[r] if "step" in x] for r in site]
        assert counts[0] == counts[1], site
        assert counts[0][-1][1] == 12, counts[0][-1]
    done = [lines[-1] for lines in runs]
    assert len({d["whole"] for d in done}) == 1 and all(d["agreed"] for d in done), done
