"""Shared test helpers: boards written by the daemon's own writer (`linkpilot board feed`).

Use from a test module as ``from conftest import feed_board`` (or the ``board_feeder`` fixture,
which closes every feeder it started)::

    with feed_board(tmp_path / "knobs") as feeder:
        feeder.publish([{"name": "wan", "compression": "int8", "decision_id": 7}])
        ...  # read the board
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a torch.distributed store."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def linkpilot_bin() -> str:
    """The `linkpilot` binary: $LINKPILOT_BIN, else the repository's debug build. Missing is
    a failure, not a skip: these tests exist to check the Python side against it."""
    path = os.environ.get("LINKPILOT_BIN") or str(REPO / "target" / "debug" / "linkpilot")
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"no linkpilot binary at {path}: build it (`cargo build -p linkpilot` in {REPO}) "
            "or point LINKPILOT_BIN at one",
            pytrace=False,
        )
    return path


class Feeder(contextlib.AbstractContextManager["Feeder"]):
    """A running `linkpilot board feed --board PATH`. Closing stdin ends it (exit 0); the board
    stays and goes stale, like a dead daemon's. As a context manager it closes on exit."""

    def __init__(self, path: str | os.PathLike[str], heartbeat_ms: int = 100) -> None:
        self.path = os.fspath(path)
        self.heartbeat_ms = heartbeat_ms
        self._proc = subprocess.Popen(
            [linkpilot_bin(), "board", "feed", "--board", self.path,
             "--heartbeat-ms", str(heartbeat_ms)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
        )
        self._pending = b""

    @property
    def pid(self) -> int:
        """The feeder's pid, which the board shows as the daemon's."""
        return self._proc.pid

    def publish(self, links: list[dict[str, Any]], timeout: float = 10.0) -> None:
        """Publishes one decision and waits until it is on the board."""
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"links": links}).encode() + b"\n")
        line = self._readline(time.monotonic() + timeout)
        if not line.startswith("published "):
            raise AssertionError(f"board feed said {line!r}: {self._stderr()}")

    def close(self, timeout: float = 10.0) -> None:
        """Ends the feed (stdin EOF) and checks it exited 0. Idempotent."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        try:
            code = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            raise AssertionError("board feed did not exit at end of input") from None
        if code != 0:
            raise AssertionError(f"board feed exited {code}: {self._stderr()}")

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _readline(self, deadline: float) -> str:
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise AssertionError(f"board feed did not answer in time: {self._stderr()}")
            chunk = os.read(fd, 4096)
            if not chunk:
                self._proc.wait(5)
                raise AssertionError(
                    f"board feed exited {self._proc.returncode}: {self._stderr()}"
                )
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line.decode()

    def _stderr(self) -> str:
        if self._proc.poll() is None or self._proc.stderr is None:
            return "(still running)"
        return self._proc.stderr.read().decode(errors="replace").strip()


def feed_board(path: str | os.PathLike[str], heartbeat_ms: int = 100) -> Feeder:
    """Starts `linkpilot board feed` on ``path``; the board exists when this returns."""
    feeder = Feeder(path, heartbeat_ms)
    # Wait until the file at the path is this feeder's (its pid in the header), also when it
    # replaces another board.
    deadline = time.monotonic() + 10
    while _board_pid(path) != feeder.pid:
        if feeder._proc.poll() is not None or time.monotonic() > deadline:
            feeder.close()  # raises with its stderr if it failed
            raise AssertionError(f"board feed created no board at {path}")
        time.sleep(0.005)
    return feeder


def _board_pid(path: str | os.PathLike[str]) -> int | None:
    try:
        with open(path, "rb") as f:
            header = f.read(40)
    except FileNotFoundError:
        return None
    return int.from_bytes(header[36:40], "little") if len(header) == 40 else None


@pytest.fixture
def board_feeder() -> Iterator[Callable[..., Feeder]]:
    """``board_feeder(path, heartbeat_ms=100)``: like :func:`feed_board`, closed at teardown."""
    started: list[Feeder] = []

    def start(path: str | os.PathLike[str], heartbeat_ms: int = 100) -> Feeder:
        started.append(feed_board(path, heartbeat_ms))
        return started[-1]

    yield start
    for feeder in started:
        feeder.close()
