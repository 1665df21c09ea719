"""DDP over gloo on loopback, real ranks (separate processes running linkpilot.ddp_check), with
boards written by the daemon's own writer (`linkpilot board feed`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from conftest import feed_board, free_port

CODECS = ["none", "fp16", "bf16", "int8", "int4", "topk:0.01"]


def wan(codec: str, watchdog_s: int = 300, decision_id: int = 1) -> list[dict[str, Any]]:
    return [{"name": "wan", "state": "test", "state_index": 1, "compression": codec,
             "watchdog_s": watchdog_s, "decision_id": decision_id}]


class Job:
    """`world` ranks of linkpilot.ddp_check; rank r reads boards[r]."""

    def __init__(self, boards: list[Path], *args: str) -> None:
        port = free_port()
        self.seen: dict[int, list[dict[str, Any]]] = {}
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "linkpilot.ddp_check", "--rank", str(r), "--world",
                 str(len(boards)), "--master", f"127.0.0.1:{port}", "--board", str(b),
                 "--timeout-s", "120", *args],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for r, b in enumerate(boards)
        ]

    def first_line(self, rank: int, pred: Any, limit: float = 60) -> dict[str, Any]:
        """Reads rank's stdout up to the first JSON line for which pred holds."""
        stdout = self.procs[rank].stdout
        assert stdout is not None
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            line = stdout.readline()
            if not line:
                break
            v: dict[str, Any] = json.loads(line)
            self.seen.setdefault(rank, []).append(v)
            if pred(v):
                return v
        self.kill()
        raise AssertionError(f"rank {rank} never printed the line: {self.errors()}")

    def finish(self, limit: float = 120) -> list[list[dict[str, Any]]]:
        """Every rank's JSON lines once all exited 0."""
        out = []
        for r, p in enumerate(self.procs):
            try:
                rest, err = p.communicate(timeout=limit)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"rank {r} did not finish: {self.errors()}") from None
            assert p.returncode == 0, f"rank {r} failed ({p.returncode}):\n{err}"
            lines = self.seen.get(r, []) + [json.loads(x) for x in rest.splitlines() if x]
            out.append(lines)
        return out

    def kill(self) -> None:
        for p in self.procs:
            p.kill()

    def errors(self) -> str:
        self.kill()
        return "\n".join(f"--- rank {r}\n{p.communicate()[1]}" for r, p in enumerate(self.procs))


@contextmanager
def job(boards: list[Path], *args: str) -> Iterator[Job]:
    j = Job(boards, *args)
    try:
        yield j
    finally:
        j.kill()


def steps(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [v for v in lines if "step" in v]


def digests(ranks: list[list[dict[str, Any]]]) -> set[str]:
    return {lines[-1]["digest"] for lines in ranks}


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("codec", CODECS)
def test_replicas_stay_identical(tmp_path: Path, world: int, codec: str) -> None:
    boards = [tmp_path / f"r{r}.knobs" for r in range(world)]
    feeders = [feed_board(b) for b in boards]
    for f in feeders:
        f.publish(wan(codec))
    try:
        with job(boards, "--steps", "5", "--safe-codec", codec) as j:
            ranks = j.finish()
    finally:
        for f in feeders:
            f.close()
    assert len(digests(ranks)) == 1, digests(ranks)
    for lines in ranks:
        s = steps(lines)
        assert [v["step"] for v in s] == list(range(5))
        assert {v["codec"] for v in s} == {codec}
        # A model of 6 layers in 0.5 MB buckets: at least 4 buckets a step after the rebuild.
        assert all(len(v["buckets"]) >= 4 for v in s[1:]), s
        big = [b for b in s[-1]["buckets"] if b[1] * 4 >= 256 << 10]
        assert big and all(b[2] == codec for b in big)


def test_codec_switch_mid_run_with_disagreeing_boards(tmp_path: Path) -> None:
    """Rank 0's board says none, then int4; rank 1's says int8, then fp16. Both ranks use the
    strongest codec either proposed, a step after the proposals were exchanged. Each rank reads
    its own board when its step starts, so a step can pair one board's new value with the other's
    old one: the boards change one at a time, each after the ranks showed the one before."""
    boards = [tmp_path / "hk.knobs", tmp_path / "us.knobs"]
    hk, us = feed_board(boards[0]), feed_board(boards[1])
    hk.publish(wan("none", decision_id=1))
    us.publish(wan("int8", decision_id=1))
    try:
        with job(boards, "--steps", "300", "--until-codec", "int4", "--step-sleep", "0.02") as j:
            j.first_line(0, lambda v: v.get("codec") == "int8")
            # int8 withdrawn, none and fp16 left: the weaker fp16 is the strongest proposal.
            us.publish(wan("fp16", decision_id=2))
            j.first_line(0, lambda v: v.get("codec") == "fp16")
            hk.publish(wan("int4", decision_id=2))
            ranks = j.finish()
    finally:
        hk.close()
        us.close()
    assert len(digests(ranks)) == 1, digests(ranks)
    seqs = [[v["codec"] for v in steps(lines)] for lines in ranks]
    assert seqs[0] == seqs[1], seqs
    order = [c for i, c in enumerate(seqs[0]) if i == 0 or seqs[0][i - 1] != c]
    assert order == ["none", "int8", "fp16", "int4"], order
    ids = [[v["decision_id"] for v in steps(lines)] for lines in ranks]
    assert ids[0][-1] == 2 and ids[1][-1] == 2


def test_stale_or_missing_board_gives_the_safe_codec(tmp_path: Path) -> None:
    stale = tmp_path / "stale.knobs"
    f = feed_board(stale)
    f.publish(wan("int4"))
    f.close()  # the writer is gone: its heartbeat stops
    missing = tmp_path / "missing.knobs"
    time.sleep(0.5)  # well past two heartbeats of the feeder's 100 ms
    with job([stale, missing], "--steps", "4", "--safe-codec", "bf16") as j:
        ranks = j.finish()
    assert len(digests(ranks)) == 1
    for lines, state in zip(ranks, ["stale", "missing"]):
        s = steps(lines)
        assert {v["codec"] for v in s} == {"bf16"}, s
        assert {v["board_state"] for v in s} == {state}


def test_timeout_follows_the_watchdog_never_below_the_jobs(tmp_path: Path) -> None:
    boards = [tmp_path / "a.knobs", tmp_path / "b.knobs"]
    a, b = feed_board(boards[0]), feed_board(boards[1])
    a.publish(wan("none", watchdog_s=900))
    b.publish(wan("none", watchdog_s=30))  # below the job's 120 s
    try:
        with job(boards, "--steps", "3") as j:
            ranks = j.finish()
    finally:
        a.close()
        b.close()
    # Rank 0 raised its own at once; rank 1 took the agreed 900 s a step later; nobody went
    # below the job's 120 s.
    assert steps(ranks[0])[0]["timeout_s"] == 900
    assert [v["timeout_s"] for v in steps(ranks[1])][-1] == 900
    assert min(v["timeout_s"] for lines in ranks for v in steps(lines)) >= 120


@pytest.mark.parametrize("codec", ["none", "int8"])
def test_unequal_sites_carry_a_site_each_way_and_agree(tmp_path: Path, codec: str) -> None:
    """Rank 0 alone in one site, ranks 1,2 in the other: rank 0 carries both shards of each
    bucket across, ranks 1 and 2 one each, so each site sends one bucket's worth whatever its
    size; the replicas agree bit for bit. Uncompressed, the loss is what the same job reaches
    with one flat all-reduce (the independent computation: gloo's own sum), up to the order of
    the float additions."""
    from linkpilot.codecs import get_codec

    def run(*args: str) -> list[list[dict[str, Any]]]:
        boards = [tmp_path / f"r{r}.knobs" for r in range(3)]
        feeders = [feed_board(b) for b in boards]
        for f in feeders:
            f.publish(wan(codec))
        try:
            with job(boards, "--steps", "4", "--safe-codec", codec, *args) as j:
                return j.finish()
        finally:
            for f in feeders:
                f.close()

    ranks = run("--sites", "0/1,2")
    assert len(digests(ranks)) == 1, digests(ranks)
    for rank, lines in enumerate(ranks):
        for s in steps(lines):
            for _, numel, name, wire in s["buckets"]:
                shards = 2 if rank == 0 else 1
                assert wire == shards * get_codec(name).wire_bytes(-(-numel // 2)), (rank, s)
    if codec == "none":
        flat = run()
        loss, reference = ranks[0][-1]["loss"], flat[0][-1]["loss"]
        assert abs(loss - reference) <= 1e-5 * abs(reference), (loss, reference)


@pytest.mark.parametrize("codec,cross", [("none", None), ("int8", None), ("int8", "gloo")])
def test_sites_send_a_shard_per_rank_across(tmp_path: Path, codec: str, cross: str | None
                                            ) -> None:
    """Ranks 0,1 and 2,3 share a site: each rank sends 1/2 of each bucket across, encoded, and
    the replicas still agree bit for bit; the cross-site groups on their own backend when given
    one (a job on CPU has only gloo: this checks the groups are made with it, not a device
    change)."""
    from linkpilot.codecs import get_codec

    boards = [tmp_path / f"r{r}.knobs" for r in range(4)]
    feeders = [feed_board(b) for b in boards]
    for f in feeders:
        f.publish(wan(codec))
    try:
        more = ["--cross-backend", cross] if cross else []
        with job(boards, "--steps", "4", "--safe-codec", codec, "--sites", "0,1/2,3",
                 *more) as j:
            ranks = j.finish()
    finally:
        for f in feeders:
            f.close()
    assert len(digests(ranks)) == 1, digests(ranks)
    assert {lines[-1]["cross_backend"] for lines in ranks} == {"gloo"}
    for lines in ranks:
        for s in steps(lines):
            for _, numel, name, wire in s["buckets"]:
                assert wire == get_codec(name).wire_bytes(-(-numel // 2)), s
