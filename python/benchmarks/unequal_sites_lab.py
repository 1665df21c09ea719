"""Unequal, unequally fast sites across the WAN lab: time to a ladder of target losses.

Hong Kong has one rank, held to ``--slow-share`` of one CPU by a cgroup CPU quota (as an A100
beside H100s; see ``unequal_sites.SlowGroup``); the US has two ranks at full speed, DDP inside
the site. ``linkpilot-lab run --hosts 2`` joins them (``--scenario``, default the calm 180 ms,
200 Mbit/s day): rank 0 on hk0, ranks 1 and 2 on us0 and us1. Configurations, interleaved repeat
by repeat, each ``--seconds`` of wall time:

- ``alone``: Hong Kong's rank by itself and the US's two by themselves (each site's ceiling in
  steps per second);
- ``ddp-colocated``: per-step DDP of the three ranks on one host (loopback), Hong Kong's rank as
  slow: the job a single data center with mixed GPUs would run;
- ``outer-time-colocated``: paced OuterSync of the same sites on loopback: the same plan without
  the WAN, the ceiling the lab runs are held to;
- ``outer-steps``: OuterSync across the lab with H steps a round at both sites (plan (a): the
  fixed-H plan that waits for the slow site);
- ``outer-time``: paced OuterSync across the lab (``pace="time"``).

Rank 0 (Hong Kong; for ``alone``, each job's first rank) saves its parameters every
``--checkpoint-s`` (its replica: the agreed outer values plus its own steps since), evaluated
after the run on 64 held-out windows. The ladder: the loss ``outer-time-colocated`` reaches at
25, 50 and 75% of its run (median over the repeats). Prints one JSON line per run, then one
summary line per configuration: time to each rung and the loss at the end, median [min-max],
and each site's share of its ceiling.

    sudo .venv/bin/python python/benchmarks/unequal_sites_lab.py [--seconds 45] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: python/ holds the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.unequal_sites import MODEL, SlowGroup, free_port, site_args

HERE = Path(__file__).resolve().parent
TRAIN, EVAL = HERE / "train_lm.py", HERE / "eval_checkpoints.py"
CONFIGS = ["alone", "ddp-colocated", "outer-time-colocated", "outer-steps", "outer-time"]
CEILING = "outer-time-colocated"
RANKS = {"hk": 1, "us": 2}
RUNGS = (0.25, 0.5, 0.75)
#: The round: H steps of the fastest site, 2 fragments, each applied 15 steps after its send
#: (about 0.6 s at the US's pace here, which an exchange over 180 ms needs: headers, then the
#: payload, each a round trip of the gloo ring).
OUTER = ["--hook", "outer", "--sites", "0/1,2", "--outer-every", "60", "--fragments", "2",
         "--overlap", "15", "--own-clock"]


class Lab:
    """``linkpilot-lab run``: its hosts' namespaces and addresses from the lines it prints."""

    def __init__(self, binary: str, scenario: str) -> None:
        self.proc = subprocess.Popen([binary, "run", "--scenario", scenario, "--name", "ulab",
                                      "--hosts", "2"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.hosts: dict[str, tuple[str, str]] = {}
        assert self.proc.stderr is not None
        for line in self.proc.stderr:  # its hosts, one line each, once they are up
            m = re.match(r"host \w+ netns (\S+) eth0 (\S+)", line)
            if m:
                self.hosts[m.group(1).rsplit("-", 1)[1]] = (m.group(1), m.group(2))
            if len(self.hosts) == 4:
                break
        if len(self.hosts) != 4:
            raise SystemExit(f"{binary} run did not come up: {self.hosts}")
        # Keep its log flowing (a full pipe would stall it).
        self.drain = subprocess.Popen(["cat"], stdin=self.proc.stderr, stdout=subprocess.DEVNULL)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.drain.wait(timeout=5)


def jobs(config: str, seconds: float, lab: Lab, out: Path) -> list[list[list[str]]]:
    """Each job of ``config`` as its ranks' command lines (with ``ip netns exec`` in the lab)."""
    common = [sys.executable, str(TRAIN), *MODEL, "--timeout-s", "120", "--all-ranks-report",
              "--checkpoint-every-s", str(ARGS.checkpoint_s)]

    def job(hosts: list[str] | None, extra: list[str], tag: str) -> list[list[str]]:
        world = len(hosts) if hosts else 3
        # A fresh port each job: the last job's store may still hold its own.
        port = ARGS.port = ARGS.port + 1
        master = f"{lab.hosts[hosts[0]][1] if hosts else '127.0.0.1'}:{port}"
        ranks = []
        for r in range(world):
            ns = ["ip", "netns", "exec", lab.hosts[hosts[r]][0]] if hosts else []
            ranks.append([*ns, *common, "--rank", str(r), "--world", str(world), "--master",
                          master, "--iface", "eth0" if hosts else "lo", "--checkpoint-dir",
                          str(out / f"ckpt-{tag}"), *extra])
        return ranks

    clock = ["--duration", str(seconds)]
    if config == "alone":
        return [job(["hk0"], [*clock, "--hook", "none"], "hk"),
                job(["us0", "us1"], [*clock, "--hook", "none"], "us")]
    if config == "ddp-colocated":
        return [job(None, [*clock, "--hook", "none"], "hk")]
    pace = ["--pace", "time" if config.startswith("outer-time") else "steps"]
    lab_hosts = None if config.endswith("colocated") else ["hk0", "us0", "us1"]
    return [job(lab_hosts, [*clock, *OUTER, *pace], "hk")]


def run(config: str, repeat: int, lab: Lab, slow: SlowGroup) -> dict[str, Any]:
    out = ARGS.out / f"{config}-{repeat}"
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
               LINKPILOT_JOBS=str(out / "no-jobs"))
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []
    for j, ranks in enumerate(jobs(config, ARGS.seconds, lab, out)):
        for r, cmd in enumerate(ranks):
            name = f"j{j}r{r}"
            with open(out / f"{name}.out", "wb") as o, open(out / f"{name}.err", "wb") as e:
                procs.append((name, subprocess.Popen(cmd, stdout=o, stderr=e, env=env)))
            if j == 0 and r == 0:  # Hong Kong's rank (in alone, its job of one)
                slow.add(procs[-1][1].pid)
    for name, p in procs:
        if (code := p.wait(timeout=ARGS.seconds + 300)) != 0:
            for _, q in procs:
                q.kill()
            raise SystemExit(f"{config}: {name} exited {code}; see {out}")
    sites = {"hk": steps_of(out / "j0r0.out"),
             "us": steps_of(out / ("j1r0.out" if config == "alone" else "j0r1.out"))}
    curves = {tag: curve(out / f"ckpt-{tag}", sites[tag]["t0"]) for tag in
              (["hk", "us"] if config == "alone" else ["hk"])}
    return {"config": config, "repeat": repeat, "sites": sites, "curves": curves}


def steps_of(path: Path) -> dict[str, Any]:
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.startswith("{")]
    steps = [v for v in lines if "step" in v and "t_end" in v]
    done = next(v for v in lines if v.get("done"))
    wall = steps[-1]["t_end"] - steps[0]["t_start"]
    return {"steps": len(steps), "steps_per_s": len(steps) / wall, "t0": steps[0]["t_start"],
            "final_eval_loss": done["final_eval_loss"], "digest": done["digest"],
            "outer_waited_s": round(sum(o[4] for v in steps for o in v.get("outer") or []), 2)}


def curve(ckpt: Path, t0: float) -> list[tuple[float, float]]:
    """(seconds since the first step, eval loss) of each checkpoint, in order."""
    out = subprocess.run([sys.executable, str(EVAL), "--dir", str(ckpt), "--windows", "64",
                          "--noise-sets", "2", "--threads", "2", "--delete"],
                         capture_output=True, text=True, check=True).stdout
    points = [json.loads(x) for x in out.splitlines()]
    return [(round(p["t_end"] - t0, 2), round(p["eval_loss"], 4)) for p in points
            if "eval_loss" in p]


def first_below(points: list[tuple[float, float]], target: float) -> float | None:
    return next((t for t, loss in points if loss <= target), None)


def loss_at(points: list[tuple[float, float]], t: float) -> float:
    return min((loss for s, loss in points if s <= t), default=points[0][1])


def spread(values: list[float | None]) -> str:
    if any(v is None for v in values):
        reached = sorted(v for v in values if v is not None)
        return f"{len(reached)} of {len(values)} reached" + (
            f" ({', '.join(f'{v:.1f}' for v in reached)})" if reached else "")
    v = sorted(float(x) for x in values if x is not None)
    return f"{statistics.median(v):.3f} [{v[0]:.3f}-{v[-1]:.3f}]"


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The targets, then a line per configuration."""
    ceiling_runs = [r for r in runs if r["config"] == CEILING]
    targets = [statistics.median(loss_at(r["curves"]["hk"], f * ARGS.seconds)
                                 for r in ceiling_runs) for f in RUNGS]
    lines: list[dict[str, Any]] = [{"targets": dict(zip(
        [f"{int(f * 100)}%" for f in RUNGS], [round(t, 4) for t in targets]))}]
    alone = {r["repeat"]: r["sites"] for r in runs if r["config"] == "alone"}
    for config in CONFIGS:
        rs = [r for r in runs if r["config"] == config]
        line: dict[str, Any] = {"config": config, "runs": len(rs)}
        for tag in rs[0]["curves"]:
            line[f"{tag} time to target (s)"] = {
                f"{int(f * 100)}%": spread([first_below(r["curves"][tag], t) for r in rs])
                for f, t in zip(RUNGS, targets)}
            line[f"{tag} final eval loss"] = spread([r["sites"][tag]["final_eval_loss"]
                                                    for r in rs])
        for tag in ("hk", "us"):
            line[f"{tag} share of ceiling"] = spread([
                r["sites"][tag]["steps_per_s"] / alone[r["repeat"]][tag]["steps_per_s"]
                for r in rs])
        # Per rank (the US's steps are two ranks' each): the compute of all three used.
        line["compute used"] = spread([
            sum(n * r["sites"][t]["steps_per_s"] for t, n in RANKS.items())
            / sum(n * alone[r["repeat"]][t]["steps_per_s"] for t, n in RANKS.items())
            for r in rs])
        lines.append(line)
    return lines


def main() -> None:
    global ARGS
    ap = site_args(__doc__)
    ap.add_argument("--checkpoint-s", type=float, default=2.0)
    ap.add_argument("--scenario", default="steady-180ms")
    ap.add_argument("--lab-bin", default=str(HERE.parents[1] / "target/debug/linkpilot-lab"))
    ap.add_argument("--out", type=Path, default=HERE.parents[1] / "target/unequal-sites-lab")
    ap.add_argument("--report-only", action="store_true",
                    help="summarize the runs.json already in --out")
    ARGS = ap.parse_args()
    ARGS.port = free_port()
    if ARGS.report_only:
        return report(json.loads((ARGS.out / "runs.json").read_text()))
    if os.geteuid() != 0:
        raise SystemExit("the lab's namespaces and the cgroup need root")
    slow, lab = SlowGroup(ARGS.slow_share), Lab(ARGS.lab_bin, ARGS.scenario)
    runs: list[dict[str, Any]] = []
    try:
        for repeat in range(ARGS.repeats):
            for config in CONFIGS:
                runs.append(run(config, repeat, lab, slow))
                print(json.dumps(runs[-1]), flush=True)
                time.sleep(2)  # the previous job's ports and threads gone
    finally:
        lab.stop()
        slow.remove()
    (ARGS.out / "runs.json").write_text(json.dumps(runs))
    report(runs)


def report(runs: list[dict[str, Any]]) -> None:
    """Prints the summary and writes it, with the runs, to results.json in --out."""
    summary = summarize(runs)
    for line in summary:
        print(json.dumps(line), flush=True)
    (ARGS.out / "results.json").write_text(json.dumps({"runs": runs, "summary": summary},
                                                      indent=1))


ARGS: argparse.Namespace
if __name__ == "__main__":
    main()
