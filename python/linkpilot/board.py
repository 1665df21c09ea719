"""Reader of the daemon's knob board (docs/knob-board.md, layout version 3).

The file is mapped once; each :meth:`KnobBoard.read` copies the 1528 bytes under the seqlock, so
a read costs a copy and a ``stat`` of the path (to notice a restarted daemon's new file), with
no parsing of anything but the copy. Standard library only.

Memory ordering: Python has no acquire loads. The sequence number is read as one aligned 8-byte
load (a ``memoryview`` cast), which is a single load on the platforms the daemon runs on; on
x86-64 loads are not reordered with other loads, so the seqlock holds there as in C.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from dataclasses import dataclass
from types import TracebackType

DEFAULT_PATH = "/run/linkpilot/knobs"
MAGIC = b"LPKNOBS\0"
VERSION = 3
SIZE = 1528
MAX_LINKS = 8
#: Compression names by board code.
CODECS = ("none", "fp16", "bf16", "int8", "int4", "topk")
#: NCCL algorithm and protocol names by board code (NCCL's numbers); 255 is "auto".
NCCL_ALGOS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
NCCL_PROTOS = ("ll", "ll128", "simple")
_NCCL_ANY = 255
#: Actuators by bit of the header's ``pending`` mask (common/src/board.rs, ``pending::NAMES``).
#: ``dscp`` and ``roce_traffic_class`` of a link whose policy leaves them alone ("keep").
KEEP = 255
ACTUATORS = ("dscp", "env_file", "sysctl", "host_sysctl", "roce_tc", "transport")

_HEADER = struct.Struct("<8sIIQQIIQII")  # magic .. n_links, pending
_LINK = struct.Struct("<32s32sIIdQQIBBBBQQIBBBxIIIIIHHdQQHBB4x")
_LINKS_AT = _HEADER.size
_SEQ_WORD = 16 // 8  # seq, as an index into the board viewed as u64 words
assert _HEADER.size == 56 and _LINK.size == 184 and _LINKS_AT + MAX_LINKS * _LINK.size == SIZE


class BoardError(Exception):
    """The board at ``path`` cannot be read; ``str()`` says why and names the path."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"knob board {path}: {problem}")
        self.path = path
        self.problem = problem


class BoardMissing(BoardError):
    """No file at the path (no daemon has run, or a different path)."""


class BoardFormatError(BoardError):
    """The file is not a version-3 board, is cut short, or holds a value no daemon writes."""


class BoardBusy(BoardError):
    """No stable copy within the retries: the writer kept writing, or died mid-write (then, once
    the same half-written state has lasted two heartbeats, reads fail at once without
    retrying)."""


@dataclass(frozen=True, slots=True)
class LinkKnobs:
    """One link's knobs as the daemon last decided them."""

    name: str
    state: str
    state_index: int
    compression: str
    topk_ratio: float
    chunk_bytes: int
    tcp_buffer_bytes: int
    watchdog_s: int
    nccl_ib_timeout: int
    nccl_ib_retry_cnt: int
    #: ``KEEP`` (255): the policy leaves it alone.
    dscp: int
    roce_traffic_class: int
    decision_id: int
    #: What the NCCL tuner plugin asks NCCL for (the policy's [nccl] rule of the state):
    #: collectives of at least ``nccl_min_bytes`` prefer ``nccl_algo``/``nccl_proto`` ("auto":
    #: NCCL's own) with at most ``nccl_max_channels`` channels (0: NCCL's count).
    nccl_min_bytes: int
    nccl_algo: str
    nccl_proto: str
    nccl_max_channels: int
    #: The link's RTT baseline in microseconds (0: not measured yet).
    rtt_us: int
    #: Cross-site synchronization (linkpilot.outer): inner steps per round (1: every step; 0:
    #: "auto", derived within ``sync_min..sync_max`` from the rates below and the job's own
    #: compute time, keeping ``sync_margin`` of an exchange's time to spare), the
    #: pseudo-gradients' codec, fragments, overlap, and the inner steps a site may run without a
    #: sync before it waits.
    sync_every: int = 1
    sync_min: int = 1
    sync_max: int = 1
    sync_margin: float = 0.0
    max_drift: int = 0
    outer_codec: str = "int8"
    #: ``outer_codec = "auto"``: this side chooses the codec with H, from ``outer_weakest`` to
    #: ``outer_codec`` (the strongest allowed).
    outer_codec_auto: bool = False
    outer_weakest: str = "none"
    fragments: int = 1
    overlap: int = 0
    #: The rate the link has shown it carries (0: nothing measured yet), and its nominal
    #: capacity, bit/s.
    delivery_bps: int = 0
    capacity_bps: int = 0

    @property
    def codec(self) -> str:
        """The codec spec: ``"int8"``, or ``"topk:0.01"`` with the kept fraction."""
        return f"topk:{self.topk_ratio!r}" if self.compression == "topk" else self.compression


@dataclass(frozen=True, slots=True)
class BoardSnapshot:
    """A stable copy of the board. When ``stale``, the daemon missed two heartbeats (dead or
    stuck): use safe defaults instead of these knobs."""

    path: str
    pid: int
    decision_id: int
    heartbeat_ns: int
    heartbeat_interval_ms: int
    stale: bool
    age_ms: float
    links: tuple[LinkKnobs, ...]
    #: Actuators whose part of these decisions is not in place yet (their write failed; the
    #: daemon retries every tick), e.g. ``("sysctl",)``. Empty: everything shown is in place.
    pending: tuple[str, ...] = ()

    def link(self, name: str) -> LinkKnobs | None:
        return next((k for k in self.links if k.name == name), None)

    def worst(self) -> LinkKnobs | None:
        """The link in the worst state (highest ladder index; the first of equals)."""
        worst: LinkKnobs | None = None
        for k in self.links:
            if worst is None or k.state_index > worst.state_index:
                worst = k
        return worst


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")


class _Mapping:
    """One mapped board file, checked once: magic, version and size never change after the
    daemon creates the file."""

    def __init__(self, path: str) -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise BoardMissing(path, "no such file (is `linkpilot run` running?)") from None
        except OSError as e:
            raise BoardError(path, e.strerror or str(e)) from None
        try:
            st = os.fstat(fd)
            if st.st_size < SIZE:
                raise BoardFormatError(path, f"truncated: {st.st_size} bytes, a board has {SIZE}")
            self.mm = mmap.mmap(fd, SIZE, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self.ident = (st.st_ino, st.st_dev)
        magic, version, size = struct.unpack_from("<8sII", self.mm, 0)
        problem = None
        if magic != MAGIC:
            problem = f"not a knob board (magic {magic!r})"
        elif version != VERSION:
            problem = f"layout version {version}, this reader knows {VERSION}"
        elif size != SIZE:
            problem = f"size field {size}, a version-{VERSION} board has {SIZE}"
        if problem:
            self.mm.close()
            raise BoardFormatError(path, problem)
        self.words = memoryview(self.mm).cast("Q")

    def close(self) -> None:
        self.words.release()  # the mmap refuses to close while a view exists
        self.mm.close()


class KnobBoard:
    """The daemon's knob board at ``path`` (default: ``$LINKPILOT_BOARD``, else
    ``/run/linkpilot/knobs``). The file is opened on the first :meth:`read`. Thread-safe."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *, tries: int = 1000) -> None:
        self.path = os.fspath(path) if path is not None else (
            os.environ.get("LINKPILOT_BOARD") or DEFAULT_PATH
        )
        self.tries = tries
        self._map: _Mapping | None = None
        self._lock = threading.Lock()
        self._stale_reopen_ns = 0
        # A sequence number seen odd through every retry, since when, and after how long it
        # counts as a writer that died mid-write (two heartbeats of the last good copy).
        self._stuck: tuple[int, int] | None = None
        self._stuck_after_ns = 200_000_000
        self._links_raw = b""
        self._links: tuple[LinkKnobs, ...] = ()

    def read(self) -> BoardSnapshot:
        """A stable copy of the board now. Raises a :class:`BoardError`."""
        with self._lock:
            if self._map is None or self._replaced(self._map):
                self._reopen()
            try:
                snap = self._snapshot()
            except BoardBusy:
                if self._stuck is None:
                    raise
                # Half-written: a new daemon's file may have the same inode number (not every
                # filesystem promises new ones), so map the path afresh now and then.
                now = time.monotonic_ns()
                if now - self._stale_reopen_ns <= self._stuck_after_ns:
                    raise
                self._stale_reopen_ns = now
                self._reopen()
                snap = self._snapshot()
            if snap.stale:
                # Inode numbers are not a promise on every filesystem: while stale, also map
                # the path afresh now and then (each stale window), as the doc's readers do.
                now = time.monotonic_ns()
                if now - self._stale_reopen_ns > 2 * max(snap.heartbeat_interval_ms, 1) * 10**6:
                    self._stale_reopen_ns = now
                    try:
                        self._reopen()
                    except BoardMissing:
                        return snap
                    snap = self._snapshot()
            return snap

    def close(self) -> None:
        with self._lock:
            if self._map is not None:
                self._map.close()
                self._map = None

    def __enter__(self) -> KnobBoard:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _replaced(self, m: _Mapping) -> bool:
        try:
            st = os.stat(self.path)
        except OSError:
            return False  # gone: keep the mapping we have; it goes stale
        return (st.st_ino, st.st_dev) != m.ident

    def _reopen(self) -> None:
        new = _Mapping(self.path)  # on failure the old mapping stays
        if self._map is not None:
            self._map.close()
        self._map = new
        # `_stuck` stays: it compares the sequence number found in whatever file is mapped now,
        # and a new daemon's board does not hold the dead one's odd number.

    def _snapshot(self) -> BoardSnapshot:
        assert self._map is not None
        words, mm = self._map.words, self._map.mm
        stuck = self._stuck
        if stuck is not None and words[_SEQ_WORD] == stuck[0]:
            held_ns = time.monotonic_ns() - stuck[1]
            if held_ns > self._stuck_after_ns:
                raise BoardBusy(self.path, "left half-written for over two heartbeats (the daemon "
                                "died while writing?); waiting for a new board")
        data = None
        for attempt in range(self.tries):
            seq = words[_SEQ_WORD]
            if not seq & 1:
                data = mm[:SIZE]
                if words[_SEQ_WORD] == seq:
                    break
                data = None
            if attempt:
                time.sleep(0)  # let a descheduled writer finish
        if data is None:
            seq = words[_SEQ_WORD]
            if seq & 1 and (stuck is None or stuck[0] != seq):
                self._stuck = (seq, time.monotonic_ns())
            raise BoardBusy(self.path, f"the daemon kept writing: no stable copy in {self.tries} tries")
        self._stuck = None
        now = time.monotonic_ns()
        (_, _, _, _, heartbeat_ns, interval_ms, pid, decision_id, n_links,
         pending) = _HEADER.unpack_from(data)
        if n_links > MAX_LINKS:
            raise BoardFormatError(self.path, f"{n_links} links, a board has room for {MAX_LINKS}")
        # Most reads see only a new heartbeat: reuse the parsed links when their bytes match.
        raw = data[_LINKS_AT : _LINKS_AT + n_links * _LINK.size]
        if raw != self._links_raw:
            self._links = tuple(self._link(data, i) for i in range(n_links))
            self._links_raw = raw
        links = self._links
        self._stuck_after_ns = 2 * max(interval_ms, 1) * 1_000_000
        age_ns = max(now - heartbeat_ns, 0)
        return BoardSnapshot(
            path=self.path,
            pid=pid,
            decision_id=decision_id,
            heartbeat_ns=heartbeat_ns,
            heartbeat_interval_ms=interval_ms,
            stale=age_ns > 2 * max(interval_ms, 1) * 1_000_000,
            age_ms=age_ns / 1e6,
            links=links,
            pending=tuple(
                ACTUATORS[bit] if bit < len(ACTUATORS) else f"bit{bit}"
                for bit in range(32)
                if pending >> bit & 1
            ),
        )

    def _link(self, data: bytes, i: int) -> LinkKnobs:
        (name, state, state_index, code, topk_ratio, chunk, tcp_buf, watchdog_s, ib_timeout,
         ib_retry, dscp, tc, decision_id, min_bytes, rtt_us, algo, proto, max_channels,
         sync_every, sync_min, sync_max, max_drift, outer_code, fragments, overlap, outer_ratio,
         delivery_bps, capacity_bps, margin_bp, outer_auto,
         outer_weakest) = _LINK.unpack_from(data, _LINKS_AT + i * _LINK.size)
        for what, c in (("compression", code), ("outer compression", outer_code),
                        ("weakest outer compression", outer_weakest)):
            if c >= len(CODECS):
                raise BoardFormatError(self.path, f"link slot {i}: unknown {what} code {c}")
        nccl = (("algorithm", algo, NCCL_ALGOS), ("protocol", proto, NCCL_PROTOS))
        for what, value, names in nccl:
            if value != _NCCL_ANY and value >= len(names):
                raise BoardFormatError(
                    self.path, f"link slot {i}: unknown NCCL {what} code {value}"
                )
        return LinkKnobs(
            name=_text(name),
            state=_text(state),
            state_index=state_index,
            compression=CODECS[code],
            topk_ratio=topk_ratio,
            chunk_bytes=chunk,
            tcp_buffer_bytes=tcp_buf,
            watchdog_s=watchdog_s,
            nccl_ib_timeout=ib_timeout,
            nccl_ib_retry_cnt=ib_retry,
            dscp=dscp,
            roce_traffic_class=tc,
            decision_id=decision_id,
            nccl_min_bytes=min_bytes,
            nccl_algo="auto" if algo == _NCCL_ANY else NCCL_ALGOS[algo],
            nccl_proto="auto" if proto == _NCCL_ANY else NCCL_PROTOS[proto],
            nccl_max_channels=max_channels,
            rtt_us=rtt_us,
            sync_every=sync_every,
            sync_min=sync_min,
            sync_max=sync_max,
            sync_margin=margin_bp / 1e4,
            max_drift=max_drift,
            outer_codec=(f"topk:{outer_ratio!r}" if CODECS[outer_code] == "topk"
                         else CODECS[outer_code]),
            outer_codec_auto=outer_auto == 1,
            outer_weakest=CODECS[outer_weakest],
            fragments=fragments,
            overlap=overlap,
            delivery_bps=delivery_bps,
            capacity_bps=capacity_bps,
        )
