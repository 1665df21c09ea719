"""Job reports: what the network costs a training job, published for the linkpilot daemon.

Every training process with a report keeps one file in the daemon's job-report directory
(``LINKPILOT_JOBS``, default ``/run/linkpilot/jobs``; created by the daemon, world-writable and
sticky like /tmp): ``<pid>-<16 hex digits>``, exactly :data:`REPORT_SIZE` bytes of JSON padded
with spaces, rewritten in place with one ``pwrite`` (never truncated, so a reader never sees a
half-empty file) and held under ``flock`` while the process lives. The daemon reads it every
second as untrusted input and shows, per job, how much of the step the network takes
(``linkpilot status``, the ``linkpilot_job_*`` metrics).

Counters are totals since the process started (steps, step seconds, compute seconds, exposed
communication wait, wire bytes, failed collectives), so the daemon's rates do not depend on
when it reads. :class:`linkpilot.ddp.LinkpilotHook` and :class:`linkpilot.outer.OuterSync`
publish through :meth:`JobReport.auto` when the directory exists; a training loop may add its
loss with :meth:`JobReport.set_loss`. :func:`linkpilot.init_process_group` starts the process's
report (kind "init", no steps yet) as soon as its process group is up, so the daemon knows the
job's connections from the start (the model broadcast, the first steps) and not only from the
hook's first step; the first hook or synchronizer then takes that report over. Standard
library only.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import math
import os
import re
import secrets
import socket
import sys
import time
from dataclasses import dataclass

log = logging.getLogger("linkpilot.jobreport")

__all__ = ["DEFAULT_DIR", "REPORT_SIZE", "JobReport", "StepClock", "job_name",
           "network_namespace"]

DEFAULT_DIR = "/run/linkpilot/jobs"
#: Every report file has exactly this many bytes.
REPORT_SIZE = 1024
VERSION = 1
#: Rewrites at most this often (the daemon reads once a second); the last one on close.
_MIN_INTERVAL_S = 0.25
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
#: The report :meth:`JobReport.at_init` started and no hook has taken over yet.
_unclaimed: JobReport | None = None


def job_name() -> str:
    """The job's name: ``LINKPILOT_JOB``, else torchrun's run id, else Slurm's job id, else
    "default". Characters outside ``[A-Za-z0-9_.:-]`` become ``_``, at most 64 of them."""
    for var in ("LINKPILOT_JOB", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        value = os.environ.get(var, "")
        if value:
            return re.sub(r"[^A-Za-z0-9_.:-]", "_", value)[:64]
    return "default"


#: ``SO_NETNS_COOKIE`` (Linux 5.14+): the socket's network namespace, as eBPF programs see it.
_SO_NETNS_COOKIE = 71


def network_namespace() -> tuple[int | None, int | None]:
    """This process's network namespace: its inode number and its cookie (None where the
    kernel gives none). A daemon whose policy opts in acts in the namespace a job's report
    names (a pod's own) as in its own."""
    try:
        inum: int | None = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        inum = None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            raw = s.getsockopt(socket.SOL_SOCKET, _SO_NETNS_COOKIE, 8)
        cookie: int | None = int.from_bytes(raw, sys.byteorder)
    except OSError:
        cookie = None
    return inum, cookie


def _check(*, rank: int, world: int, link: str | None) -> None:
    if link is not None and not _NAME.fullmatch(link):
        raise ValueError(f"link name {link!r}: 1-64 of [A-Za-z0-9_.:-]")
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} must be in [0, world {world})")


@dataclass
class _Totals:
    steps: int = 0
    step_s: float = 0.0
    compute_s: float = 0.0
    wait_s: float = 0.0
    wire_bytes: int = 0
    failed: int = 0


class JobReport:
    """One process's report file. ``kind``: what publishes it ("ddp", "outer", or "init" until
    a hook takes it over); ``link``: the
    policy link the job's cross-site traffic takes (None: the daemon's first link)."""

    def __init__(self, directory: str, *, rank: int, world: int, kind: str,
                 job: str | None = None, link: str | None = None) -> None:
        self.job = job if job is not None else job_name()
        if not _NAME.fullmatch(self.job):
            raise ValueError(f"job name {self.job!r}: 1-64 of [A-Za-z0-9_.:-]")
        _check(rank=rank, world=world, link=link)
        self.rank, self.world, self.kind, self.link = rank, world, kind, link
        self.path = os.path.join(directory, f"{os.getpid()}-{secrets.token_hex(8)}")
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self._fd: int | None = os.open(self.path, flags, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # held while this process lives: it is live
        self.totals = _Totals()
        self.codec = "none"
        self.sync_every: int | None = None
        self.loss: float | None = None
        self.netns, self.netns_cookie = network_namespace()
        self._written = 0.0
        self.publish(force=True)
        atexit.register(self.close)  # a clean exit takes its file along

    @staticmethod
    def auto(*, rank: int, world: int, kind: str,
             link: str | None = None) -> JobReport | None:
        """A report in ``LINKPILOT_JOBS`` (default :data:`DEFAULT_DIR`) when that directory
        exists and takes files; None otherwise (said once in the log, not an error). The
        report :meth:`at_init` started is taken over (once) instead of a new file."""
        global _unclaimed
        started, _unclaimed = _unclaimed, None
        if started is not None and started._fd is not None:
            try:
                _check(rank=rank, world=world, link=link)
            except ValueError as e:
                log.warning("no job report: %s", e)
                started.close()
                return None
            started.rank, started.world, started.kind, started.link = rank, world, kind, link
            started.publish(force=True)
            return started
        return JobReport._create(rank=rank, world=world, kind=kind, link=link)

    @staticmethod
    def at_init(*, rank: int, world: int) -> JobReport | None:
        """The process's report as its process group comes up (kind "init"), for the next
        :meth:`auto` to take over; None where :meth:`auto` would give none."""
        global _unclaimed
        if _unclaimed is None:
            _unclaimed = JobReport._create(rank=rank, world=world, kind="init", link=None)
        return _unclaimed

    @staticmethod
    def _create(*, rank: int, world: int, kind: str, link: str | None) -> JobReport | None:
        directory = os.environ.get("LINKPILOT_JOBS", DEFAULT_DIR)
        if not os.path.isdir(directory):
            return None
        try:
            return JobReport(directory, rank=rank, world=world, kind=kind, link=link)
        except (OSError, ValueError) as e:
            log.warning("no job report: %s", e)
            return None

    def step(self, *, step_s: float, wait_s: float, wire_bytes: int, codec: str,
             sync_every: int | None = None, failed: int = 0) -> None:
        """One finished step: its wall time, the part spent waiting for communication that no
        compute hid, and the bytes it put on the wire."""
        step_s = max(0.0, step_s)
        wait_s = min(max(0.0, wait_s), step_s)
        t = self.totals
        t.steps += 1
        t.step_s += step_s
        t.wait_s += wait_s
        t.compute_s += step_s - wait_s
        t.wire_bytes += max(0, wire_bytes)
        t.failed += max(0, failed)
        self.codec, self.sync_every = codec, sync_every
        self.publish()

    def set_loss(self, loss: float) -> None:
        """The training loss, shown beside the job's network figures (optional)."""
        self.loss = loss if math.isfinite(loss) else None

    def encode(self) -> bytes:
        t = self.totals
        doc = {"version": VERSION, "job": self.job, "rank": self.rank, "world": self.world,
               "kind": self.kind, "link": self.link, "steps": t.steps,
               "step_s": round(t.step_s, 6), "compute_s": round(t.compute_s, 6),
               "wait_s": round(t.wait_s, 6), "wire_bytes": t.wire_bytes, "failed": t.failed,
               "codec": self.codec[:16], "sync_every": self.sync_every,
               "loss": None if self.loss is None else round(self.loss, 6),
               "netns": self.netns, "netns_cookie": self.netns_cookie,
               "updated": round(time.time(), 3)}
        body = json.dumps(doc, separators=(",", ":")).encode()
        if len(body) >= REPORT_SIZE:
            raise ValueError(f"job report of {len(body)} bytes exceeds {REPORT_SIZE - 1}")
        return body.ljust(REPORT_SIZE - 1) + b"\n"

    def publish(self, force: bool = False) -> None:
        """Rewrites the file (at most every 0.25 s unless forced); a failed write is logged
        once and the report stops: training goes on."""
        now = time.monotonic()
        if self._fd is None or (not force and now - self._written < _MIN_INTERVAL_S):
            return
        self._written = now
        try:
            os.pwrite(self._fd, self.encode(), 0)
        except OSError as e:
            log.warning("job report %s: %s; no more reports", self.path, e)
            self._close_fd()

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        """The last figures out, then the file removed (a crash leaves it unlocked: the daemon
        removes it)."""
        if self._fd is None:
            return
        self.publish(force=True)
        try:
            os.unlink(self.path)
        except OSError:
            pass
        self._close_fd()


class StepClock:
    """A step's wall time and its exposed communication wait, from when its first and last
    bucket were handed over and when its last exchange completed: the wait is the time from
    the last hand-over (backward has finished computing) to the last completion, which no
    compute hid."""

    def __init__(self) -> None:
        self._began: float | None = None
        self._last_call = 0.0
        self._last_done = 0.0

    def call(self) -> None:
        self._last_call = time.monotonic()

    def done(self) -> None:
        self._last_done = time.monotonic()  # gloo's thread or the hook's: a float store

    def begin(self) -> tuple[float, float] | None:
        """Called as a step begins: the previous step's (step_s, wait_s), None for the first."""
        now = time.monotonic()
        began, self._began = self._began, now
        if began is None:
            return None
        return now - began, max(0.0, self._last_done - self._last_call)
