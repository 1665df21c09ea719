#!/usr/bin/env python3
"""A training-side process reading linkpilot's knob board in a loop, as a training step does:
every 5 ms a snapshot through linkpilot.board, and the codec it would use (the worst link's,
or the safe default "none" while the board is stale or missing).

  board_watch.py BOARD

Prints a JSON line at every change it sees (missing -> fresh -> stale -> fresh ...), with the
CLOCK_MONOTONIC time it saw it (the board's own clock) and the daemon's pid, and on SIGTERM a
last line with its counts; then exits 0. Any other exception ends it with a traceback and a
non-zero status, which is what a training job reading the board would do.
"""
import json
import signal
import sys
import time

from linkpilot.board import BoardBusy, BoardMissing, KnobBoard

stop = False


def on_term(_signum, _frame):
    global stop
    stop = True


def emit(**fields):
    print(json.dumps(fields), flush=True)


def main():
    signal.signal(signal.SIGTERM, on_term)
    board = KnobBoard(sys.argv[1])
    counts = {"reads": 0, "fresh": 0, "stale": 0, "missing": 0, "busy": 0,
              "to_fresh": 0, "to_stale": 0}
    state = "missing"
    codecs = set()
    emit(event="ready", mono_ns=time.monotonic_ns())
    while not stop:
        try:
            snap = board.read()
        except BoardMissing:
            counts["missing"] += 1
            new, snap = "missing", None
        except BoardBusy:
            counts["busy"] += 1
            time.sleep(0.005)
            continue
        else:
            counts["reads"] += 1
            new = "stale" if snap.stale else "fresh"
            counts[new] += 1
            worst = snap.worst()
            codecs.add("none" if snap.stale or worst is None else worst.codec)
        if new != state:
            if new in ("fresh", "stale"):
                counts["to_" + new] += 1
            emit(event=new, mono_ns=time.monotonic_ns(),
                 pid=snap.pid if snap else 0,
                 heartbeat_ns=snap.heartbeat_ns if snap else 0,
                 interval_ms=snap.heartbeat_interval_ms if snap else 0)
            state = new
        time.sleep(0.005)
    emit(event="done", codecs=sorted(codecs), **counts)


if __name__ == "__main__":
    main()
