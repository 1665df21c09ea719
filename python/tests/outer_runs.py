"""Real ranks of linkpilot.outer for the tests: ``outer_rank.py`` started as separate processes
(gloo on loopback), a site of them stopped and resumed, and what their JSON lines say (the
exchanges applied, the shards' holders, the sites). Shared by the test_outer_* modules."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from test_train_lm import free_port

WORKER = Path(__file__).with_name("outer_rank.py")


def start(tmp: Path, world: int, *args: str, rank_args: list[list[str]] | None = None
          ) -> tuple[list[subprocess.Popen[bytes]], list[Path]]:
    """Starts ``world`` ranks of outer_rank.py with ``args`` (and rank r's ``rank_args[r]``)."""
    port = free_port()
    procs, outs = [], []
    for r in range(world):
        out = tmp / f"rank{r}.out"
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        with open(out, "w") as o, open(tmp / f"rank{r}.err", "w") as e:
            procs.append(subprocess.Popen(
                [sys.executable, str(WORKER), "--rank", str(r), "--world", str(world),
                 "--port", str(port), *args, *(rank_args[r] if rank_args else [])],
                stdout=o, stderr=e, env=env))
        outs.append(out)
    return procs, outs


def finish(tmp: Path, procs: list[subprocess.Popen[bytes]], outs: list[Path]
           ) -> list[list[dict[str, Any]]]:
    try:
        for r, p in enumerate(procs):
            p.wait(timeout=180)
            assert p.returncode == 0, (tmp / f"rank{r}.err").read_text()
    finally:
        for p in procs:
            p.kill()
    return [[json.loads(line) for line in o.read_text().splitlines()] for o in outs]


def logged_steps(out: Path) -> int:
    return sum('"step"' in line for line in out.read_text().splitlines())


def wait_for_steps(proc: subprocess.Popen[bytes], out: Path, n: int) -> None:
    deadline = time.monotonic() + 120
    while logged_steps(out) < n:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)


def stop_a_site(procs: list[subprocess.Popen[bytes]], outs: list[Path],
                stopped: list[subprocess.Popen[bytes]], seconds: float,
                meanwhile: Callable[[], None] | None = None) -> int:
    """Once rank 0 logged 20 steps, stops the ``stopped`` ranks (a site: a dead link, as the
    others see it) for ``seconds``, calling ``meanwhile`` right after the stop; returns the
    steps rank 0 logged while they were stopped."""
    wait_for_steps(procs[0], outs[0], 20)
    for p in stopped:
        p.send_signal(signal.SIGSTOP)
    before = logged_steps(outs[0])
    if meanwhile is not None:
        meanwhile()
    time.sleep(seconds)
    during = logged_steps(outs[0]) - before
    for p in stopped:
        p.send_signal(signal.SIGCONT)
    return during


def applied_digests(lines: list[dict[str, Any]]) -> dict[tuple[int, int, int], str]:
    return {(x["epoch"], x["round"], x["fragment"]): x["digest"]
            for v in lines if "exchanges" in v for x in v["exchanges"]
            if x["outcome"] == "applied"}


def only_common_exchanges_applied(exchanges: list[list[dict[str, Any]]]
                                  ) -> set[tuple[int, int, int]]:
    """Asserts that every exchange all sites made was applied, and that the others (a site that
    lost rounds to a stop ends before the last rounds of another) were given up on at the end;
    returns the common ones. Rounds wait for the exchange that carries their plan, steps do
    not, so sites that ran as many steps may have run different numbers of rounds."""
    made = [{(x["epoch"], x["round"], x["fragment"]): x["outcome"] for x in ex}
            for ex in exchanges]
    both = set.intersection(*(set(m) for m in made))
    for m in made:
        assert {m[k] for k in both} == {"applied"}, m
        extra = sorted(set(m) - both)
        assert {m[k] for k in extra} <= {"late", "failed"}, m
        assert not extra or extra[0] > max(both), m  # only after the common ones
    return both


def holders(runs: list[list[dict[str, Any]]]) -> list[list[int]]:
    """The ranks that hold each shard of the outer state (every rank: one shard)."""
    shard = [lines[0]["shard"] for lines in runs]
    return [[r for r, k in enumerate(shard) if k == s] for s in sorted(set(shard))]


def site_members(sites: str | None) -> list[list[int]]:
    """The ranks of each site (two one-rank sites without ``sites``), each site sorted."""
    if not sites:
        return [[0], [1]]
    return [sorted(int(r) for r in s.split(",")) for s in sites.split("/")]
