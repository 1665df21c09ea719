"""The README's DDP example runs as printed, under torchrun, against a board the daemon's own
writer published."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from conftest import REPO, feed_board


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("### Training side", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README's Training side has no python block"
    return match.group(1)


def test_readme_example_runs_under_torchrun(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(readme_example())
    board = tmp_path / "knobs"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with feed_board(board) as feeder:
        feeder.publish([{"name": "wan", "state": "congested", "state_index": 1,
                         "compression": "int8", "decision_id": 3}])
        env = dict(os.environ, LINKPILOT_BOARD=str(board), OMP_NUM_THREADS="1",
                   LINKPILOT_ENV_FILE=str(tmp_path / "no-daemon.env"))
        out = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
             "--master_port", str(port), str(script)],
            capture_output=True, text=True, env=env, timeout=180)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("step ")]
    assert len(lines) == 20, out.stdout
    # Step 0 runs the safe codec; from step 1 the agreed board codec on the large bucket.
    assert "step 19: int8 on a congested link" in lines[-1], lines[-1]
