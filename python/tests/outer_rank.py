"""One rank of test_outer.py: a small MLP trained on this site's own data (AdamW inner steps)
with OuterSync across sites, over gloo on loopback. Prints one JSON line per step: the step,
each exchange recorded in it (outcome, fragment, the digest of the fragment's values right after
an applied outer step) and, at the end, the digest of every parameter.

    python outer_rank.py --rank R --world W --port P --steps N --plan H,F,OVERLAP,CODEC
        [--sites 0,1/2,3] [--sleep S] [--deadline S] [--patience S] [--max-drift N] [--board PATH]
        [--master HOST:PORT] [--width N] [--pause-at STEP,STEP --pause-s S] [--cuda-only]
        [--pace steps|time] [--samples N] [--rounds R] [--drift C] [--fsdp N] [--whole-state]
        [--spread-chunk N]

With --board, the rounds' plans follow that knob board (linkpilot.outer.board.BoardPlan), as
the site's daemon decides them. --pause-at makes the rank print {"idle": STEP} after those
steps and sleep --pause-s, so that a test can read a link's counters while nothing crosses.
With --cuda-only the job's process group refuses CPU tensors as an NCCL-only one does (a backend
that serves the "cuda" device type only); DDP inside a site then runs on a gloo group of the
script's own, as a GPU job's DDP would run on NCCL. --rounds R stops once the site sent R rounds
(in place of --steps, which then only bounds the run). With --drift C the model is one vector
whose inner step subtracts C * (site + 1) from it (no data, no optimizer), so that a test can
compute the outer steps itself; applied exchanges then also carry the fragment's first value.
With --fsdp N the model is sharded with FSDP2's fully_shard inside each site over groups of N
ranks (HSDP where the site has more: its N-rank groups replicate each other), and the done line
carries the digest of the whole parameters as well. --whole-state keeps a DDP site's outer state
whole at its first rank (OuterSync's shard_state=False). The done line's "digest" is of this
rank's parameters (its shards' under FSDP), "outer" of its outer state (its shard's).
--spread-chunk N spreads a DDP site's shard outer steps N values per broadcast, so that a small
model's fragment takes several.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch._C._distributed_c10d import ProcessGroupGloo
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from linkpilot.board import KnobBoard
from linkpilot.outer import site as outer_site
from linkpilot.outer import OuterSync, RoundPlan, RoundStats
from linkpilot.outer.board import BoardPlan
from linkpilot.pgtimeout import member


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]


def cuda_only_backend() -> str:
    """Registers a backend for the "cuda" device type only (gloo doing the work): a collective
    on a CPU tensor fails on it as on NCCL ("No backend type associated with device type
    cpu")."""
    dist.Backend.register_backend(
        "cudaonly", lambda store, rank, size, timeout: ProcessGroupGloo(store, rank, size, timeout),
        devices=["cuda"])
    return "cudaonly"


def site_meshes(sites: list[list[int]], shard: int) -> DeviceMesh:
    """This rank's mesh: its site's ranks as (replicas, shard) rows of ``shard`` consecutive
    ranks. Every rank makes every group, in the same order."""
    rank = dist.get_rank()
    mine = None
    for site in sites:
        layout = torch.tensor(sorted(site)).view(-1, shard)
        rows = {tuple(r): dist.new_group(r) for r in layout.tolist()}
        cols = {tuple(c): dist.new_group(c) for c in layout.t().tolist()}
        if rank in site:
            row = next(g for r, g in rows.items() if rank in r)
            col = next(g for c, g in cols.items() if rank in c)
            mine = DeviceMesh.from_group([col, row], "cpu", mesh=layout,
                                         mesh_dim_names=("replicate", "shard"))
    assert mine is not None
    return mine


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("--rank", "--world", "--port", "--steps"):
        ap.add_argument(name, type=int, required=True)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--sites")
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--deadline", type=float, default=30.0)
    ap.add_argument("--patience", type=float)
    ap.add_argument("--max-drift", type=int)
    ap.add_argument("--board")
    ap.add_argument("--master", help="host:port of rank 0 (default 127.0.0.1:--port)")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--pause-at", default="")
    ap.add_argument("--pause-s", type=float, default=0.0)
    ap.add_argument("--cuda-only", action="store_true")
    ap.add_argument("--pace", default="steps", choices=["steps", "time"])
    ap.add_argument("--samples", type=int, default=1)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--drift", type=float)
    ap.add_argument("--fsdp", type=int)
    ap.add_argument("--whole-state", action="store_true")
    ap.add_argument("--spread-chunk", type=int)
    a = ap.parse_args()
    if a.spread_chunk:
        outer_site.SPREAD_CHUNK = a.spread_chunk
    h, f, o, codec = a.plan.split(",")
    master = a.master or f"127.0.0.1:{a.port}"
    pauses = {int(x) for x in a.pause_at.split(",") if x}
    backend = cuda_only_backend() if a.cuda_only else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://{master}", rank=a.rank,
                            world_size=a.world, timeout=datetime.timedelta(seconds=120))
    sites = [[int(r) for r in s.split(",")] for s in a.sites.split("/")] if a.sites else None
    # The script's own CPU collectives (DDP on this CPU model, the last barrier) need a group
    # that takes CPU tensors; every rank makes every group, in the same order.
    host = member(dist.new_group(backend="gloo")) if a.cuda_only else None
    ddp_groups = [dist.new_group(sorted(s), backend="gloo") for s in sites] if (
        a.cuda_only and sites) else None
    torch.manual_seed(a.rank)  # OuterSync broadcasts rank 0's weights
    model: nn.Module = nn.Sequential(nn.Linear(32, a.width), nn.Tanh(), nn.Linear(a.width, 4))
    if a.drift is not None:
        model = nn.ParameterList([nn.Parameter(torch.zeros(a.width))])
    if a.fsdp:
        fully_shard(model, mesh=site_meshes(sites or [[r] for r in range(a.world)], a.fsdp))
    recorded: list[dict[str, object]] = []
    plans = BoardPlan(KnobBoard(a.board)) if a.board else None
    def on_round(s: RoundStats) -> None:
        r: dict[str, object] = {
            "fragment": s.fragment, "outcome": s.outcome, "round": s.round, "epoch": s.epoch,
            "sent": s.step, "lo": s.lo, "hi": s.hi, "wire_bytes": s.wire_bytes,
            "exchange_s": s.exchange_s, "late_steps": s.late_steps,
            "site_steps": s.site_steps, "weight": s.weight,
            "plan": [s.plan.sync_every, s.plan.fragments, s.plan.overlap, s.plan.codec]}
        if s.outcome == "applied":  # recorded once written: the values right after its step
            r["digest"] = digest(sync.flat.read(s.lo, s.hi))
            r["value"] = float(sync.flat.read(s.lo, s.hi)[0])
        recorded.append(r)

    sync = OuterSync(model, RoundPlan(int(h), int(f), int(o), codec), sites=sites,
                     deadline_s=a.deadline, patience_s=a.patience, max_drift=a.max_drift,
                     plan_source=plans, on_round=on_round, pace=a.pace,
                     samples_per_step=a.samples, shard_state=not a.whole_state)
    if sync.site_group is not None and a.drift is None and not a.fsdp:
        group = ddp_groups[sync.site_index] if ddp_groups else sync.site_group
        model = nn.parallel.DistributedDataParallel(model, process_group=group)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2) if a.drift is None else None
    site = sync.site_index
    gen = torch.Generator().manual_seed(1000 + site)
    print(json.dumps({"ready": True, "rank": a.rank, "params": sync.outer.numel(),
                      "shard": sync.shard}), flush=True)
    for step in range(a.steps):
        if a.rounds is not None and sync.rounds_done >= a.rounds:
            break
        began = time.monotonic()
        if opt is None:
            with torch.no_grad():
                for param in model.parameters():
                    param.sub_(a.drift * (site + 1))
        else:
            x = torch.randn(16, 32, generator=gen)
            y = (x[:, :4] * (site + 1)).argmax(1)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        time.sleep(a.sleep)  # the rest of a step's compute
        recorded.clear()
        synced = time.monotonic()
        sync.step()
        line: dict[str, object] = {
            "step": step, "rank": a.rank, "exchanges": list(recorded), "t": time.time(),
            "compute_s": synced - began, "sync_s": time.monotonic() - synced}
        line["outer_epoch"] = sync.epoch
        line["rounds_done"] = sync.rounds_done
        line["site_steps"] = sync.site_plan.sync_every
        p = sync.plan
        line["plan"] = [p.sync_every, p.fragments, p.overlap, p.codec]
        print(json.dumps(line), flush=True)
        if step in pauses:
            print(json.dumps({"idle": step, "rank": a.rank}), flush=True)
            time.sleep(a.pause_s)
    recorded.clear()
    # The job report as the daemon would read it (written now: rewrites come at most every
    # 0.25 s), before close() removes it.
    if sync.job_report is not None:
        sync.job_report.publish(force=True)
    report = sync.job_report and json.loads(open(sync.job_report.path, "rb").read())
    sent = sync.sent_bytes
    agreed = sync.close()  # may finish the exchange in flight: its record goes with the done line
    gone = sync.job_report is not None and not os.path.exists(sync.job_report.path)
    mine = torch.cat([(p.to_local() if a.fsdp else p).detach().reshape(-1)
                      for p in model.parameters()])
    whole = torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()]
                      ) if a.fsdp else mine
    print(json.dumps({"done": True, "rank": a.rank, "digest": digest(mine),
                      "outer": digest(sync.outer), "exchanges": list(recorded),
                      "report": report, "report_removed": gone, "sent_bytes": sent,
                      "agreed": agreed, "whole": digest(whole)}), flush=True)
    dist.barrier(group=host)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
