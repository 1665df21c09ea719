"""linkpilot.board against boards written by the daemon's own writer (`linkpilot board feed`)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import feed_board

from linkpilot.board import (
    BoardBusy,
    BoardError,
    BoardFormatError,
    BoardMissing,
    BoardSnapshot,
    KnobBoard,
    LinkKnobs,
)

# Every knob of every slot set, every codec (top-k in both spellings the feeder takes), every
# NCCL algorithm and protocol name.
ALGOS = ["auto", "tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree"]
PROTOS = ["auto", "ll", "ll128", "simple", "auto", "ll"]
LINKS: list[dict[str, Any]] = [
    {"name": f"link-{c}", "state": f"state-{i}", "state_index": i, "compression": c,
     "chunk_bytes": (i + 1) << 20, "tcp_buffer_bytes": (i + 64) << 20, "watchdog_s": 600 + i,
     "nccl_ib_timeout": 14 + i, "nccl_ib_retry_cnt": i, "dscp": 40 + i,
     "roce_traffic_class": 160 + i, "decision_id": 100 + i, "nccl_algo": ALGOS[i],
     "nccl_proto": PROTOS[i], "nccl_max_channels": i, "nccl_min_bytes": 1 << (10 + i),
     "rtt_us": 1000 * i}
    for i, c in enumerate(["none", "fp16", "bf16", "int8", "int4", "topk:0.01"])
] + [
    {"name": "wide", "state": "severe", "state_index": 9, "compression": "topk",
     "topk_ratio": 0.125, "chunk_bytes": 1 << 40, "tcp_buffer_bytes": (1 << 64) - 1,
     "watchdog_s": (1 << 32) - 1, "nccl_ib_timeout": 255, "nccl_ib_retry_cnt": 7, "dscp": 63,
     "roce_traffic_class": 255, "decision_id": (1 << 64) - 1, "nccl_algo": "pat",
     "nccl_proto": "simple", "nccl_max_channels": 255, "nccl_min_bytes": (1 << 64) - 1,
     "rtt_us": (1 << 32) - 1, "sync_every": 0, "sync_min": 10, "sync_max": (1 << 32) - 1,
     "max_drift": (1 << 32) - 2, "outer_compression": "topk:0.05", "fragments": (1 << 16) - 1,
     "overlap": (1 << 16) - 2, "delivery_bps": (1 << 64) - 1, "capacity_bps": 40 * 10**9,
     "sync_margin_bp": (1 << 16) - 1},
]
# What the feeder writes for NCCL and synchronization fields a line leaves out (the reference
# policy's [nccl], the per-step exchange with the default bounds).
NCCL_DEFAULTS: dict[str, Any] = {
    "nccl_algo": "tree", "nccl_proto": "simple", "nccl_max_channels": 0,
    "nccl_min_bytes": 1 << 20, "rtt_us": 0, "sync_every": 1, "sync_min": 1, "sync_max": 500,
    "sync_margin": 0.2, "max_drift": 2000, "outer_codec": "int8", "fragments": 1, "overlap": 0,
    "delivery_bps": 0, "capacity_bps": 0,
}


def expected(fed: dict[str, Any]) -> LinkKnobs:
    codec, _, ratio = fed["compression"].partition(":")
    knobs = {**NCCL_DEFAULTS, **{k: v for k, v in fed.items() if k != "topk_ratio"}}
    knobs["compression"] = codec
    if "outer_compression" in knobs:  # the board's name for the codec LinkKnobs calls outer_codec
        knobs["outer_codec"] = knobs.pop("outer_compression")
    if "sync_margin_bp" in knobs:
        knobs["sync_margin"] = knobs.pop("sync_margin_bp") / 1e4
    return LinkKnobs(topk_ratio=float(ratio or fed.get("topk_ratio", 0.0)), **knobs)


def test_every_field_reads_as_fed(tmp_path: Path) -> None:
    path = tmp_path / "knobs"
    with feed_board(path) as feeder, KnobBoard(path) as board:
        feeder.publish(LINKS)
        snap = board.read()
    assert snap.links == tuple(expected(fed) for fed in LINKS)
    assert (snap.path, snap.pid, snap.heartbeat_interval_ms) == (str(path), feeder.pid, 100)
    assert snap.decision_id == (1 << 64) - 1 and not snap.stale and 0 <= snap.age_ms < 200
    assert [k.codec for k in snap.links] == [
        "none", "fp16", "bf16", "int8", "int4", "topk:0.01", "topk:0.125"
    ]
    assert snap.link("link-int8") == expected(LINKS[3]) and snap.link("nope") is None
    assert snap.worst() == expected(LINKS[-1])


def test_worst_is_the_first_of_the_highest_state(tmp_path: Path) -> None:
    path = tmp_path / "knobs"
    with feed_board(path) as feeder, KnobBoard(path) as board:
        feeder.publish([])
        assert board.read().links == () and board.read().worst() is None
        feeder.publish(
            [{"name": n, "state_index": i} for n, i in [("a", 1), ("b", 2), ("c", 2), ("d", 0)]]
        )
        worst = board.read().worst()
    assert worst is not None and worst.name == "b"


def test_stale_within_two_intervals_after_the_feeder_ends(tmp_path: Path) -> None:
    path, interval_ms = tmp_path / "knobs", 50
    feeder = feed_board(path, heartbeat_ms=interval_ms)
    board = KnobBoard(path)
    feeder.publish([{"name": "wan"}])
    # Without publishes the heartbeat keeps it fresh.
    time.sleep(4 * interval_ms / 1000)
    assert not board.read().stale
    feeder.close()
    ended = time.monotonic()
    # The last beat came before the exit, so staleness comes at most 2 intervals later.
    bound = 2 * interval_ms / 1000 + 0.1
    while not (snap := board.read()).stale:
        assert time.monotonic() - ended < bound, f"still fresh {bound}s after the end: {snap}"
        time.sleep(0.002)
    assert snap.age_ms > 2 * interval_ms and snap.links[0].name == "wan"
    # A vanished file leaves the last mapping: stale, not an error.
    path.unlink()
    assert board.read().stale
    board.close()


def test_reopens_when_a_new_daemon_replaces_the_file(tmp_path: Path) -> None:
    path = tmp_path / "knobs"
    with feed_board(path) as old, KnobBoard(path) as board:
        old.publish([{"name": "old", "decision_id": 1}])
        assert board.read().pid == old.pid
        with feed_board(path) as new:
            new.publish([{"name": "new", "decision_id": 2}])
            snap = board.read()
            assert (snap.pid, snap.decision_id, snap.links[0].name) == (new.pid, 2, "new")
            # The old writer now writes to its unlinked file, which nobody reads.
            old.publish([{"name": "old", "decision_id": 3}])
            assert board.read().links[0].name == "new"


def test_no_torn_reads_while_the_feeder_publishes(tmp_path: Path) -> None:
    def links(i: int) -> list[dict[str, Any]]:
        codec = ["none", "fp16", "bf16", "int8", "int4", f"topk:{(i % 40 + 1) / 100}"][i % 6]
        return [
            {"name": f"l{n}", "state": f"s{i}", "state_index": i % 5, "compression": codec,
             "chunk_bytes": i << 12, "tcp_buffer_bytes": i << 13, "watchdog_s": i,
             "nccl_ib_timeout": i % 32, "nccl_ib_retry_cnt": i % 8, "dscp": i % 64,
             "roce_traffic_class": i % 256, "decision_id": i}
            for n in range(3)
        ]

    path, n = tmp_path / "knobs", 500
    seen: list[BoardSnapshot] = []
    stop = threading.Event()
    with feed_board(path) as feeder, KnobBoard(path) as board:

        def reader() -> None:
            while not stop.is_set():
                seen.append(board.read())

        t = threading.Thread(target=reader)
        t.start()
        try:
            for i in range(1, n + 1):
                feeder.publish(links(i))
        finally:
            stop.set()
            t.join()
        seen.append(board.read())  # the reader may have stopped before the last publish
    assert len(seen) > 100, f"the reader should get many copies: {len(seen)}"
    last = 0
    for snap in seen:
        i = snap.decision_id
        assert i >= last, f"decision ids went back: {i} after {last}"
        last = i
        assert snap.links == (tuple(expected(l) for l in links(i)) if i else ()), snap
    assert last == n


@pytest.fixture
def good_board(tmp_path: Path) -> bytes:
    path = tmp_path / "good"
    with feed_board(path) as feeder:
        feeder.publish([{"name": "wan", "compression": "topk:0.01"}])
    return path.read_bytes()


def patched(tmp_path: Path, data: bytes, at: int, new: bytes) -> Path:
    path = tmp_path / "bad"
    path.write_bytes(data[:at] + new + data[at + len(new):])
    return path


@pytest.mark.parametrize(
    "at, new, error, words",
    [
        (0, b"LPKNOBZ\0", BoardFormatError, "not a knob board"),
        (8, (2).to_bytes(4, "little"), BoardFormatError, "layout version 2, this reader knows 3"),
        (12, (1079).to_bytes(4, "little"), BoardFormatError, "size field 1079"),
        (48, (9).to_bytes(4, "little"), BoardFormatError, "9 links"),
        (56 + 68, (9).to_bytes(4, "little"), BoardFormatError, "unknown compression code 9"),
        (56 + 124, b"\x07", BoardFormatError, "unknown NCCL algorithm code 7"),
        (56 + 125, b"\x03", BoardFormatError, "unknown NCCL protocol code 3"),
        (16, (7).to_bytes(8, "little"), BoardBusy, "no stable copy in 5 tries"),
    ],
)
def test_a_bad_board_is_a_clear_error(
    tmp_path: Path, good_board: bytes, at: int, new: bytes, error: type[BoardError], words: str
) -> None:
    path = patched(tmp_path, good_board, at, new)
    with KnobBoard(path, tries=5) as board, pytest.raises(error) as e:
        board.read()
    assert str(path) in str(e.value) and words in str(e.value), str(e.value)


def test_a_truncated_or_missing_board_is_a_clear_error(tmp_path: Path, good_board: bytes) -> None:
    path = tmp_path / "short"
    path.write_bytes(good_board[:100])
    with pytest.raises(BoardFormatError, match=f"{path}: truncated: 100 bytes, a board has 1528"):
        KnobBoard(path).read()
    with pytest.raises(BoardMissing, match=f"{tmp_path}/none: no such file"):
        KnobBoard(tmp_path / "none").read()


def test_default_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LINKPILOT_BOARD", raising=False)
    assert KnobBoard().path == "/run/linkpilot/knobs"
    monkeypatch.setenv("LINKPILOT_BOARD", "/tmp/elsewhere")
    assert KnobBoard().path == "/tmp/elsewhere"


def test_pending_actuators_are_named(tmp_path: Path, good_board: bytes) -> None:
    """The header's pending mask (offset 52): what of the decisions is not in place yet."""
    with KnobBoard(tmp_path / "good") as board:
        assert board.read().pending == ()
    bits = (1 << 1) | (1 << 4) | (1 << 9)
    with KnobBoard(patched(tmp_path, good_board, 52, bits.to_bytes(4, "little"))) as board:
        assert board.read().pending == ("env_file", "roce_tc", "bit9")


def test_a_board_left_half_written_is_refused_at_once_until_a_new_daemon_comes(
        tmp_path: Path) -> None:
    """A daemon killed mid-write leaves an odd sequence number for good: after two heartbeats of
    it, reads stop retrying (they would spin on every call) and say why; the next daemon's board
    is followed."""
    path = tmp_path / "knobs"
    with feed_board(path, heartbeat_ms=50) as dead:
        dead.publish([{"name": "wan", "decision_id": 1}])
        board = KnobBoard(path, tries=20)
        assert board.read().pid == dead.pid
    # What a SIGKILL between the two sequence stores leaves: the same file, seq odd.
    with open(path, "r+b") as f:
        seq = int.from_bytes(f.read()[16:24], "little")
        f.seek(16)
        f.write((seq + 1).to_bytes(8, "little"))
    with pytest.raises(BoardBusy, match="no stable copy in 20 tries"):
        board.read()
    time.sleep(0.15)  # two heartbeats of 50 ms, and some
    for _ in range(3):
        with pytest.raises(BoardBusy, match="left half-written for over two heartbeats"):
            board.read()
    with feed_board(path) as new:
        new.publish([{"name": "wan", "decision_id": 2}])
        snap = board.read()
        assert (snap.pid, snap.decision_id, snap.stale) == (new.pid, 2, False)
    board.close()


def test_a_kept_dscp_and_class_read_and_show_as_keep(tmp_path: Path) -> None:
    from linkpilot.__main__ import render
    from linkpilot.board import KEEP

    path = tmp_path / "knobs"
    with feed_board(path) as feeder, KnobBoard(path) as board:
        feeder.publish([{"name": "wan", "dscp": KEEP, "roce_traffic_class": KEEP},
                        {"name": "dc", "dscp": 26, "roce_traffic_class": 106}])
        snap = board.read()
    assert [(k.dscp, k.roce_traffic_class) for k in snap.links] == [(KEEP, KEEP), (26, 106)]
    rows = {line.split()[0]: line.split() for line in render(snap).splitlines()[2:]}
    assert rows["wan"][-3:-1] == ["keep", "keep"] and rows["dc"][-3:-1] == ["26", "106"], rows
