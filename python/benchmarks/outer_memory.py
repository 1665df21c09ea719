"""What OuterSync's outer state costs each rank, with whole parameters (DDP inside a site: the
outer state sharded across the site's ranks, "ddp", or whole at its first rank, "ddp-whole")
and with parameters sharded inside a site (FSDP2's fully_shard, "fsdp"): peak resident memory per rank
(VmRSS, and the peak VmHWM) before OuterSync exists and after it ran rounds, for a model of ``--params`` million parameters.
"ddp-alone" and "fsdp-alone" are the controls: the same steps without OuterSync (FSDP's own
peak grows after its first step, by about a full copy of the parameters).

Two sites of ``--per-site`` ranks on loopback (gloo). Each rank builds the model and its AdamW
state (one step), reads its memory, makes OuterSync, trains ``--rounds`` rounds of H steps
(fragments of int8 pseudo-gradients), and reads its memory again before close(): the
difference is what OuterSync added (its outer copy and momentum, and what its exchanges hold).
The outer state itself is ``2 x`` the parameters a rank keeps, fp32: its shard (``held_params``),
or the whole model at a "ddp-whole" site's first rank.

Prints one JSON line per rank and mode: {"mode", "rank", "params", "held_params",
"rss_before_mib", "rss_after_mib", "added_mib", "built_added_mib" (right after OuterSync was
made), "trimmed_added_mib" (after, once glibc's malloc_trim returned what it kept of freed
buffers), "peak_before_mib", "peak_after_mib", "outer_state_mib", "exchange_s"}; then, after close() (no
exchange in flight) and a trim, {"mode", "rank", "closed_added_mib", "outer_state_mib"}: what
the rank keeps, the outer state itself.

    python python/benchmarks/outer_memory.py [--params 100] [--per-site 2]
        [--modes ddp-whole,ddp,fsdp,ddp-alone,fsdp-alone]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import socket
import subprocess
import sys
import time

MIB = 1 << 20


def rss_mib() -> tuple[float, float]:
    """This process's resident memory now and at its peak (VmRSS, VmHWM), MiB."""
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return (int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024)


def rank_main(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    from linkpilot.outer import OuterSync, RoundPlan

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}", rank=a.rank,
                            world_size=a.world)
    sites = [list(range(s * a.per_site, (s + 1) * a.per_site)) for s in range(2)]
    groups = [dist.new_group(s) for s in sites]
    site = a.rank // a.per_site
    width = 4096
    layers = max(1, round(a.params * 1e6 / (width * width + width)))
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    alone = a.mode.endswith("-alone")
    if a.mode.startswith("fsdp"):
        fully_shard(net, mesh=DeviceMesh.from_group(groups[site], "cpu", mesh=sites[site]))
        model: nn.Module = net
    else:
        model = nn.parallel.DistributedDataParallel(net, process_group=groups[site])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        x = torch.randn(4, width)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # AdamW's state exists from here
    dist.barrier()
    before, peak_before = rss_mib()
    sync = None if alone else OuterSync(
        net, RoundPlan(4, 2, 1, "int8"), sites=sites, deadline_s=120.0, patience_s=120.0,
        shard_state=a.mode != "ddp-whole")
    built, _ = rss_mib()
    took: list[float] = []
    for _ in range(4 * a.rounds):
        step()
        if sync is not None:
            sync.step()
            took += [s.exchange_s for s in sync.history if s.outcome == "applied"][len(took):]
    after, peak_after = rss_mib()
    # What of that the allocator only kept (freed exchange buffers glibc had not returned).
    ctypes.CDLL(None).malloc_trim(0)
    trimmed, _ = rss_mib()
    held = sync.outer.numel() if sync is not None else 0
    print(json.dumps({
        "mode": a.mode, "rank": a.rank, "params": sum(p.numel() for p in net.parameters()),
        "held_params": held, "rss_before_mib": round(before), "rss_after_mib": round(after),
        "added_mib": round(after - before), "built_added_mib": round(built - before),
        "trimmed_added_mib": round(trimmed - before), "peak_before_mib": round(peak_before),
        "peak_after_mib": round(peak_after), "outer_state_mib": round(6 * held / MIB),
        "exchange_s": round(sorted(took)[len(took) // 2], 3) if took else None}), flush=True)
    if sync is not None:
        sync.close()
    dist.barrier()
    # What the rank keeps once no exchange is in flight: the outer state (and what the
    # allocator holds back even after a trim).
    ctypes.CDLL(None).malloc_trim(0)
    closed, _ = rss_mib()
    print(json.dumps({"mode": a.mode, "rank": a.rank, "closed_added_mib": round(closed - before),
                      "outer_state_mib": round(6 * held / MIB)}), flush=True)
    sys.stdout.flush()
    os._exit(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=float, default=100.0, help="millions")
    ap.add_argument("--per-site", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--modes", default="ddp-whole,ddp,fsdp")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank is not None:
        rank_main(a)
        return
    world = 2 * a.per_site
    for mode in a.modes.split(","):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            master = f"127.0.0.1:{s.getsockname()[1]}"
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        procs = [subprocess.Popen(
            [sys.executable, __file__, "--rank", str(r), "--world", str(world), "--master",
             master, "--mode", mode, "--per-site", str(a.per_site), "--params", str(a.params),
             "--rounds", str(a.rounds)], env=env, stdout=subprocess.PIPE, text=True)
            for r in range(world)]
        started = time.monotonic()
        for p in procs:
            out, _ = p.communicate(timeout=1800)
            if p.returncode != 0:
                raise SystemExit(f"{mode}: a rank failed ({p.returncode})")
            sys.stdout.write(out)
        print(json.dumps({"mode": mode, "wall_s": round(time.monotonic() - started, 1)}),
              flush=True)


if __name__ == "__main__":
    main()
