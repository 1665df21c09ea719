"""``python -m linkpilot status``: the knob board as a training process sees it."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

from linkpilot.board import KEEP, BoardError, BoardSnapshot, KnobBoard
from linkpilot.tuner import Diagnosis, diagnose

_COLUMNS = "{:<12} {:<16} {:<12} {:>7} {:>7} {:>6} {:>4} {:>5} {:>4} {:>3} {:>8}"


def _bytes(n: int) -> str:
    """The daemon's style: "8MiB", "1.5GiB"."""
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= scale:
            return f"{n // scale}{unit}" if n % scale == 0 else f"{n / scale:.1f}{unit}"
    return f"{n}B"


def _kept(v: int) -> str:
    return "keep" if v == KEEP else str(v)


def render(s: BoardSnapshot) -> str:
    verdict = "STALE: the daemon missed two heartbeats, use safe defaults" if s.stale else "fresh"
    lines = [
        f"knob board {s.path}: pid {s.pid}, decision {s.decision_id}, heartbeat "
        f"{s.age_ms:.1f}ms ago (every {s.heartbeat_interval_ms}ms): {verdict}",
        *([f"not in place yet (retried): {', '.join(s.pending)}"] if s.pending else []),
        _COLUMNS.format(
            "LINK", "STATE", "CODEC", "CHUNK", "TCPBUF", "WDOG", "IBTO", "RETRY", "DSCP", "TC",
            "DECISION",
        ),
    ]
    for k in s.links:
        lines.append(
            _COLUMNS.format(
                k.name, f"{k.state} ({k.state_index})", k.codec, _bytes(k.chunk_bytes),
                _bytes(k.tcp_buffer_bytes), f"{k.watchdog_s}s", k.nccl_ib_timeout,
                k.nccl_ib_retry_cnt, _kept(k.dscp), _kept(k.roce_traffic_class), k.decision_id,
            )
        )
    if not s.links:
        lines.append("(no links)")
    return "\n".join(lines)


def render_tuner(d: Diagnosis, pid: int | None) -> str:
    where = {None: " (set nowhere: not in the environment nor the daemon's env file)",
             "environment": "", "argument": ""}.get(
        d.source, f" (from {d.source}, which linkpilot.init_process_group loads)")
    lines = [f"NCCL_TUNER_PLUGIN={d.setting or ''}{where}"]
    if d.library is None:
        lines.append("NCCL loads no tuner plugin: it makes its own choices")
        return "\n".join(lines)
    lines.append(f"library: {d.library}")
    needs = f"; the library needs glibc {d.needs_glibc}" if d.needs_glibc else ""
    lines.append(f"glibc here: {d.glibc}{needs}")
    if d.load_error:
        lines.append(f"NOT LOADABLE here, so NCCL runs without it and says nothing: {d.load_error}")
    elif not d.has_gate:
        lines.append("loads, but it is not linkpilot's plugin (no linkpilot_tuner_adopt)")
    else:
        lines.append("loads: linkpilot's plugin, with the gate the training code adopts "
                     "decisions through")
    if pid is not None:
        lines.append({True: f"pid {pid} has it loaded",
                      False: f"pid {pid} does NOT have it loaded (its NCCL makes its own choices)",
                      None: f"pid {pid}: cannot read its memory map"}[d.loaded_in_pid])
    return "\n".join(lines)


def to_json(s: BoardSnapshot) -> dict[str, Any]:
    out = dataclasses.asdict(s)
    for d, k in zip(out["links"], s.links):
        d["codec"] = k.codec
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m linkpilot", description="Training-side tools of linkpilot."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    status = commands.add_parser(
        "status", help="print the knob board (exit 1 if it cannot be read)"
    )
    status.add_argument("--json", action="store_true", help="one JSON object")
    status.add_argument(
        "--board", help="the board file (default: $LINKPILOT_BOARD, else /run/linkpilot/knobs)"
    )
    tuner = commands.add_parser(
        "tuner", help="check that NCCL can load the tuner plugin NCCL_TUNER_PLUGIN names, in "
        "the environment or else the daemon's env file (exit 1 if not)")
    tuner.add_argument("--pid", type=int, help="also check that this process has it loaded")
    tuner.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args(argv)
    if args.command == "tuner":
        d = diagnose(pid=args.pid)
        print(json.dumps({**dataclasses.asdict(d), "ok": d.ok}, indent=2) if args.json
              else render_tuner(d, args.pid), flush=True)
        return 0 if d.ok else 1
    try:
        with KnobBoard(args.board) as board:
            snap = board.read()
    except BoardError as e:
        print(f"linkpilot: {e}", file=sys.stderr)
        return 1
    try:
        print(json.dumps(to_json(snap), indent=2) if args.json else render(snap), flush=True)
    except BrokenPipeError:  # `| head`: quiet, as Unix tools are
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
