"""One rank of test_tuner_ranks.py: a small DDP job (gloo, CPU) with the linkpilot hook reading
this rank's own knob board, and NCCL played by this process: the tuner plugin loaded as NCCL
loads it, one communicator initialised (its latency constants recorded), and after every
step's backward pass the plugin asked about a fixed list of collectives, as NCCL asks on every
rank. Prints one JSON line per step with the answers, and the constants first.

    python tuner_rank.py --rank R --world W --port P --board B --plugin SO --steps N [--sleep S]
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from linkpilot.ddp import LinkpilotHook, hook
from linkpilot.tuner import TunerError, TunerGate

ALLREDUCE, ALLGATHER = 4, 2
# NCCL's costs for a multi-node AllReduce: Tree and Ring with every protocol, the rest -1.
TABLE = [30.0, 25.0, 20.0, 5.0, 15.0, 10.0] + [-1.0] * 15
# The collectives "NCCL" asks about every step: below and above the policies' 1 MiB.
ASKED = [(c, n) for c in (ALLREDUCE, ALLGATHER) for n in (512 << 10, 4 << 20, 64 << 20)]
# getChunkSize for Ring/Simple (NCCL_BUFFSIZE 8 MiB: 4 MiB chunks) and Tree/Simple (1 MiB).
CHUNKS = [(1, 2, 4 << 20), (0, 2, 1 << 20)]

Init = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint64,
                        ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p,
                        ctypes.c_void_p)
CollInfo = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t,
                            ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                            ctypes.c_int, ctypes.POINTER(ctypes.c_int))
Finalize = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
ChunkSize = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t,
                             ctypes.c_int, ctypes.c_int, ctypes.c_int,
                             ctypes.POINTER(ctypes.c_size_t))


class TunerV6(ctypes.Structure):
    """ncclTuner_v6_t."""

    _fields_ = [("name", ctypes.c_char_p), ("init", Init), ("get_coll_info", CollInfo),
                ("finalize", Finalize), ("get_chunk_size", ChunkSize)]


class Nccl:
    """The calls NCCL makes on the plugin of this process, for one communicator."""

    def __init__(self, plugin: str, world: int) -> None:
        lib = ctypes.CDLL(plugin)
        self.v6 = TunerV6.in_dll(lib, "ncclTunerPlugin_v6")
        self.ctx = ctypes.c_void_p()
        # tunerConstants: 144 doubles; the NET row of hwLatencies holds NCCL's defaults.
        self.constants = (ctypes.c_double * 144)()
        net = [5.0, 8.5, 14, 2.7, 4.0, 14.0, 0, 0, 31, 0, 0, 30, 0, 0, 18, 0, 0, 20.9, 0, 0, 14]
        for i, v in enumerate(net):
            self.constants[21 + 2 * 21 + i] = v
        nvl = (ctypes.c_int * 3)(1, 8, 8)
        rc = self.v6.init(ctypes.byref(self.ctx), 0x1234, world, 2, None, ctypes.byref(nvl),
                          ctypes.byref(self.constants))
        assert rc == 0, rc

    def ask(self) -> list[Any]:
        answers: list[Any] = []
        for coll, n in ASKED:
            table = (ctypes.c_float * 21)(*TABLE)
            nch = ctypes.c_int(0)
            rc = self.v6.get_coll_info(self.ctx, coll, n, 1, ctypes.cast(table, ctypes.c_void_p),
                                       7, 3, 0, ctypes.byref(nch))
            answers.append([rc, list(table), nch.value])
            for algo, proto, incoming in CHUNKS:
                chunk = ctypes.c_size_t(incoming)
                rc = self.v6.get_chunk_size(self.ctx, coll, n, algo, proto, 4, ctypes.byref(chunk))
                answers.append([rc, chunk.value])
        return answers

    def net_latencies(self) -> list[float]:
        return list(self.constants[63:84])


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("--rank", "--world", "--port", "--steps"):
        ap.add_argument(name, type=int, required=True)
    ap.add_argument("--board", required=True)
    ap.add_argument("--plugin", required=True)
    ap.add_argument("--sleep", type=float, default=0.0)
    args = ap.parse_args()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)))
    try:
        gate: TunerGate | None = TunerGate(args.plugin)
    except TunerError as e:  # a plugin without the gate: what it does on its own
        print(json.dumps({"no_gate": str(e)}), flush=True)
        gate = None
    state = LinkpilotHook(args.board, large_bucket_bytes=0, tuner=gate)
    model.register_comm_hook(state, hook)
    nccl = Nccl(args.plugin, args.world)
    print(json.dumps({"net": nccl.net_latencies()}), flush=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        x, y = torch.randn(16, 64), torch.randint(0, 8, (16,))
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        # The step's collectives, as this rank's NCCL would ask about them (the hook adopted
        # the agreed decision at the start of the backward pass, before its first collective).
        answers = nccl.ask()
        opt.step()
        s = state.history[-1]
        print(json.dumps({"step": step, "answers": answers, "board_state": s.board_state,
                          "tuner": None if s.tuner is None else str(s.tuner)}), flush=True)
        time.sleep(args.sleep)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
