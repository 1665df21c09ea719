"""Unequally fast sites: does the fast site keep computing while the slow one runs?

Two one-rank sites of ``train_lm.py`` on loopback (the WAN is not what is measured here: the
link's share is in the lab benchmarks). Hong Kong (rank 0) is slowed with a cgroup CPU limit
(``--slow-share`` of one CPU: v2's ``cpu.max``, or v1's CFS quota), as an A100 site beside an H100 one; the US (rank 1)
runs unlimited. Each configuration runs ``--seconds`` of wall time, and the configurations are
interleaved repeat by repeat, so a noisy minute of this shared machine hits each alike:

- ``alone``: each site trains by itself (two jobs of one rank): each site's ceiling, the steps
  it takes when it never waits;
- ``ddp``: one job, per-step DDP (co-located, the slow site sets the pace every step);
- ``outer-steps``: OuterSync, H steps a round at every site (the fixed-H plan: the fast site
  waits for the slow one every round);
- ``outer-time``: OuterSync with ``pace="time"``: each site takes the steps that fit H steps of
  the fastest, pseudo-gradients weighted by samples; each rank stops on its own clock and
  close() gives both the same model.

Prints one JSON line per run: configuration, repeat, each site's steps, steps/s and share of its
ceiling (steps/s over the same repeat's ``alone`` steps/s), and the final eval loss (for
``outer-*``, of the model close() left, the same at both sites).

    python python/benchmarks/unequal_sites.py [--seconds 45] [--repeats 3] [--slow-share 0.33]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

TRAIN = Path(__file__).with_name("train_lm.py")
MODEL = ["--width", "128", "--depth", "2", "--heads", "4", "--seq", "64", "--batch", "8",
         "--data-mib", "2", "--eval-windows", "64", "--eval-every", "0", "--lr", "3e-3"]
CONFIGS = ["alone", "ddp", "outer-steps", "outer-time"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SlowGroup:
    """A cgroup limited to ``share`` of one CPU: cgroup v2's ``cpu.max`` where the unified
    hierarchy has the cpu controller, else v1's ``cpu`` hierarchy (``cpu.cfs_quota_us``)."""

    PERIOD_US = 100_000

    def __init__(self, share: float) -> None:
        quota = int(share * self.PERIOD_US)
        self.enabled: Path | None = None
        v2 = next((p for p in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
                   if "cpu" in _read(p / "cgroup.controllers").split()), None)
        if v2 is not None:
            control = v2 / "cgroup.subtree_control"
            if "cpu" not in control.read_text().split():
                control.write_text("+cpu")
                self.enabled = control
            self.path = v2 / "linkpilot-bench-slow"
            self.path.mkdir(exist_ok=True)
            (self.path / "cpu.max").write_text(f"{quota} {self.PERIOD_US}")
        elif (Path("/sys/fs/cgroup/cpu") / "cpu.cfs_quota_us").exists():
            self.path = Path("/sys/fs/cgroup/cpu/linkpilot-bench-slow")
            self.path.mkdir(exist_ok=True)
            (self.path / "cpu.cfs_period_us").write_text(str(self.PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            raise SystemExit("no cgroup with a CPU limit here (cgroup v2 with the cpu controller, "
                             "or v1's cpu hierarchy, is needed)")

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        self.path.rmdir()
        if self.enabled is not None:
            self.enabled.write_text("-cpu")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def launch(config: str, seconds: float, out: Path, slow: SlowGroup
           ) -> list[subprocess.Popen[bytes]]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
               LINKPILOT_JOBS=str(out / "no-jobs"))
    common = [sys.executable, str(TRAIN), *MODEL, "--duration", str(seconds),
              "--timeout-s", "120", "--all-ranks-report"]
    if config == "alone":
        ranks = [[*common, "--rank", "0", "--world", "1", "--master",
                  f"127.0.0.1:{free_port()}"] for _ in range(2)]
    else:
        master = f"127.0.0.1:{free_port()}"
        extra = ["--hook", "none"] if config == "ddp" else [
            "--hook", "outer", "--sites", "0/1", "--outer-every", "10", "--fragments", "2",
            "--overlap", "1", "--own-clock", "--pace", config.removeprefix("outer-")]
        ranks = [[*common, "--rank", str(r), "--world", "2", "--master", master, *extra]
                 for r in range(2)]
    procs = []
    for r, cmd in enumerate(ranks):
        with open(out / f"{config}-{r}.out", "w") as o, open(out / f"{config}-{r}.err", "w") as e:
            procs.append(subprocess.Popen(cmd, stdout=o, stderr=e, env=env))
        if r == 0:  # Hong Kong: the slow site
            slow.add(procs[0].pid)
    return procs


def result(config: str, out: Path) -> list[dict[str, Any]]:
    sites = []
    for r in range(2):
        lines = [json.loads(x) for x in (out / f"{config}-{r}.out").read_text().splitlines()
                 if x.startswith("{")]
        steps = [v for v in lines if "step" in v and "t_end" in v]
        done = next((v for v in lines if v.get("done")), None)
        if not steps or done is None:
            raise SystemExit(f"{config} rank {r}: no steps or no done line; see {out}")
        wall = steps[-1]["t_end"] - steps[0]["t_start"]
        step_s = sorted(v["step_s"] for v in steps)
        sites.append({"steps": len(steps), "steps_per_s": len(steps) / wall,
                      "eval_loss": done.get("final_eval_loss"),
                      "median_step_s": round(step_s[len(step_s) // 2], 4),
                      "in_steps_s": round(sum(step_s), 2),
                      "outer_waited_s": round(sum(o[4] for v in steps
                                                  for o in v.get("outer") or []), 2)})
    return sites


def site_args(description: str | None) -> argparse.ArgumentParser:
    """The options both unequal-sites benchmarks take: how long, how often, how slow."""
    ap = argparse.ArgumentParser(description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=45.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--slow-share", type=float, default=0.33,
                    help="the slow site's share of a core (a cgroup CPU quota)")
    return ap


def main() -> None:
    ap = site_args(__doc__)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="alone first: the ceiling")
    ap.add_argument("--keep", type=Path, help="keep each run's rank outputs under this directory")
    a = ap.parse_args()
    slow = SlowGroup(a.slow_share)
    try:
        for repeat in range(a.repeats):
            ceiling: list[float] = []
            for config in a.configs.split(","):
                with tempfile.TemporaryDirectory() as tmp:
                    out = Path(tmp)
                    if a.keep is not None:
                        out = a.keep / f"{config}-{repeat}"
                        out.mkdir(parents=True, exist_ok=True)
                    procs = launch(config, a.seconds, out, slow)
                    for r, p in enumerate(procs):
                        if (code := p.wait(timeout=a.seconds + 300)) != 0:
                            err = (out / f"{config}-{r}.err").read_text() + "".join(
                                x for x in (out / f"{config}-{r}.out").open() if "failed" in x)
                            raise SystemExit(f"{config}: rank {r} exited {code}:\n{err[-3000:]}")
                    sites = result(config, out)
                if config == "alone":
                    ceiling = [s["steps_per_s"] for s in sites]
                for s, c in zip(sites, ceiling):
                    s["share_of_ceiling"] = round(s["steps_per_s"] / c, 3)
                    s["steps_per_s"] = round(s["steps_per_s"], 3)
                print(json.dumps({"config": config, "repeat": repeat, "hk_slow": sites[0],
                                  "us_fast": sites[1]}), flush=True)
    finally:
        slow.remove()


if __name__ == "__main__":
    main()
