"""The training benchmark's model (see ``train_lm.py``): a GPT-style byte-level decoder, its
loss, its eval and the compute time of one step without communication. Separate from the run:
``eval_checkpoints.py`` evaluates the same model from checkpoints."""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(
            2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class CharLM(nn.Module):
    def __init__(self, width: int, depth: int, heads: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(256, width)
        self.pos = nn.Parameter(torch.zeros(seq, width))
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(depth)))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, 256)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos[: x.shape[1]]
        logits: torch.Tensor = self.head(self.ln(self.blocks(h)))
        return logits


def lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def eval_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float(lm_loss(model, x, y))


def compute_baseline(model: nn.Module, x: torch.Tensor, y: torch.Tensor, reps: int = 3) -> float:
    """Median seconds of a forward+backward with no communication (the bare module, before DDP
    wraps it), after one warm-up; the gradients are dropped."""
    times = []
    for i in range(reps + 1):
        started = time.perf_counter()
        lm_loss(model, x, y).backward()  # type: ignore[no-untyped-call]
        if i:
            times.append(time.perf_counter() - started)
        model.zero_grad(set_to_none=True)
    return statistics.median(times)
