"""docs/training.md's job shapes run as printed under torchrun, and every rank of each ends
with the same model (the same checksum, close() agreed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from test_train_lm import free_port

DOC = REPO / "docs" / "training.md"
#: A stand-in for NCCL: like it, a backend that refuses CPU tensors (see outer_rank.py).
CUDA_ONLY = Path(__file__).with_name("outer_rank.py")


def examples() -> dict[str, tuple[int, str]]:
    """Each example's file name -> (ranks, code), from the "Job shapes" section."""
    section = DOC.read_text().split("## Job shapes", 1)[1].split("\n## ", 1)[0]
    found = {}
    for code in re.findall(r"```python\n(.*?)```", section, re.S):
        m = re.match(r"# (\S+\.py) -- run with: torchrun --nproc_per_node (\d+) \1\n", code)
        assert m, code.splitlines()[0]
        found[m.group(1)] = (int(m.group(2)), code)
    return found


def test_the_section_has_an_example_per_shape() -> None:
    assert sorted(examples()) == ["outer_ddp.py", "outer_fsdp.py", "outer_nccl.py",
                                  "outer_unequal.py"]


@pytest.mark.parametrize("name", ["outer_ddp.py", "outer_unequal.py", "outer_fsdp.py",
                                  "outer_nccl.py"])
def test_a_job_shape_runs_as_printed_and_ends_identical(tmp_path: Path, name: str) -> None:
    ranks, code = examples()[name]
    script = tmp_path / name
    script.write_text(code)
    env = dict(os.environ, OMP_NUM_THREADS="1", LINKPILOT_JOBS=str(tmp_path / "no-jobs"),
               LINKPILOT_ENV_FILE=str(tmp_path / "no-daemon.env"))
    run = script
    if name == "outer_nccl.py":
        # The stand-in registered first, then the example unchanged.
        env["BACKEND"] = "cudaonly"
        run = tmp_path / "launch.py"
        run.write_text(
            "import runpy, sys\n"
            f"sys.path.insert(0, {str(CUDA_ONLY.parent)!r})\n"
            "from outer_rank import cuda_only_backend\n"
            "cuda_only_backend()\n"
            f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
    # Each rank's stdout into a file of its own: on one shared pipe, unbuffered print()s of
    # two ranks interleave (the text and its newline are separate writes).
    logs = tmp_path / "logs"
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
         "--master_port", str(free_port()), "--log-dir", str(logs), "--redirects", "1",
         str(run)],
        capture_output=True, text=True, env=env, timeout=240)
    assert out.returncode == 0, out.stderr[-4000:]
    stdouts = sorted(logs.rglob("stdout.log"))
    assert len(stdouts) == ranks, stdouts
    lines = sorted(line for f in stdouts for line in f.read_text().splitlines()
                   if line.startswith("rank "))
    assert len(lines) == ranks, lines
    assert all("agreed True" in line for line in lines), lines
    assert len({line.rsplit("checksum ", 1)[1] for line in lines}) == 1, lines
    if name == "outer_unequal.py":
        # The fast site (ranks 1 and 2, in step with each other) took more steps than the
        # slow one (rank 0) in as many rounds. (By how much depends on this machine's load:
        # the benchmark measures it.)
        steps = [int(re.search(r": (\d+) steps", line).group(1))  # type: ignore[union-attr]
                 for line in lines]
        assert steps[1] == steps[2] > steps[0], lines
