"""What a rank of the training benchmark (``train_lm.py``) keeps beside its training loop: when
to stop (the stop file, a site's own clock), rank 0's checkpoints written in the background,
and its JSON lines. Separate from the loop, which only calls them."""

from __future__ import annotations

import json
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist
from torch import nn

from linkpilot.outer import OuterSync


def stop_step(path: str) -> int | None:
    """The step number the stop file holds, or None while it holds none (absent, or not yet a
    whole number: the writer renames a finished file into place, but an empty one is harmless)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def out_of_time(mine: bool, sync: OuterSync | None) -> bool:
    """``--own-clock``: whether this site stops now; the ranks of a site of several agree (any
    one's clock run out), so that they stop at the same step."""
    group = sync.site_group if sync is not None else None
    if group is None:
        return mine
    flag = torch.tensor([float(mine)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return bool(flag.item())


class Checkpoints:
    """Rank 0's parameter snapshots: copied on the training thread (a memcpy), written by one
    background thread to ``step-<steps>.pt`` under a temporary name first, so a reader never
    sees a partial file."""

    def __init__(self, directory: str, model: dict[str, Any]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.model = model
        self.writer = ThreadPoolExecutor(max_workers=1)
        self.pending: list[Future[None]] = []

    def save(self, net: nn.Module, steps: int, t_end: float) -> None:
        state = {k: v.detach().clone() for k, v in net.state_dict().items()}
        record = {"steps": steps, "t_end": t_end, "model": self.model, "state": state}
        self.pending.append(
            self.writer.submit(self._write, record, self.dir / f"step-{steps:06d}.pt"))

    @staticmethod
    def _write(record: dict[str, Any], path: Path) -> None:
        partial = path.with_suffix(".partial")
        torch.save(record, partial)
        partial.rename(path)

    def close(self) -> None:
        """Waits for every write; a failed one (a full disk) raises here."""
        self.writer.shutdown(wait=True)
        for f in self.pending:
            f.result()


class Reporter:
    def __init__(self, out: TextIO, rank: int, all_ranks: bool) -> None:
        self.out, self.rank, self.on = out, rank, all_ranks or rank == 0
        self.step = -1  # the step in progress (-1: setting up), for the failure line

    def line(self, record: dict[str, Any], always: bool = False) -> None:
        if self.on or always:
            self.out.write(json.dumps({**record, "rank": self.rank}) + "\n")
            self.out.flush()
