"""The NCCL tuner plugin answers the same on every rank of a communicator, whatever each rank's
own knob board says: three ranks in separate processes (tuner_rank.py), each with its own board
(different states, one switching mid-run, one going stale and its daemon restarting), each
asking the plugin about the same collectives every step, as NCCL does on every rank. The
linkpilot hook drives the plugin's gate as it does in training.

The plugin is $LINKPILOT_TUNER_PLUGIN, else the repository's debug build (`cargo build -p
linkpilot-nccl-tuner`). A plugin that follows each host's board (linkpilot's before the gate)
fails this test: its ranks disagree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, Feeder, feed_board
from test_train_lm import free_port

WORKER = Path(__file__).with_name("tuner_rank.py")
WORLD = 3
STEPS = 40
STEP_SLEEP = 0.15


def plugin() -> str:
    path = os.environ.get("LINKPILOT_TUNER_PLUGIN") or str(
        REPO / "target" / "debug" / "libnccl_tuner_linkpilot.so")
    if not os.path.exists(path):
        pytest.fail(f"no tuner plugin at {path}: `cargo build -p linkpilot-nccl-tuner`, or point "
                    "LINKPILOT_TUNER_PLUGIN at one", pytrace=False)
    return path


def link(state: str, index: int, algo: str, proto: str, channels: int, chunk: int,
         decision: int, rtt_us: int) -> dict[str, Any]:
    return {"name": "hk-us", "state": state, "state_index": index, "compression": "int8",
            "chunk_bytes": chunk, "nccl_algo": algo, "nccl_proto": proto,
            "nccl_max_channels": channels, "nccl_min_bytes": 1 << 20, "decision_id": decision,
            "rtt_us": rtt_us}


HEALTHY = link("healthy", 0, "tree", "simple", 0, 8 << 20, 1, 180_000)
CONGESTED = link("congested", 1, "ring", "ll128", 4, 2 << 20, 2, 181_000)
SEVERE = link("severe", 2, "ring", "simple", 2, 1 << 20, 3, 181_000)


def test_every_rank_answers_the_same_for_every_collective(tmp_path: Path) -> None:
    so = plugin()
    boards = [tmp_path / f"knobs{r}" for r in range(WORLD)]
    feeders: list[Feeder] = [feed_board(b, heartbeat_ms=50) for b in boards]
    # Two sites whose RTT baselines differ by 1 ms; one of them congested from the start.
    feeders[0].publish([HEALTHY])
    feeders[1].publish([CONGESTED])
    feeders[2].publish([HEALTHY])
    port = free_port()
    procs, logs = [], []
    for r in range(WORLD):
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
                   LINKPILOT_BOARD=str(boards[r]), LINKPILOT_TUNER_STATS=str(tmp_path),
                   NCCL_BUFFSIZE=str(8 << 20), LINKPILOT_NCCL_NET_LATENCY_US="90000")
        env.pop("LINKPILOT_LINK", None)
        # Files, not pipes: a rank blocked on a full pipe would stall every rank's collectives.
        logs.append((tmp_path / f"rank{r}.out", tmp_path / f"rank{r}.err"))
        with open(logs[r][0], "w") as out, open(logs[r][1], "w") as err:
            procs.append(subprocess.Popen(
                [sys.executable, str(WORKER), "--rank", str(r), "--world", str(WORLD), "--port",
                 str(port), "--board", str(boards[r]), "--plugin", so, "--steps", str(STEPS),
                 "--sleep", str(STEP_SLEEP)],
                stdout=out, stderr=err, text=True, env=env))

    def rank0_steps() -> int:
        return sum('"step"' in line for line in logs[0][0].read_text().splitlines())

    try:
        # While the ranks train: rank 1's link degrades further; rank 2's daemon dies (its
        # board goes stale) and a new one starts (a new board file at the path); rank 1's link
        # recovers.
        for at_step, what in ((6, "severe"), (14, "dies"), (22, "restarts"), (30, "recovers")):
            deadline = time.monotonic() + 120
            while rank0_steps() < at_step:
                assert all(p.poll() is None for p in procs), [lg[1].read_text() for lg in logs]
                assert time.monotonic() < deadline, "the ranks stopped stepping"
                time.sleep(0.02)
            if what == "severe":
                feeders[1].publish([SEVERE])
            elif what == "dies":
                feeders[2].close()
            elif what == "restarts":
                feeders[2] = feed_board(boards[2], heartbeat_ms=50)
                feeders[2].publish([CONGESTED])
            else:
                feeders[1].publish([HEALTHY])
        outs = []
        for r, p in enumerate(procs):
            p.wait(timeout=180)
            assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{logs[r][1].read_text()}"
            outs.append([json.loads(line) for line in logs[r][0].read_text().splitlines()])
    finally:
        for p in procs:
            p.kill()
        for f in feeders:
            f.close()
    # NCCL's cost model starts from the same constants on every rank: the job-wide latency,
    # never a host's own RTT.
    nets = [next(v["net"] for v in lines if "net" in v) for lines in outs]
    assert nets[0] == nets[1] == nets[2], nets
    assert nets[0][2] == 14.0 + 90_000
    steps = [[v for v in lines if "step" in v] for lines in outs]
    assert all(len(s) == STEPS for s in steps), [len(s) for s in steps]
    differ = [i for i in range(STEPS) if not (
        steps[0][i]["answers"] == steps[1][i]["answers"] == steps[2][i]["answers"])]
    assert not differ, (
        f"the ranks answered NCCL differently at steps {differ}: rank 0 "
        f"{steps[0][differ[0]]['answers']}, rank 1 {steps[1][differ[0]]['answers']}, rank 2 "
        f"{steps[2][differ[0]]['answers']}")
    # Not vacuous: the answers followed the link through several decisions, and NCCL's own
    # choices while a rank's board was stale.
    distinct = {json.dumps(s["answers"]) for s in steps[0]}
    assert len(distinct) >= 3, [s["tuner"] for s in steps[0]]
    assert any(s["board_state"] == "stale" for s in steps[2]), [s["board_state"] for s in steps[2]]
    rules = [s["tuner"] for s in steps[0]]
    assert None in rules[1:] and any(r and "state_index=2" in r for r in rules), rules
