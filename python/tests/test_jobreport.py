"""Job reports: the file's format and life, and what real DDP ranks with the hook publish."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import feed_board
from linkpilot import jobreport
from linkpilot.jobreport import REPORT_SIZE, JobReport, StepClock, job_name

#: The daemon's parser reads this same text in its own test (controller/src/board/job_reports.rs).
WRITTEN = ('{"version":1,"job":"lm-7","rank":1,"world":4,"kind":"ddp","link":"wan","steps":12,'
           '"step_s":3.5,"compute_s":2.75,"wait_s":0.75,"wire_bytes":1200000,"failed":0,'
           '"codec":"int8","sync_every":null,"loss":2.25,"netns":4026531993,"netns_cookie":4099,'
           '"updated":1796198400.5}')


def read(path: str) -> dict[str, Any]:
    raw = Path(path).read_bytes()
    assert len(raw) == REPORT_SIZE and raw.endswith(b"\n")
    doc: dict[str, Any] = json.loads(raw)
    return doc


def test_the_file_is_what_the_daemon_parses(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobreport.time, "time", lambda: 1796198400.5)
    monkeypatch.setattr(jobreport, "network_namespace", lambda: (4026531993, 4099))
    r = JobReport(str(tmp_path), rank=1, world=4, kind="ddp", job="lm-7", link="wan")
    for step_s, wait in ((1.625, 0.25), (1.875, 0.5)):  # 3.5 s of steps, 0.75 s waiting
        r.step(step_s=step_s, wait_s=wait, wire_bytes=600_000, codec="int8")
    r.totals.steps = 12
    r.set_loss(2.25)
    assert r.encode() == WRITTEN.encode().ljust(REPORT_SIZE - 1) + b"\n"
    r.close()


def test_the_report_names_this_processs_network_namespace(tmp_path: Path) -> None:
    inum, cookie = jobreport.network_namespace()
    assert inum == os.stat("/proc/self/ns/net").st_ino
    assert cookie is not None and cookie > 0  # Linux 5.14+
    r = JobReport(str(tmp_path), rank=0, world=1, kind="ddp", job="j")
    assert (read(r.path)["netns"], read(r.path)["netns_cookie"]) == (inum, cookie)
    r.close()


def test_the_file_is_locked_while_alive_and_removed_on_close(tmp_path: Path) -> None:
    r = JobReport(str(tmp_path), rank=0, world=1, kind="outer", job="j")
    name = Path(r.path).name
    pid, tag = name.split("-")
    assert int(pid) == os.getpid() and len(tag) == 16
    with open(r.path, "rb") as other:  # another open file description: the lock is held
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert read(r.path)["steps"] == 0
    r.close()
    assert not Path(r.path).exists()


def test_bad_names_are_refused_and_a_missing_directory_means_no_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="job name"):
        JobReport(str(tmp_path), rank=0, world=1, kind="ddp", job="a b")
    with pytest.raises(ValueError, match="rank 2"):
        JobReport(str(tmp_path), rank=2, world=2, kind="ddp", job="a")
    monkeypatch.setenv("LINKPILOT_JOBS", str(tmp_path / "absent"))
    assert JobReport.auto(rank=0, world=1, kind="ddp") is None
    monkeypatch.setenv("LINKPILOT_JOB", "")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run/42 x")
    assert job_name() == "run_42_x"


def test_a_takeover_with_a_bad_rank_ends_the_started_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("LINKPILOT_JOBS", str(tmp_path))
    monkeypatch.setattr(jobreport, "_unclaimed", None)
    started = JobReport.at_init(rank=1, world=2)
    assert started is not None and read(started.path)["kind"] == "init"
    assert JobReport.at_init(rank=1, world=2) is started  # one per process
    assert JobReport.auto(rank=2, world=2, kind="ddp") is None
    assert "rank 2 must be in [0, world 2)" in caplog.text
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("LINKPILOT_JOBS", str(tmp_path / "absent"))
    assert JobReport.at_init(rank=0, world=1) is None


def test_the_clock_counts_the_wait_after_the_last_hand_over() -> None:
    c = StepClock()
    assert c.begin() is None
    c.call()
    time.sleep(0.05)
    c.call()  # the last bucket handed over
    time.sleep(0.1)
    c.done()
    step = c.begin()
    assert step is not None
    step_s, wait_s = step
    assert 0.15 <= step_s < 1 and 0.1 <= wait_s < step_s


def test_ddp_ranks_publish_their_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two real ranks with the hook and 0.3 s of 'compute' a step: each one's file holds the
    steps it finished, the bytes its own step lines say it sent, and step time at least the
    compute."""
    from test_ddp import job, steps, wan

    jobs = tmp_path / "jobs"
    jobs.mkdir()
    monkeypatch.setenv("LINKPILOT_JOBS", str(jobs))
    monkeypatch.setenv("LINKPILOT_JOB", "pytest-job")
    boards = [tmp_path / f"r{r}.knobs" for r in range(2)]
    feeders = [feed_board(b) for b in boards]
    for f in feeders:
        f.publish(wan("int8"))
    try:
        with job(boards, "--steps", "6", "--step-sleep", "0.3", "--safe-codec", "int8") as j:
            ranks = j.finish()
    finally:
        for f in feeders:
            f.close()
    reports = sorted((read(str(p)) for p in jobs.iterdir()), key=lambda d: int(d["rank"]))
    assert [(d["job"], d["rank"], d["world"], d["kind"]) for d in reports] == [
        ("pytest-job", 0, 2, "ddp"), ("pytest-job", 1, 2, "ddp")]
    for d, lines in zip(reports, ranks):
        # A step is published when the next one begins: the last one is not.
        assert d["steps"] == 5
        sent = {s["step"]: s["wire_bytes"] for s in steps(lines)}
        assert d["wire_bytes"] == sum(sent[s] for s in range(5))
        assert d["codec"] == "int8"
        assert d["step_s"] >= 5 * 0.3
        assert 0 <= d["wait_s"] < d["step_s"]
        assert d["compute_s"] + d["wait_s"] == pytest.approx(d["step_s"], abs=1e-5)
        assert isinstance(d["loss"], float)
