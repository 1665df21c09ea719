"""Group timeouts through the public call and through the private one older torch has, on a
real one-rank gloo group in a process of its own, its timeout read back from the backend; and
on a group shaped as NCCL-only ones are (no CPU backend: gloo registered for "cuda" alone),
where the hook must still start."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import datetime, sys
import torch.distributed as dist
from torch._C._distributed_c10d import HashStore, ProcessGroupGloo
from linkpilot.pgtimeout import group_timeout, set_backend_timeout, set_group_timeout

dist.init_process_group("gloo", init_method=sys.argv[1], rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=60))
if sys.argv[2] == "private":
    del dist.set_timeout  # as on torch before the public call
set_group_timeout(datetime.timedelta(seconds=1234), dist.group.WORLD)
print(group_timeout().total_seconds())
pg = ProcessGroupGloo(HashStore(), 0, 1, datetime.timedelta(seconds=5))
set_backend_timeout(pg, datetime.timedelta(seconds=77))
print(pg.options._timeout.total_seconds())
"""


def test_the_timeout_changes_through_either_call(tmp_path: object) -> None:
    for how in ("public", "private"):
        store = f"file://{tmp_path}/store-{how}"
        out = subprocess.run([sys.executable, "-c", SCRIPT, store, how], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["1234.0", "77.0"], (how, out.stdout, out.stderr)


NCCL_SHAPED = r"""
import datetime, sys
import torch.distributed as dist
from linkpilot.ddp import LinkpilotHook
from linkpilot.pgtimeout import group_timeout

dist.init_process_group("cuda:gloo", init_method=sys.argv[1], rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=60))
assert [d.type for d in dist.group.WORLD._device_types] == ["cuda"]
hook = LinkpilotHook(sys.argv[2], tuner=None, job_report=None)
print(group_timeout().total_seconds(), hook.timeout.total_seconds())
hook._raise_timeout(900)
print(group_timeout().total_seconds())
"""


def test_a_group_without_a_cpu_backend_has_its_timeout_read_and_raised(tmp_path: object) -> None:
    out = subprocess.run([sys.executable, "-c", NCCL_SHAPED, f"file://{tmp_path}/store",
                          f"{tmp_path}/no-board"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["60.0", "60.0", "900.0"], (out.stdout, out.stderr)
