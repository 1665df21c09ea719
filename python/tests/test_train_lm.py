"""The training benchmark's workload (python/benchmarks/train_lm.py): its data order, its eval
windows, and short 2-rank runs over gloo on loopback (real ranks, separate processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import torch

from benchmarks.lm_data import Corpus, batch_offsets, eval_offsets, load_corpus, windows
from conftest import REPO, free_port

SCRIPT = REPO / "python" / "benchmarks" / "train_lm.py"
TINY = ["--width", "32", "--depth", "1", "--heads", "2", "--seq", "16", "--batch", "2",
        "--data-mib", "0.1", "--eval-windows", "2", "--eval-every", "2", "--bucket-mb", "0.01",
        "--large-bucket-bytes", "4096", "--timeout-s", "60"]


def corpus() -> Corpus:
    return load_corpus(0.1)


def test_global_batch_is_the_same_for_any_split_over_ranks() -> None:
    c = corpus()

    def global_batch(step: int, world: int, batch: int) -> torch.Tensor:
        return torch.cat([batch_offsets(c, 7, step, r, world, batch, 16) for r in range(world)])

    two, four = global_batch(3, 2, 4), global_batch(3, 4, 2)
    assert torch.equal(two, four) and two.numel() == 8
    assert torch.equal(two, global_batch(3, 2, 4))  # deterministic
    assert not torch.equal(two, global_batch(4, 2, 4))  # a new batch each step
    assert not torch.equal(two, torch.cat([batch_offsets(c, 8, 3, r, 2, 4, 16) for r in (0, 1)]))
    assert int(two.max()) + 17 <= c.n_train  # windows stay in the training text
    x, y = windows(c, two, 16)
    assert x.shape == y.shape == (8, 16) and torch.equal(x[:, 1:], y[:, :-1])


def test_data_and_eval_windows_are_fixed() -> None:
    a, b = corpus(), corpus()
    assert a.sha256 == b.sha256 and len(a.data) == int(0.1 * (1 << 20))
    assert a.n_train == int(len(a.data) * 0.95)
    # The first file by relative path leads, as raw bytes.
    lead = Path(sysconfig.get_paths()["stdlib"], "__future__.py").read_bytes()[:200]
    assert bytes(a.data[:200].tolist()) == lead
    first = eval_offsets(a, 4, 16)
    assert torch.equal(first, eval_offsets(b, 4, 16))
    assert int(first.min()) == a.n_train and int(first.max()) + 17 == len(a.data)


def run_job(*args: str, world: int = 2) -> list[subprocess.Popen[str]]:
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return [subprocess.Popen([sys.executable, str(SCRIPT), "--rank", str(r), "--world",
                              str(world), "--master", f"127.0.0.1:{port}", *TINY, *args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for r in range(world)]


def finish(procs: list[subprocess.Popen[str]], limit: float = 120) -> list[list[dict[str, Any]]]:
    out = []
    for r, p in enumerate(procs):
        try:
            stdout, stderr = p.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"rank {r} did not finish") from None
        assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{stderr}"
        out.append([json.loads(line) for line in stdout.splitlines()])
    return out


def test_two_ranks_train_and_stay_identical() -> None:
    # Both configurations at once (the machine's cores are few; most of the time is imports).
    fixed = run_job("--hook", "fixed", "--codec", "int8", "--steps", "5")
    plain = run_job("--hook", "none", "--duration", "0", "--sync-every", "5", "--steps", "50",
                    "--all-ranks-report")
    try:
        runs = [(finish(fixed), "int8", "steps"), (finish(plain), "none", "duration")]
    finally:
        for p in fixed + plain:
            p.kill()
    for ranks, codec, stopped in runs:
        starts = [v for lines in ranks for v in lines if v.get("start")]
        assert len({v["data"]["sha256"] for v in starts}) == 1
        params = starts[0]["params"]
        done = [lines[-1] for lines in ranks]
        assert all(d["done"] and d["steps"] == 5 and d["stopped"] == stopped for d in done), done
        assert len({d["digest"] for d in done}) == 1, done
        assert done[0]["final_eval_loss"] > 0
        for lines in ranks if codec == "none" else ranks[:1]:
            steps = [v for v in lines if "step" in v]
            assert [v["step"] for v in steps] == list(range(5))
            assert all(v["t_start"] <= v["t_end"] and v["loss"] > 0 for v in steps)
            assert [v["step"] for v in steps if "eval_loss" in v] == [1, 3, 4]
            assert {v["codec"] for v in steps} == {codec}
            if codec == "none":
                assert {v["wire_bytes"] for v in steps} == {4 * params}
                assert "sync_s" in steps[-1]
            else:
                assert {v["board_state"] for v in steps} == {"missing"}
                big = [b for b in steps[-1]["buckets"] if b[0] * 4 >= 4096]
                assert big and {b[1] for b in big} == {"int8"}
                assert steps[-1]["wire_bytes"] < 4 * params / 2
        if codec == "int8":  # without --all-ranks-report, rank 1 prints only its last line
            assert len(ranks[1]) == 1


def test_a_lost_peer_fails_fast_with_status_3() -> None:
    procs = run_job("--hook", "fixed", "--codec", "int8", "--steps", "100000")
    try:
        stdout = procs[0].stdout
        assert stdout is not None
        line: dict[str, Any] = {}
        while "step" not in line:  # rank 0 has done a step: kill rank 1 mid-training
            line = json.loads(stdout.readline())
        assert "loss" in line, line
        procs[1].kill()
        rest, stderr = procs[0].communicate(timeout=60)
    finally:
        for p in procs:
            p.kill()
    last = json.loads(rest.splitlines()[-1])
    assert procs[0].returncode == 3, stderr
    assert last["failed"] and last["step"] >= 1 and last["rank"] == 0, last


def test_a_stop_file_stops_every_rank_at_its_step_and_checkpoints_evaluate_as_in_run(
        tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    stop.write_text("4\n")
    ckpt = tmp_path / "ckpt"
    procs = run_job("--hook", "fixed", "--codec", "int8", "--stop-file", str(stop),
                    "--checkpoint-every-s", "0.000001", "--checkpoint-dir", str(ckpt),
                    "--eval-every", "0", "--all-ranks-report")
    ranks = finish(procs)
    done = [lines[-1] for lines in ranks]
    assert all(d["done"] and d["steps"] == 4 and d["stopped"] == "stop-file" for d in done), done
    assert len({d["digest"] for d in done}) == 1, done
    for lines in ranks:
        steps = [v for v in lines if "step" in v]
        assert [v["step"] for v in steps] == [0, 1, 2, 3]
        assert {v["proposed"] for v in steps} == {"int8"}  # the fixed hook's safe codec
    # Rank 0 alone saved, after every step (the interval is shorter than a step).
    assert sorted(p.name for p in ckpt.iterdir()) == [f"step-00000{n}.pt" for n in (1, 2, 3, 4)]
    evaluator = REPO / "python" / "benchmarks" / "eval_checkpoints.py"
    out = subprocess.run([sys.executable, str(evaluator), "--dir", str(ckpt), "--windows", "2",
                          "--noise-sets", "3", "--threads", "1"],
                         capture_output=True, text=True, timeout=120, check=True)
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    curve, noise = lines[:-1], lines[-1]["eval_noise"]
    assert [v["steps"] for v in curve] == [1, 2, 3, 4]
    t_end = {v["step"] + 1: v["t_end"] for v in ranks[0] if "step" in v}
    assert all(v["t_end"] == t_end[v["steps"]] for v in curve)
    # The same parameters on the same windows: the in-run evaluation after the last step.
    assert curve[-1]["eval_loss"] == done[0]["final_eval_loss"]
    assert noise["steps"] == 4 and noise["windows"] == 2 and len(noise["losses"]) == 3
    assert noise["stdev"] > 0 and noise["range"] >= noise["stdev"]


def test_checkpoint_evaluation_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    evaluator = REPO / "python" / "benchmarks" / "eval_checkpoints.py"
    empty = subprocess.run([sys.executable, str(evaluator), "--dir", str(tmp_path)],
                           capture_output=True, text=True, timeout=60)
    assert empty.returncode != 0 and "no step-*.pt checkpoints" in empty.stderr
    bad = subprocess.run([sys.executable, str(evaluator), "--dir", str(tmp_path),
                          "--noise-sets", "1"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--noise-sets" in bad.stderr


def test_own_clocks_stop_a_site_of_two_ranks_at_one_step_and_close_agrees() -> None:
    # Hong Kong one rank, the US two: each site stops on its own clock, the US ranks together.
    procs = run_job("--hook", "outer", "--sites", "0/1,2", "--own-clock", "--duration", "3",
                    "--pace", "time", "--outer-every", "4", "--fragments", "2", world=3)
    ranks = finish(procs)
    done = [lines[-1] for lines in ranks]
    assert all(d["done"] and d["stopped"] == "duration" for d in done), done
    assert done[1]["steps"] == done[2]["steps"], done
    assert len({d["digest"] for d in done}) == 1, done
