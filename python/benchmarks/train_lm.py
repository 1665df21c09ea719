"""One rank of the training benchmark: a character-level transformer LM under DDP over gloo.

    python python/benchmarks/train_lm.py --rank R --world W --master HOST:PORT
        (--steps N | --duration S [--sync-every 10]) [--hook none|linkpilot|fixed] ...

The workload of ``cargo xtask bench-training``: every configuration (untuned, hand-tuned,
adaptive, oracle) runs this same script with the same model, data and data order; only the
network settings and the gradient hook differ.

Model. A GPT-style decoder (pre-LayerNorm blocks of causal self-attention and a 4x GELU MLP,
learned positions, untied output head, no dropout) over bytes (vocabulary 256). A transformer
rather than a GRU because it is the workload of the reference case (LLM training) and because
its gradient is a realistic mix of tensors: large matrices (qkv 3d x d, MLP 4d x d) that fill
DDP's large buckets next to many small ones (LayerNorms, biases), which is the split the hook
treats differently (large buckets get the board's codec, small ones fp16 at most). Its compute
is almost all matmuls, which run at a steady rate on one CPU thread, so step time is stable.

Data. The Python standard library's own source, so the data ships with the interpreter and never
depends on the network or the locale: every ``*.py`` under ``sysconfig.get_paths()["stdlib"]``
(site-packages and dist-packages excluded, so installed packages do not change it), sorted by
relative POSIX path, concatenated as raw bytes, first ``--data-mib`` MiB. The first 95% is for
training, the last 5% is held out. The start line reports the data's SHA-256: every rank and
every host must print the same. Batches: for step s, a ``torch.Generator`` seeded with 32 bits
of SHA-256 of ``"seed/s"`` draws ``batch * world`` window offsets into the training text; rank r
takes offsets ``[r*batch, (r+1)*batch)``. The global batch is therefore the same set of windows, in
the same order, for any split of the same global batch over ranks (4 ranks of 2 = 2 ranks of 4).
Eval: ``--eval-windows`` windows evenly spaced over the held-out text (fixed; the same on every
rank), evaluated every ``--eval-every`` steps and after the last step.

Sizing (defaults: width 256, depth 4, 8 heads, seq 128, batch 8 per rank). 3,323,648
parameters: a 13.3 MB fp32 gradient. Compute is about 6 x parameters x tokens = 6 x 3.3M x 1024
= 20 GFLOP per rank and step. The exchange, untuned: any all-reduce of 2 ranks sends the whole
gradient's size each way (a ring: half in reduce-scatter, half in all-gather), 13.3 MB; one TCP
stream with the hosts' default 4 MiB socket buffers moves at most ~23 MB/s at 180 ms RTT (and
the lab's 200 Mbit/s link 25 MB/s), so the exchange is >= 0.55 s of transfer plus round trips
against ~0.23 s of compute: well over half of the step, more with 2 ranks per site. int8 (an
all_gather of a quarter of the bytes, plus scales) cuts the transfer to ~0.14 s.
Measured, one rank alone (no communication; torch 2.15 CPU, 1 thread, AMD EPYC 2-core VM):
    python python/benchmarks/train_lm.py --rank 0 --world 1 --master 127.0.0.1:29631 --steps 40
    -> compute_s_baseline (forward+backward) 0.22 s; median step_s 0.234 s (forward 0.075,
       backward 0.153, AdamW 0.006); eval of the 16 windows 0.15 s
with the other core idle; 0.27 s per step with the other core ~30% busy. Over loopback: 2 ranks
(one per core) 0.25 s per step; 4 ranks on the 2 cores with --batch 4 (the same global batch
of 16) compute_s_baseline 0.24 s, 0.30 s per step. Step compute scales with batch x seq x
parameters; all are flags.

Stopping. ``--steps N`` stops every rank after N steps. ``--duration S`` stops after S seconds
of rank 0's wall clock since its first step: every ``--sync-every`` steps all ranks join a
one-element all_reduce (MAX) that carries rank 0's "time is up", so all ranks stop at the same
step. That all_reduce is blocking and costs at least one round trip (180 ms in the lab), so it
is kept rare (default every 10 steps); it runs after the step's ``t_end`` and is reported as
``sync_s``. Evaluation also runs after ``t_end`` (``eval_s``); both count in ``--duration``.
``--stop-file F`` costs no round trip: before each step every rank reads F, and once it holds a
step number K every rank stops before step K. Whoever writes F (the benchmark, which reads every
rank's step lines) picks K far enough ahead of the furthest rank that no rank has begun step K.
``--own-clock`` (``--hook outer``) makes ``--duration`` each site's own: no collective across
sites, so sites of unequal speed each take the steps that fit, and OuterSync's close() gives
every site the same model. The ranks of a site of several stop at the same step: each step they
all_reduce (MAX) whether any one's clock has run out, over the site's own group.

Checkpoints. ``--checkpoint-every-s S --checkpoint-dir D``: rank 0 saves the parameters after
the first step that ends S seconds or more after its last save (and after the last step) to
``D/step-<steps>.pt``, with the step's ``t_end`` and the model sizing, from a background thread;
``python/benchmarks/eval_checkpoints.py`` evaluates them after the run, so the curve of eval loss
against time costs the run nothing (in-run evaluation pauses every rank), and fast and slow
configurations get the same time resolution. Only rank 0 decides, so no agreement is needed.

Output: JSON lines on stdout, flushed; rank 0 prints them (every rank with --all-ranks-report).
Every line has "rank". First, once:
    {"start": true, "world", "hook", "codec" (of --hook fixed, else null), "params",
     "grad_bytes", "model": {"width", "depth", "heads", "seq", "batch", "lr", "seed",
     "bucket_mb", "threads"}, "data": {"bytes", "files", "sha256", "train_bytes",
     "eval_bytes"}, "compute_s_baseline"}
then one per step:
    {"step", "t_start", "t_end" (time.time(), around forward + backward + optimizer step),
     "step_s" (t_end - t_start), "forward_s", "backward_s" (including DDP's wait for the
     gradient exchange), "loss" (this rank's batch), "codec" (the hook's for large buckets;
     "none" without a hook), "wire_bytes" (the hook's, per rank; without a hook params x 4),
     "coding_s" (encode + decode), "buckets" ([numel, codec, wire_bytes] per bucket, or null),
     "decision_id" and "board_state" (null without a hook), "proposed" (the codec this rank's
     board asked for at this step, which the next step's agreed codec takes into account; null
     without a hook), "timeout_s" (the collective
     timeout in force), "compute_s_baseline" (forward+backward of one batch, no communication,
     measured once at startup on the bare module), and when evaluated "eval_loss", "eval_s",
     when synced for --duration "sync_s"; with --hook outer, "codec" is the round plan's
     ("int8, H=16"), "wire_bytes" what the site's leader sent in this step, and "outer_plan"
     ([H, fragments, overlap]), "outer" ([round, fragment, outcome, exchange_s, waited_s,
     late_steps] of each exchange finished in this step) and "outer_epoch" (resyncs so far)}
Every rank prints the last line, {"done": true, "steps", "stopped" ("steps", "duration" or
"stop-file"),
"final_loss", "final_eval_loss", "digest" (SHA-256 of the parameters: replicas print the same),
"elapsed_s"}. A failed collective (timeout, connection reset, a peer gone) makes the rank print
{"failed": "<error>", "step": N (-1 while setting up)} and exit with status 3 at once. Ranks
end with a barrier, then leave with os._exit after flushing: no interpreter teardown, which can
hang on a dead peer or abort on gloo's worker threads (see main).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import linkpilot
from linkpilot.board import BoardError, KnobBoard
from linkpilot.ddp import LinkpilotHook, StepStats, group_timeout, hook
from linkpilot.ddp_check import digest, parse_sites
from linkpilot.outer import OuterSync, RoundPlan, RoundStats
from linkpilot.outer.board import BoardPlan

if not __package__:  # run as a script: python/ holds the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.lm_data import batch_offsets, eval_offsets, load_corpus, windows
from benchmarks.lm_model import CharLM, compute_baseline, eval_loss, lm_loss
from benchmarks.lm_run import Checkpoints, Reporter, out_of_time, stop_step

#: Where the fixed-codec configuration "reads" its board: a path that cannot exist, so the hook
#: proposes its safe codec (the fixed one) on every step.
NO_BOARD = os.path.join(os.devnull, "no-board")
FAILED_EXIT = 3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    run = ap.add_argument_group("job")
    run.add_argument("--rank", type=int, required=True)
    run.add_argument("--world", type=int, required=True)
    run.add_argument("--master", required=True, help="HOST:PORT of rank 0's store")
    run.add_argument("--iface", help="GLOO_SOCKET_IFNAME")
    run.add_argument("--env-file", help="the daemon's env file to load (variables and watchdog "
                     "timeout floor); without it nothing is loaded")
    run.add_argument("--timeout-s", type=float, default=120.0, help="collective timeout")
    run.add_argument("--steps", type=int, help="stop after this many steps")
    run.add_argument("--duration", type=float, help="stop after this many seconds (rank 0's clock)")
    run.add_argument("--sync-every", type=int, default=10,
                     help="steps between --duration checks (each costs a round trip)")
    run.add_argument("--own-clock", action="store_true",
                     help="--duration on each site's own clock, with no collective across "
                     "sites (--hook outer)")
    run.add_argument("--stop-file", help="stop before the step number this file holds, once "
                     "it holds one (read before every step; no round trip)")
    run.add_argument("--checkpoint-every-s", type=float, default=0.0,
                     help="rank 0 saves the parameters every S seconds (at a step's end) and "
                     "after the last step")
    run.add_argument("--checkpoint-dir", help="where --checkpoint-every-s saves")
    run.add_argument("--all-ranks-report", action="store_true", help="every rank prints steps")
    comm = ap.add_argument_group("gradient exchange")
    comm.add_argument("--hook", choices=["none", "linkpilot", "fixed", "outer"], default="none",
                      help="none: DDP's all-reduce; linkpilot: follow --board; fixed: --codec; "
                      "outer: sync across sites every --outer-every steps (linkpilot.outer)")
    comm.add_argument("--codec", default="int8", help="the codec of --hook fixed")
    comm.add_argument("--board", help="knob board of --hook linkpilot (default: LINKPILOT_BOARD "
                      "or /run/linkpilot/knobs); with --hook outer, the rounds' plans follow it "
                      "(the --outer-* plan starts the run)")
    comm.add_argument("--link", help="board link to follow (default: the worst)")
    comm.add_argument("--large-bucket-bytes", type=int, default=1 << 20)
    comm.add_argument("--small-codec", default="fp16")
    comm.add_argument("--safe-codec", default="none",
                      help="--hook linkpilot's codec when the board is missing or stale")
    comm.add_argument("--sites", help="ranks per site for the two-level exchange, e.g. 0,1/2,3")
    comm.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    outer = ap.add_argument_group("--hook outer (inner steps local to a site)")
    outer.add_argument("--outer-every", type=int, default=10, help="inner steps per round (H)")
    outer.add_argument("--fragments", type=int, default=1, help="parts synced one at a time")
    outer.add_argument("--overlap", type=int, default=0,
                       help="inner steps a fragment's exchange may take before it is applied")
    outer.add_argument("--outer-codec", default="int8", help="the pseudo-gradients' codec")
    outer.add_argument("--pace", choices=["steps", "time"], default="steps",
                       help="steps: every site takes H steps a round; time: H of the fastest")
    outer.add_argument("--outer-lr", type=float, default=1.0)
    outer.add_argument("--outer-momentum", type=float, default=0.0)
    outer.add_argument("--outer-deadline-s", type=float, default=30.0,
                       help="an exchange that takes longer is given up (inner steps go on)")
    outer.add_argument("--outer-patience-s", type=float,
                       help="how long an apply step waits for its exchange before applying it "
                       "when it lands (default: about one inner step, at least 0.1 s; "
                       "the deadline: blocking, as published DiLoCo runs)")
    outer.add_argument("--max-drift", type=int, help="inner steps without a sync before a site "
                       "waits for the link (default 4 rounds)")
    model = ap.add_argument_group("model and data")
    model.add_argument("--width", type=int, default=256)
    model.add_argument("--depth", type=int, default=4)
    model.add_argument("--heads", type=int, default=8)
    model.add_argument("--seq", type=int, default=128)
    model.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    model.add_argument("--lr", type=float, default=1e-3)
    model.add_argument("--seed", type=int, default=0)
    model.add_argument("--data-mib", type=float, default=8.0)
    model.add_argument("--eval-every", type=int, default=50, help="0: only after the last step")
    model.add_argument("--eval-windows", type=int, default=16)
    model.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = ap.parse_args(argv)
    if args.steps is None and args.duration is None and args.stop_file is None:
        ap.error("give --steps, --duration or --stop-file")
    if args.own_clock and (args.duration is None or args.hook != "outer"):
        ap.error("--own-clock needs --duration and --hook outer")
    if args.checkpoint_every_s < 0 or (args.checkpoint_every_s and not args.checkpoint_dir):
        ap.error("--checkpoint-every-s needs a positive interval and --checkpoint-dir")
    if args.hook == "none" and args.sites:
        ap.error("--sites needs --hook linkpilot, fixed or outer")
    if (args.steps is not None and args.steps < 1) or args.sync_every < 1:
        ap.error("--steps and --sync-every must be at least 1")
    if args.width % args.heads:
        ap.error("--width must be a multiple of --heads")
    return args


def main(argv: list[str] | None = None) -> NoReturn:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    report = Reporter(sys.stdout, args.rank, args.all_ranks_report)
    try:
        code = train(args, report)
    except (RuntimeError, OSError) as e:  # gloo's errors are RuntimeErrors (DistBackendError...)
        report.line({"failed": f"{type(e).__name__}: {e}", "step": report.step}, always=True)
        code = FAILED_EXIT
    # No teardown, failed or not. With a peer gone, destroy_process_group can hang. And gloo's
    # worker threads may still hold the hook's finished collectives (tensors owned by Python)
    # and drop them while the interpreter finalizes, which aborts the process ("terminate
    # called without an active exception", SIGABRT: 1 run in 8 with the hook here before this
    # os._exit, 0 in 30 after; pytorch/pytorch#190489).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def train(args: argparse.Namespace, report: Reporter) -> int:
    if args.iface:
        os.environ["GLOO_SOCKET_IFNAME"] = args.iface
    linkpilot.init_process_group(
        "gloo", init_method=f"tcp://{args.master}", rank=args.rank, world_size=args.world,
        timeout=datetime.timedelta(seconds=args.timeout_s),
        env_file=args.env_file or os.devnull, required=bool(args.env_file))
    corpus = load_corpus(args.data_mib)
    torch.manual_seed(args.seed)  # every rank starts from the same weights
    net = CharLM(args.width, args.depth, args.heads, args.seq)
    params = sum(p.numel() for p in net.parameters())
    x0, y0 = windows(corpus, batch_offsets(corpus, args.seed, 0, args.rank, args.world,
                                           args.batch, args.seq), args.seq)
    baseline = compute_baseline(net, x0, y0)
    sync: OuterSync | None = None
    sent: list[RoundStats] = []
    sent_before = 0
    if args.hook == "outer":
        try:
            plan = RoundPlan(args.outer_every, args.fragments, args.overlap, args.outer_codec)
            plans = BoardPlan(KnobBoard(args.board), link=args.link) if args.board else None
            if plans is not None:
                plan = plans.initial(plan)
            sites = parse_sites(args.sites)
            site_ranks = next((len(s) for s in sites if args.rank in s), 1) if sites else 1
            sync = OuterSync(net, plan, sites=sites, outer_lr=args.outer_lr, pace=args.pace,
                             samples_per_step=args.batch * site_ranks,
                             outer_momentum=args.outer_momentum, plan_source=plans,
                             deadline_s=args.outer_deadline_s,
                             patience_s=args.outer_patience_s,
                             max_drift=args.max_drift or (plans.max_drift if plans else None)
                             or None, on_round=sent.append)
        except (ValueError, BoardError) as e:
            raise SystemExit(f"--hook outer: {e}") from None
    # Per-step exchange: DDP over every rank; outer: DDP inside the site only (or none).
    model: nn.Module = net
    if sync is None:
        model = ddp = DistributedDataParallel(net, bucket_cap_mb=args.bucket_mb)
    elif sync.site_group is not None:
        model = ddp = DistributedDataParallel(net, bucket_cap_mb=args.bucket_mb,
                                              process_group=sync.site_group)
    state: LinkpilotHook | None = None
    if args.hook in ("linkpilot", "fixed"):
        fixed = args.hook == "fixed"
        state = LinkpilotHook(
            NO_BOARD if fixed else args.board, link=args.link,
            large_bucket_bytes=args.large_bucket_bytes, small_codec=args.small_codec,
            safe_codec=args.codec if fixed else args.safe_codec, sites=parse_sites(args.sites))
        ddp.register_comm_hook(state, hook)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    ex, ey = windows(corpus, eval_offsets(corpus, args.eval_windows, args.seq), args.seq)
    report.line({
        "start": True, "world": args.world, "hook": args.hook,
        "codec": args.codec if args.hook == "fixed" else None,
        "params": params, "grad_bytes": params * 4,
        "model": {"width": args.width, "depth": args.depth, "heads": args.heads,
                  "seq": args.seq, "batch": args.batch, "lr": args.lr, "seed": args.seed,
                  "bucket_mb": args.bucket_mb, "threads": args.threads},
        "data": {"bytes": len(corpus.data), "files": corpus.files, "sha256": corpus.sha256,
                 "train_bytes": corpus.n_train, "eval_bytes": len(corpus.data) - corpus.n_train},
        "compute_s_baseline": baseline,
    })

    checkpoints = None
    if args.checkpoint_every_s and args.rank == 0:
        checkpoints = Checkpoints(args.checkpoint_dir, {
            "width": args.width, "depth": args.depth, "heads": args.heads, "seq": args.seq,
            "data_mib": args.data_mib, "seed": args.seed})
    stop = torch.zeros(1)
    started = time.time()
    loss_value, last_eval = math.nan, math.nan
    stopped, step = "steps", 0
    saved, saved_at = -1, started
    t_end = started
    while args.steps is None or step < args.steps:
        if args.stop_file:
            k = stop_step(args.stop_file)
            if k is not None and step >= k:
                stopped = "stop-file"
                break
        report.step = step
        x, y = windows(corpus, batch_offsets(corpus, args.seed, step, args.rank, args.world,
                                             args.batch, args.seq), args.seq)
        t_start = time.time()
        if step == 0:
            started = t_start
        loss = lm_loss(model, x, y)
        t_fwd = time.time()
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        t_bwd = time.time()
        opt.step()
        if sync is not None:
            sent.clear()
            sent_before = sync.sent_bytes
            sync.step()  # may wait: for an exchange still in flight at its apply step
        t_end = time.time()
        loss_value = float(loss.detach())
        stats: StepStats | None = state.history[-1] if state is not None else None
        line: dict[str, Any] = {
            "step": step, "t_start": t_start, "t_end": t_end, "step_s": t_end - t_start,
            "forward_s": t_fwd - t_start, "backward_s": t_bwd - t_fwd, "loss": loss_value,
            "codec": stats.codec if stats else "none",
            "wire_bytes": stats.wire_bytes if stats else params * 4,
            "coding_s": stats.coding_s if stats else 0.0,
            "buckets": [[b.numel, b.codec, b.wire_bytes] for b in stats.buckets]
            if stats else None,
            "decision_id": stats.decision_id if stats else None,
            "board_state": stats.board_state if stats else None,
            "proposed": stats.proposed if stats else None,
            "timeout_s": (state.timeout if state else group_timeout()).total_seconds(),
            "compute_s_baseline": baseline,
        }
        if sync is not None:
            p = sync.plan
            line.update(codec=f"{p.codec}, H={p.sync_every}",
                        wire_bytes=sync.sent_bytes - sent_before,
                        outer_plan=[p.sync_every, p.fragments, p.overlap],
                        outer=[[r.round, r.fragment, r.outcome, round(r.exchange_s, 3),
                                round(r.waited_s, 3), r.late_steps] for r in sent],
                        outer_epoch=sync.epoch)
        step += 1
        if checkpoints is not None and (step == 1 or t_end - saved_at >= args.checkpoint_every_s):
            checkpoints.save(net, step, t_end)
            saved, saved_at = step, t_end
        last = args.steps is not None and step >= args.steps
        if args.own_clock and out_of_time(time.time() - started >= args.duration, sync):
            last, stopped = True, "duration"
        elif (args.duration is not None and not args.own_clock and not last
              and step % args.sync_every == 0):
            t_sync = time.time()
            stop.fill_(float(args.rank == 0 and t_sync - started >= args.duration))
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            line["sync_s"] = time.time() - t_sync
            if stop.item():
                last, stopped = True, "duration"
        if last or (args.eval_every and step % args.eval_every == 0):
            t_eval = time.time()
            last_eval = eval_loss(net, ex, ey)
            line.update(eval_loss=last_eval, eval_s=time.time() - t_eval)
        report.line(line)
        if last:
            break
    if stopped == "stop-file" and step > 0:
        last_eval = eval_loss(net, ex, ey)  # the last step was reported without one
    if checkpoints is not None:
        if saved != step and step > 0:
            checkpoints.save(net, step, t_end)
        checkpoints.close()
    if sync is not None:
        sync.close()
        # The model close() left (the sites' last agreed outer state) is the run's result.
        last_eval = eval_loss(net, ex, ey)
    # Every rank has received everything sent to it before any exits (an exit with unread
    # data resets the connection under a peer's last receive).
    dist.barrier()
    report.line({"done": True, "steps": step, "stopped": stopped, "final_loss": loss_value,
                 "final_eval_loss": last_eval, "digest": digest(net),
                 "elapsed_s": time.time() - started}, always=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    main()
