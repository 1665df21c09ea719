"""The NCCL tuner plugin's gate, from the training side.

NCCL asks the tuner plugin on every rank separately and never compares the answers; a
collective hangs or corrupts data when ranks choose differently. So the plugin follows no
per-host knob board: the training code tells it, in-process, which decision to adopt, on every
rank at the same step boundary and with the decision the ranks agreed on
(:class:`linkpilot.ddp.LinkpilotHook` does this at the start of every step). Until the first
adoption, and after a withdrawal, NCCL makes its own choices.

NCCL opens the plugin named by ``NCCL_TUNER_PLUGIN`` with ``dlopen``; opening the same file here
gives the same library, so an adoption reaches the calls NCCL makes in this process. Standard
library only.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass

log = logging.getLogger("linkpilot.tuner")

__all__ = ["NCCL_ALGOS", "NCCL_PROTOS", "TunerError", "TunerGate", "TunerRule", "plugin_path"]

#: NCCL's algorithm and protocol numbers; 255 means NCCL's own choice.
NCCL_ALGOS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
NCCL_PROTOS = ("ll", "ll128", "simple")
ANY = 255


class TunerError(Exception):
    """The plugin cannot be loaded, is not linkpilot's, or refused a decision."""


@dataclass(frozen=True, slots=True)
class TunerRule:
    """What a decision asks of NCCL: collectives of at least ``min_bytes`` prefer ``algo`` and
    ``proto`` (NCCL's numbers, 255: NCCL's own) with at most ``max_channels`` channels (0:
    NCCL's count) and chunks as if NCCL_BUFFSIZE were ``chunk_bytes`` (0: NCCL's own).
    ``state_index`` is the link state's place in the policy's ladder, for logs."""

    algo: int = ANY
    proto: int = ANY
    max_channels: int = 0
    state_index: int = 0
    min_bytes: int = 0
    chunk_bytes: int = 0

    @staticmethod
    def from_names(algo: str, proto: str, **rest: int) -> TunerRule:
        """``algo``/``proto`` by name as the board gives them ("auto": NCCL's own)."""
        a = ANY if algo == "auto" else NCCL_ALGOS.index(algo)
        p = ANY if proto == "auto" else NCCL_PROTOS.index(proto)
        return TunerRule(algo=a, proto=p, **rest)


class _Decision(ctypes.Structure):
    """``struct linkpilot_tuner_decision`` (nccl-tuner/src/adopt.rs)."""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("algo", ctypes.c_uint8),
        ("proto", ctypes.c_uint8),
        ("max_channels", ctypes.c_uint8),
        ("state_index", ctypes.c_uint8),
        ("min_bytes", ctypes.c_uint64),
        ("chunk_bytes", ctypes.c_uint64),
        ("step", ctypes.c_uint64),
    ]


assert ctypes.sizeof(_Decision) == 32

#: linkpilot_tuner_adopt's refusals.
_REFUSED = {-1: "the plugin's decision layout differs (another release)",
            -2: "a field out of range"}


def plugin_path(value: str | None = None) -> str | None:
    """What ``dlopen`` should open for ``NCCL_TUNER_PLUGIN`` (default: the environment's), as
    NCCL resolves it: a path as given, a name ``N`` as ``libnccl-tuner-N.so``; ``None`` when
    NCCL loads no plugin this way (unset, empty, ``none``)."""
    value = os.environ.get("NCCL_TUNER_PLUGIN") if value is None else value
    if not value or value.lower() == "none":
        return None
    if "/" in value or value.endswith(".so"):
        return value
    return f"libnccl-tuner-{value}.so"


class TunerGate:
    """The gate of the linkpilot plugin at ``path`` (a path or a library name for ``dlopen``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise TunerError(f"NCCL tuner plugin {path}: cannot be loaded: {e}") from None
        try:
            self._adopt = lib.linkpilot_tuner_adopt
        except AttributeError:
            raise TunerError(
                f"NCCL tuner plugin {path}: no linkpilot_tuner_adopt (not linkpilot's plugin, or "
                "a release before the gate)"
            ) from None
        self._adopt.argtypes = [ctypes.POINTER(_Decision)]
        self._adopt.restype = ctypes.c_int
        self._lib = lib

    @classmethod
    def from_env(cls) -> TunerGate | None:
        """The gate of the plugin ``NCCL_TUNER_PLUGIN`` names, or ``None`` when it names none.
        A plugin that cannot be loaded here cannot be loaded by NCCL either: that is logged as
        a warning (NCCL would run without it silently) and ``None`` returned."""
        path = plugin_path()
        if path is None:
            return None
        try:
            return cls(path)
        except TunerError as e:
            log.warning("%s; NCCL will make its own choices (`python -m linkpilot tuner` says "
                        "more)", e)
            return None

    def usable(self) -> bool:
        """Whether the plugin takes this package's decisions (a plugin of another release has
        another layout and refuses them): tried with a rule that asks nothing, then withdrawn.
        Call it on every rank before training; a rank without a usable gate proposes no rule."""
        try:
            self.adopt(TunerRule(), 0)
            self.adopt(None, 0)
        except TunerError as e:
            log.warning("%s; NCCL will make its own choices on every rank", e)
            return False
        return True

    def adopt(self, rule: TunerRule | None, step: int) -> None:
        """Adopts ``rule`` from ``step`` on for every communicator of this process; ``None``
        withdraws (NCCL's own choices). Call it on every rank with the same arguments, at a
        step boundary, before the step's first collective, on the thread that issues them."""
        if rule is None:
            rc = self._adopt(None)
        else:
            d = _Decision(ctypes.sizeof(_Decision), rule.algo, rule.proto, rule.max_channels,
                          min(rule.state_index, 255), rule.min_bytes, rule.chunk_bytes, step)
            rc = self._adopt(ctypes.byref(d))
        if rc != 0:
            raise TunerError(f"NCCL tuner plugin {self.path} refused {rule}: "
                             f"{_REFUSED.get(rc, f'error {rc}')}")


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Whether the NCCL tuner plugin can work in this process (``python -m linkpilot tuner``)."""

    #: NCCL_TUNER_PLUGIN as set, and what dlopen is given for it (None: NCCL loads none).
    setting: str | None
    library: str | None
    #: None when the library loads here; else the loader's words (a missing file, a newer
    #: glibc than this system's: NCCL then runs without the plugin and says nothing).
    load_error: str | None
    #: Whether it is linkpilot's plugin with the gate the training code calls.
    has_gate: bool
    #: This system's glibc, and the newest glibc symbol version the library names.
    glibc: str
    needs_glibc: str | None
    #: With a pid: whether that process has the library mapped (None: not asked, or unknown).
    loaded_in_pid: bool | None = None
    #: Where the setting came from: an env file's path (the daemon's, which
    #: ``linkpilot.init_process_group`` loads), "environment", "argument", or None (nowhere).
    source: str | None = None

    @property
    def ok(self) -> bool:
        return (self.library is not None and self.load_error is None and self.has_gate
                and self.loaded_in_pid is not False)


def _glibc_needed(path: str) -> str | None:
    """The newest ``GLIBC_2.N`` version string in the file (its dynamic section names each
    version it needs)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    versions = set()
    at = data.find(b"GLIBC_2.")
    while at >= 0:
        end = at + 8
        while end < len(data) and (data[end:end + 1].isdigit() or data[end:end + 1] == b"."):
            end += 1
        versions.add(data[at + 6:end].decode().rstrip("."))
        at = data.find(b"GLIBC_2.", end)
    return max(versions, key=lambda v: tuple(int(p) for p in v.split(".") if p), default=None)


def _mapped_by(pid: int, library: str) -> bool | None:
    try:
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
    except OSError:
        return None
    name = os.path.basename(library)
    return any(line.rstrip().endswith(("/" + name, library)) for line in maps.splitlines())


def _setting_and_source() -> tuple[str | None, str | None]:
    """NCCL_TUNER_PLUGIN as a job that loads the daemon's env file has it
    (``linkpilot.init_process_group``, whose file replaces the job's own values): the env
    file's (``LINKPILOT_ENV_FILE``, else /run/linkpilot/nccl.env), else the environment's."""
    from linkpilot.envfile import DEFAULT_PATH, EnvFileError, parse_env

    path = os.environ.get("LINKPILOT_ENV_FILE") or DEFAULT_PATH
    try:
        with open(path, encoding="utf-8") as f:
            found = parse_env(f.read(), path).get("NCCL_TUNER_PLUGIN")
    except (OSError, UnicodeDecodeError, EnvFileError):
        found = None
    if found is not None:
        return found, path
    if "NCCL_TUNER_PLUGIN" in os.environ:
        return os.environ["NCCL_TUNER_PLUGIN"], "environment"
    return None, None


def diagnose(setting: str | None = None, pid: int | None = None) -> Diagnosis:
    """Checks the plugin ``NCCL_TUNER_PLUGIN`` (or ``setting``) names, as NCCL would load it: the
    one the daemon's env file sets, else the environment's."""
    source: str | None = "argument"
    if setting is None:
        setting, source = _setting_and_source()
    library = plugin_path(setting or "")
    glibc = (os.confstr("CS_GNU_LIBC_VERSION") or "unknown").removeprefix("glibc ")
    if library is None:
        return Diagnosis(setting, None, "NCCL_TUNER_PLUGIN names no plugin", False, glibc, None,
                         source=source)
    error, gate = None, False
    try:
        gate = hasattr(ctypes.CDLL(library), "linkpilot_tuner_adopt")
    except OSError as e:
        error = str(e)
    on_disk = library if os.path.isfile(library) else None
    loaded = _mapped_by(pid, library) if pid is not None else None
    return Diagnosis(setting, library, error, gate, glibc,
                     _glibc_needed(on_disk) if on_disk else None, loaded, source)
