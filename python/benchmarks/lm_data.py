"""The training benchmark's data (see ``train_lm.py``): the standard library's own source as
raw bytes, its held-out tail, and the data order: each step's global batch of windows, the
same for any split over ranks, and the fixed eval windows. Separate from the model and the run:
``eval_checkpoints.py`` and the tests read the same data."""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

EVAL_FRACTION = 0.05


@dataclass(frozen=True)
class Corpus:
    data: torch.Tensor  # uint8, the whole text
    n_train: int  # data[:n_train] trains, data[n_train:] is held out
    files: int
    sha256: str


def load_corpus(mib: float, root: str | None = None) -> Corpus:
    """The first ``mib`` MiB of the standard library's *.py files, sorted by relative path."""
    base = root or sysconfig.get_paths()["stdlib"]
    paths = []
    for here, dirs, names in os.walk(base):
        rel = os.path.relpath(here, base)
        # Not into installed packages (the data must not depend on them), nor caches.
        dirs[:] = [d for d in dirs if d != "__pycache__"
                   and not (rel == "." and d in ("site-packages", "dist-packages"))]
        paths += [Path(rel, n).as_posix() for n in names if n.endswith(".py")]
    paths.sort()
    want = int(mib * (1 << 20))
    chunks, have, files = [], 0, 0
    for rel in paths:
        if have >= want:
            break
        blob = Path(base, rel).read_bytes()
        chunks.append(blob)
        have += len(blob)
        files += 1
    text = b"".join(chunks)[:want]
    if len(text) < want:
        raise SystemExit(f"--data-mib {mib}: the standard library has only {len(text)} bytes")
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    return Corpus(data, int(len(text) * (1 - EVAL_FRACTION)), files,
                  hashlib.sha256(text).hexdigest())


def batch_offsets(corpus: Corpus, seed: int, step: int, rank: int, world: int, batch: int,
                  seq: int) -> torch.Tensor:
    """This rank's window offsets of a step: its slice of the step's global batch."""
    # torch's CPU generator keeps 32 bits of its seed: mix (seed, step) into 32 bits.
    mixed = hashlib.sha256(f"{seed}/{step}".encode()).digest()[:4]
    gen = torch.Generator().manual_seed(int.from_bytes(mixed, "little"))
    every = torch.randint(0, corpus.n_train - seq, (batch * world,), generator=gen)
    return every[rank * batch:(rank + 1) * batch]


def eval_offsets(corpus: Corpus, windows: int, seq: int) -> torch.Tensor:
    """Fixed windows, evenly spaced over the held-out text."""
    span = len(corpus.data) - corpus.n_train - (seq + 1)
    if span < 0:
        raise SystemExit("held-out text shorter than one window: raise --data-mib")
    return torch.tensor([corpus.n_train + i * span // max(1, windows - 1)
                         for i in range(windows)])


def windows(corpus: Corpus, offsets: torch.Tensor, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-byte targets, both (len(offsets), seq) int64."""
    idx = offsets[:, None] + torch.arange(seq + 1)
    tokens = corpus.data[idx].long()
    return tokens[:, :-1], tokens[:, 1:]
