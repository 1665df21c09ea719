"""One rank of a small DDP job with the linkpilot hook, to check a cluster's path end to end.

    python -m linkpilot.ddp_check --rank R --world N --master HOST:PORT [--steps 20]
        [--board PATH] [--sites 0,1/2,3] [--iface eth0]

Every rank trains the same MLP on the same synthetic data shard for its rank, prints one JSON
line per step (codec, bytes sent per bucket, coding time, decision id, loss) and a last line
with a SHA-256 of its parameters: replicas that stayed identical print the same digest.
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
from torch.nn.parallel import DistributedDataParallel

from linkpilot.ddp import LinkpilotHook, StepStats, group_timeout, hook


def model(width: int, depth: int) -> nn.Module:
    torch.manual_seed(0)  # every rank starts from the same weights
    layers: list[nn.Module] = [nn.Linear(64, width), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers += [nn.Linear(width, 8)]
    return nn.Sequential(*layers)


def digest(m: nn.Module) -> str:
    h = hashlib.sha256()
    for p in m.parameters():
        h.update(p.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def parse_sites(text: str | None) -> list[list[int]] | None:
    if not text:
        return None
    try:
        return [[int(r) for r in site.split(",")] for site in text.split("/")]
    except ValueError:
        raise SystemExit(f"--sites {text!r}: expected ranks like 0,1/2,3") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m linkpilot.ddp_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True, help="HOST:PORT of rank 0's store")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--until-codec", help="stop once this codec has run 3 steps (max --steps)")
    ap.add_argument("--board", help="knob board (default: LINKPILOT_BOARD or /run/linkpilot/knobs)")
    ap.add_argument("--link", help="board link to follow (default: the worst)")
    ap.add_argument("--sites", help="ranks per site, e.g. 0,1/2,3")
    ap.add_argument("--cross-backend", help="backend of the cross-site groups (default: the job's)")
    ap.add_argument("--safe-codec", default="none")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--bucket-mb", type=float, default=0.5)
    ap.add_argument("--large-bucket-bytes", type=int, default=256 << 10)
    ap.add_argument("--step-sleep", type=float, default=0.0, help="seconds of 'compute' per step")
    ap.add_argument("--timeout-s", type=int, default=120)
    ap.add_argument("--iface", help="GLOO_SOCKET_IFNAME")
    args = ap.parse_args(argv)

    if args.iface:
        os.environ["GLOO_SOCKET_IFNAME"] = args.iface
    host, _, port = args.master.rpartition(":")
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=args.rank,
                            world_size=args.world,
                            timeout=datetime.timedelta(seconds=args.timeout_s))
    net = model(args.width, args.depth)
    ddp = DistributedDataParallel(net, bucket_cap_mb=args.bucket_mb)
    out = sys.stdout

    def report(s: StepStats) -> None:
        out.write(json.dumps({
            "step": s.step, "codec": s.codec, "decision_id": s.decision_id,
            "board_state": s.board_state, "wire_bytes": s.wire_bytes, "coding_s": s.coding_s,
            "buckets": [[b.index, b.numel, b.codec, b.wire_bytes] for b in s.buckets],
            "timeout_s": group_timeout().total_seconds(),
        }) + "\n")
        out.flush()

    state = LinkpilotHook(args.board, link=args.link, sites=parse_sites(args.sites),
                          cross_backend=args.cross_backend,
                          safe_codec=args.safe_codec, large_bucket_bytes=args.large_bucket_bytes,
                          on_step=report)
    ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + args.rank)
    target = torch.Generator().manual_seed(7)
    teacher = torch.randn(64, 8, generator=target)
    streak = 0
    for _ in range(args.steps):
        x = torch.randn(32, 64, generator=gen)
        loss = nn.functional.mse_loss(ddp(x), x @ teacher)
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        if state.job_report is not None:
            state.job_report.set_loss(float(loss))
        if args.step_sleep:
            # The step's collectives are done here: say so, so that a harness can read the
            # link's counters while the link is quiet.
            out.write(json.dumps({"idle": state.step - 1, "t": time.monotonic()}) + "\n")
            out.flush()
            time.sleep(args.step_sleep)
        last = state.history[-1]
        # The agreed codec is the same on every rank, so every rank stops at the same step.
        streak = streak + 1 if last.codec == args.until_codec else 0
        if args.until_codec and streak >= 3:
            break
    dist.barrier()  # the last step's futures are done: report it
    if state.history:
        report(state.history[-1])
    if state.job_report is not None:
        state.job_report.publish(force=True)  # os._exit below: the file stays, unlocked
    cross = state._sites and dist.get_backend(state._sites.cross_groups[0])
    out.write(json.dumps({"done": True, "steps": state.step, "digest": digest(net),
                          "cross_backend": cross,
                          "loss": float(loss)}) + "\n")
    out.flush()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Not sys.exit: at interpreter shutdown gloo's threads may still release the hook's finished
    # collectives, whose tensors Python owns, and abort the process (pytorch/pytorch#190489).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
