"""Eval loss of the checkpoints a training run saved, and the eval's own noise.

    python python/benchmarks/eval_checkpoints.py --dir D [--windows 64] [--noise-sets 8]

``train_lm.py --checkpoint-every-s S --checkpoint-dir D`` leaves ``D/step-<steps>.pt``: the
parameters after that many steps, the step's ``t_end`` and the model's sizing. This evaluates
each on the same ``--windows`` held-out windows as ``train_lm.py`` would in-run, off the run's
clock, and prints one JSON line per checkpoint in step order::

    {"steps", "t_end", "eval_loss"}

then one line on the noise of a single evaluation: the last checkpoint's parameters evaluated on
``--noise-sets`` disjoint sets of ``--windows`` held-out windows each::

    {"eval_noise": {"steps", "windows", "sets", "losses", "stdev", "range"}}

The stdev is how far one evaluation of fixed parameters can move with the windows it happens to
use; the benchmark weighs the differences it claims against it. With ``--delete`` each checkpoint
is removed once evaluated (a day's run leaves ~60 of 13 MB).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

if not __package__:  # run as a script: python/ holds the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.lm_data import Corpus, eval_offsets, load_corpus, windows
from benchmarks.lm_model import CharLM, eval_loss


def noise_offsets(corpus: Corpus, windows_per_set: int, sets: int, seq: int) -> list[torch.Tensor]:
    """``sets`` disjoint sets of held-out windows, interleaved over the held-out text."""
    every = eval_offsets(corpus, windows_per_set * sets, seq)
    if len(every) > 1 and int((every[1:] - every[:-1]).min()) < seq + 1:
        raise SystemExit(f"the held-out text has room for fewer than {windows_per_set * sets} "
                         "windows that do not overlap: lower --windows or --noise-sets")
    return [every[k::sets] for k in range(sets)]


def load(path: Path) -> dict[str, Any]:
    record: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return record


def model_for(record: dict[str, Any]) -> CharLM:
    m = record["model"]
    net = CharLM(m["width"], m["depth"], m["heads"], m["seq"])
    net.load_state_dict(record["state"])
    net.eval()
    return net


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="the run's --checkpoint-dir")
    ap.add_argument("--windows", type=int, default=64, help="held-out windows per evaluation")
    ap.add_argument("--noise-sets", type=int, default=8,
                    help="disjoint window sets the last checkpoint is evaluated on (0: none)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--delete", action="store_true", help="remove each checkpoint once evaluated")
    args = ap.parse_args(argv)
    if args.windows < 1 or args.noise_sets < 0 or args.noise_sets == 1:
        ap.error("--windows must be at least 1 and --noise-sets 0 or at least 2")
    torch.set_num_threads(args.threads)
    paths = sorted(Path(args.dir).glob("step-*.pt"))
    if not paths:
        raise SystemExit(f"{args.dir}: no step-*.pt checkpoints")
    first = load(paths[0])
    m = first["model"]
    corpus = load_corpus(m["data_mib"])
    ex, ey = windows(corpus, eval_offsets(corpus, args.windows, m["seq"]), m["seq"])
    last: dict[str, Any] = first
    for path in paths:
        record = first if path == paths[0] else load(path)
        loss = eval_loss(model_for(record), ex, ey)
        print(json.dumps({"steps": record["steps"], "t_end": record["t_end"], "eval_loss": loss}),
              flush=True)
        last = record
        if args.delete and path != paths[-1]:
            path.unlink()
    if args.noise_sets:
        net = model_for(last)
        losses = []
        for offsets in noise_offsets(corpus, args.windows, args.noise_sets, m["seq"]):
            x, y = windows(corpus, offsets, m["seq"])
            losses.append(eval_loss(net, x, y))
        print(json.dumps({"eval_noise": {
            "steps": last["steps"], "windows": args.windows, "sets": args.noise_sets,
            "losses": losses, "stdev": statistics.stdev(losses),
            "range": max(losses) - min(losses)}}), flush=True)
    if args.delete:
        paths[-1].unlink()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
