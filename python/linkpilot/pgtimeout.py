"""A process group's collective timeout, read and changed across torch releases.

``torch.distributed.set_timeout`` became public in 2026 (pytorch/pytorch#187387); before it
the same change was the private ``distributed_c10d._set_pg_timeout`` (pytorch/pytorch#115453,
December 2023), which is why linkpilot asks for torch 2.3, the first release after it. A bare
backend (the synchronizer's own ProcessGroupGloo) is set through ``set_timeout`` where it has
one and ``_set_default_timeout`` (what the private function calls) otherwise.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["group_timeout", "set_backend_timeout", "set_group_timeout"]


def member(group: object) -> dist.ProcessGroup:
    """A group this rank belongs to (torch types the others as None or a sentinel)."""
    if not isinstance(group, dist.ProcessGroup):
        raise ValueError(f"this rank is not in the process group ({group!r})")
    return group


def group_timeout(group: dist.ProcessGroup | None = None) -> datetime.timedelta:
    """The timeout torch applies to the group's collectives: its backend's option, the CPU
    backend's where it has one (gloo, "cpu:gloo,cuda:nccl"), else its first device's (an
    NCCL-only group has no CPU backend)."""
    group = member(group if group is not None else dist.group.WORLD)
    types = [d.type for d in getattr(group, "_device_types", [])] or ["cpu"]
    device = "cpu" if "cpu" in types else types[0]
    backend = group._get_backend(torch.device(device))
    timeout: datetime.timedelta = backend.options._timeout
    return timeout


def set_group_timeout(timeout: datetime.timedelta, group: dist.ProcessGroup) -> None:
    """Sets the timeout of the group's collectives from the next one issued."""
    public = getattr(dist, "set_timeout", None)
    if public is not None:
        public(timeout, group)
        return
    from torch.distributed import distributed_c10d

    private = getattr(distributed_c10d, "_set_pg_timeout", None)
    if private is None:
        raise RuntimeError(f"torch {torch.__version__} cannot change a process group's timeout "
                           "(linkpilot needs torch 2.3 or later)")
    private(timeout, group)


def set_backend_timeout(backend: Any, timeout: datetime.timedelta) -> None:
    """Sets a bare backend's (ProcessGroupGloo's) collective timeout."""
    setter = getattr(backend, "set_timeout", None) or backend._set_default_timeout
    setter(timeout)
