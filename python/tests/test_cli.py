"""`python -m linkpilot status` as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO, feed_board


def status(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    pythonpath = os.pathsep.join(filter(None, [str(REPO / "python"), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "linkpilot", "status", *args],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": pythonpath, **(env or {})},
    )


def test_json_of_a_fed_board(tmp_path: Path) -> None:
    path = tmp_path / "knobs"
    with feed_board(path, heartbeat_ms=1000) as feeder:
        feeder.publish([
            {"name": "hk-us", "state": "severe", "state_index": 3, "compression": "topk:0.01",
             "decision_id": 42},
            {"name": "eu", "compression": "bf16", "chunk_bytes": 3 << 19, "decision_id": 41},
        ])
        out = status("--json", "--board", str(path))
        human = status(env={"LINKPILOT_BOARD": str(path)})
    assert out.returncode == 0, out.stderr
    board = json.loads(out.stdout)
    assert (board["path"], board["pid"], board["decision_id"]) == (str(path), feeder.pid, 42)
    assert (board["stale"], board["heartbeat_interval_ms"]) == (False, 1000)
    hk, eu = board["links"]
    assert hk == {
        "name": "hk-us", "state": "severe", "state_index": 3, "compression": "topk",
        "topk_ratio": 0.01, "codec": "topk:0.01", "chunk_bytes": 8 << 20,
        "tcp_buffer_bytes": 128 << 20, "watchdog_s": 600, "nccl_ib_timeout": 22,
        "nccl_ib_retry_cnt": 7, "dscp": 26, "roce_traffic_class": 106, "decision_id": 42,
        "nccl_min_bytes": 1 << 20, "nccl_algo": "tree", "nccl_proto": "simple",
        "nccl_max_channels": 0, "rtt_us": 0, "sync_every": 1, "sync_min": 1, "sync_max": 500,
        "sync_margin": 0.2, "max_drift": 2000, "outer_codec": "int8",
        "outer_codec_auto": False, "outer_weakest": "none", "fragments": 1,
        "overlap": 0, "delivery_bps": 0, "capacity_bps": 0,
    }
    assert (eu["codec"], eu["chunk_bytes"]) == ("bf16", 3 << 19)
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert f"pid {feeder.pid}, decision 42" in lines[0] and lines[0].endswith(": fresh")
    assert lines[2].split() == [
        "hk-us", "severe", "(3)", "topk:0.01", "8MiB", "128MiB", "600s", "22", "7", "26", "106",
        "42",
    ]
    assert lines[3].split()[:5] == ["eu", "healthy", "(0)", "bf16", "1.5MiB"]


def test_a_stale_board_says_so(tmp_path: Path) -> None:
    path = tmp_path / "knobs"
    with feed_board(path, heartbeat_ms=1) as feeder:
        feeder.publish([{"name": "wan"}])
    out = status("--board", str(path))
    assert out.returncode == 0 and "STALE" in out.stdout.splitlines()[0], out


def test_a_missing_or_bad_board_is_one_line_and_exit_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_bytes(b"\0" * 1528)
    for path, words in [(tmp_path / "none", "no such file"), (bad, "not a knob board")]:
        out = status("--board", str(path))
        assert (out.returncode, out.stdout) == (1, ""), out
        assert out.stderr.startswith(f"linkpilot: knob board {path}: {words}"), out.stderr
        assert out.stderr.count("\n") == 1, out.stderr
