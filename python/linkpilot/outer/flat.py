"""The parameters as one flat vector: the outer state is a range of it, read into host fp32
tensors and written back in place, parameter by parameter, without a flat copy of the model.
Separate from the rounds: it is how values move between the model and the outer state."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from linkpilot.outer.topology import local


class FlatParams:
    """``params`` (this rank's part of each: its shard of a sharded one) as one flat vector, of
    which this rank's outer state is [``base``, ``base + length``)."""

    def __init__(self, params: Sequence[torch.Tensor], base: int, length: int) -> None:
        self.params, self.base, self.length = list(params), base, length

    def flatten(self) -> torch.Tensor:
        """This rank's outer state's part of its parameters, as one fresh fp32 host tensor."""
        return self.read(0, self.length)

    def read(self, lo: int, hi: int) -> torch.Tensor:
        """[lo, hi) of this rank's outer state, read from its parameters."""
        return self.read_flat(self.base + lo, self.base + hi)

    def write(self, lo: int, hi: int, values: torch.Tensor) -> None:
        """``values`` into [lo, hi) of this rank's outer state's parameters."""
        self.write_flat(self.base + lo, self.base + hi, values)

    def read_flat(self, lo: int, hi: int) -> torch.Tensor:
        """[lo, hi) of the flat local parameters, whatever this rank's outer state."""
        parts, at = [], 0
        for p in self.params:
            part = local(p).detach()
            n = part.numel()
            a, b = max(lo, at), min(hi, at + n)
            if a < b:
                parts.append(part.reshape(-1)[a - at:b - at].to("cpu", torch.float32))
            at += n
        return torch.cat(parts)

    def write_flat(self, lo: int, hi: int, values: torch.Tensor) -> None:
        at = 0
        with torch.no_grad():
            for p in self.params:
                part = local(p)
                n = part.numel()
                a, b = max(lo, at), min(hi, at + n)
                if a < b:
                    part.view(-1)[a - at:b - at].copy_(values[a - lo:b - lo])
                at += n

    def replicate(self, spread: bool, host: dist.ProcessGroup, first: int,
                  replicas: dist.ProcessGroup) -> torch.Tensor:
        """Makes every replica start from the same parameters and returns this rank's outer
        state, a fresh copy of them: whole parameters everywhere (``spread``) are rank 0's,
        one tensor at a time; else each shard is its first holder's."""
        if spread:
            with torch.no_grad():
                for p in self.params:
                    t = p.detach().to("cpu")  # p itself when on the host
                    dist.broadcast(t, src=0, group=host)
                    if t.data_ptr() != p.data_ptr():
                        p.copy_(t)
            return self.flatten()
        flat = self.flatten()
        dist.broadcast(flat, src=first, group=replicas)
        self.write(0, flat.numel(), flat)
        return flat
