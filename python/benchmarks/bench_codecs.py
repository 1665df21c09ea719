"""Encode/decode throughput of linkpilot's gradient codecs.

Throughput is GB/s of float32 *input* (1 GB = 1e9 bytes), median of --reps timed repetitions
after one warm-up, on CPU and, when available, CUDA (synchronised around each timing).
Also reports the wire ratio (payload bytes / fp32 bytes) and the relative L2 error on the
benchmark's Student-t(3) data.

    python python/benchmarks/bench_codecs.py [--mib 64] [--reps 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

try:
    from linkpilot.codecs import get_codec
except ModuleNotFoundError as e:  # run from a checkout without an install
    if e.name != "linkpilot":
        raise
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from linkpilot.codecs import get_codec

DEFAULT_CODECS = "none,fp16,bf16,int8,int4,topk:0.01"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _time(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Median seconds of fn() over reps runs, after one warm-up."""
    fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench(device: torch.device, names: list[str], mib: int, reps: int) -> list[dict[str, Any]]:
    numel = mib * 2**20 // 4
    torch.manual_seed(0)  # the same data on every device
    x = torch.distributions.StudentT(3.0).sample((numel,)).to(device)
    gb = 4 * numel / 1e9
    rows: list[dict[str, Any]] = []
    for name in names:
        c = get_codec(name)
        payload = c.encode(x)
        err = float((c.decode(payload, numel) - x).norm() / x.norm())
        t_enc = _time(lambda: c.encode(x), device, reps)
        t_dec = _time(lambda: c.decode(payload, numel), device, reps)
        t_both = _time(lambda: c.decode(c.encode(x), numel), device, reps)
        rows.append({
            "device": str(device), "codec": c.name, "mib": mib,
            "wire_ratio": c.wire_bytes(numel) / (4 * numel), "rel_l2_error": err,
            "encode_gbps": gb / t_enc, "decode_gbps": gb / t_dec, "roundtrip_gbps": gb / t_both,
        })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mib", type=int, default=64, help="fp32 gradient size in MiB (default 64)")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions, median (default 5)")
    ap.add_argument("--codecs", default=DEFAULT_CODECS,
                    help=f"comma list (default {DEFAULT_CODECS})")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="auto: cpu, plus cuda when available")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    ap.add_argument("--json", type=Path, help="also write the rows and the machine as JSON here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = [torch.device("cpu")] if args.device in ("auto", "cpu") else []
    if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()):
        devices.append(torch.device("cuda"))
    names = [n for n in args.codecs.split(",") if n]
    rows = [r for d in devices for r in bench(d, names, args.mib, args.reps)]

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, "
          f"{_cpu_name()}, GPU: {gpu}; "
          f"{args.mib} MiB fp32, median of {args.reps}\n")
    print("| device | codec | wire/fp32 | rel. L2 error "
          "| encode GB/s | decode GB/s | enc+dec GB/s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['device']} | {r['codec']} | {r['wire_ratio']:.4f} | {r['rel_l2_error']:.2e} | "
              f"{r['encode_gbps']:.2f} | {r['decode_gbps']:.2f} | {r['roundtrip_gbps']:.2f} |")
    if "none" in names:
        print("\nnone: encode and decode return their input (no copy): "
              "its figures are call overhead.")
    if args.json:
        meta = {"torch": torch.__version__, "cpu": _cpu_name(), "gpu": gpu,
                "threads": torch.get_num_threads(), "mib": args.mib, "reps": args.reps,
                "argv": sys.argv}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
