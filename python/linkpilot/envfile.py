"""The daemon's NCCL env file (``/run/linkpilot/nccl.env``) and a ``torch.distributed`` init
that applies it. Standard library only; torch is imported inside :func:`init_process_group`.

The syntax is exactly what the daemon's own parser (``envfile::parse`` in
controller/src/actuate/envfile.rs) accepts: lines split at ``\\n``; each line trimmed of Unicode white
space; blank lines and lines starting with ``#`` skipped; every other line split at its first
``=`` into key and value, kept as they are (no quotes, no ``export``). On top of that, keys must
be valid environment names, since they are about to become environment variables.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
from collections.abc import MutableMapping
from typing import Any

DEFAULT_PATH = "/run/linkpilot/nccl.env"
#: Seconds the daemon's watchdog knob allows a collective; the process group's timeout floor.
TIMEOUT_VAR = "LINKPILOT_COLLECTIVE_TIMEOUT_S"

_log = logging.getLogger(__name__)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Rust's str::trim strips Unicode White_Space, which differs from str.strip()'s set.
_WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"


class EnvFileError(Exception):
    """The env file cannot be used; ``str()`` names the file (and line) and says why."""

    def __init__(self, path: str, problem: str, line: int | None = None) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {problem}")
        self.path = path
        self.line = line
        self.problem = problem


class EnvFileMissing(EnvFileError):
    """No file at the path (no daemon has written one)."""


def parse_env(text: str, path: str = "<env file>") -> dict[str, str]:
    """The variables of an env file's text, in file order (a repeated key: the last wins)."""
    out: dict[str, str] = {}
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip(_WS)
        if not line or line.startswith("#"):
            continue
        key, eq, value = line.partition("=")
        if not eq:
            raise EnvFileError(path, f"not KEY=value: {line!r}", number)
        if not _NAME.match(key):
            raise EnvFileError(path, f"{key!r} is not an environment variable name", number)
        out[key] = value
    return out


def load_env_file(
    path: str | os.PathLike[str] | None = None,
    environ: MutableMapping[str, str] = os.environ,
    override: bool = True,
) -> dict[str, str]:
    """Parses the env file at ``path`` (default: ``environ["LINKPILOT_ENV_FILE"]``, else
    /run/linkpilot/nccl.env) and sets its variables in ``environ`` (without ``override``, only
    those not set yet). Nothing is set unless the whole file parses. Returns every variable of
    the file. Raises :class:`EnvFileError` (:class:`EnvFileMissing` for no file)."""
    p = os.fspath(path) if path is not None else environ.get("LINKPILOT_ENV_FILE") or DEFAULT_PATH
    try:
        with open(p, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise EnvFileMissing(p, "no such file (is `linkpilot run` running?)") from None
    except UnicodeDecodeError as e:
        raise EnvFileError(p, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise EnvFileError(p, e.strerror or str(e)) from None
    variables = parse_env(text, p)
    for key, value in variables.items():
        was = environ.get(key)
        if was is not None and was != value:
            # The job set it itself: say which one wins, so a tuned value is not lost silently.
            if override:
                _log.warning("%s: %s=%s replaces the job's %s", p, key, value, was)
            else:
                _log.warning("%s: the job's %s=%s kept (the daemon's: %s)", p, key, was, value)
        if override or was is None:
            environ[key] = value
    return variables


def init_process_group(
    *args: Any,
    env_file: str | os.PathLike[str] | None = None,
    required: bool = False,
    override: bool = True,
    **kwargs: Any,
) -> None:
    """``torch.distributed.init_process_group`` after loading the daemon's env file into
    ``os.environ`` (NCCL reads its variables when communicators are created).

    A variable the job set already is replaced (``override``, the default) or kept, with a
    warning either way when the values differ. A missing file raises :class:`EnvFileMissing`
    if ``required``, else logs a warning; a
    garbage file always raises :class:`EnvFileError`. When ``LINKPILOT_COLLECTIVE_TIMEOUT_S`` is set, the group's
    timeout is at least that many seconds: it is the timeout when none is given, and a given
    one is raised to it, never lowered. Once the group is up, the process's job report starts
    (:meth:`linkpilot.jobreport.JobReport.at_init`), where the daemon's directory exists.
    """
    try:
        load_env_file(env_file, override=override)
    except EnvFileMissing as e:
        if required:
            raise
        _log.warning("%s; initialising without the daemon's settings", e)
    floor = _timeout_floor()
    if floor is not None:
        if len(args) > 2:  # timeout is the third positional parameter
            given = args[2]
            args = (*args[:2], floor if given is None else max(given, floor), *args[3:])
        else:
            given = kwargs.get("timeout")
            kwargs["timeout"] = floor if given is None else max(given, floor)
    import torch.distributed  # lazily: the module is useful without torch

    torch.distributed.init_process_group(*args, **kwargs)
    # The job's connections exist from here on: report the process now, so the daemon counts
    # them as the job's before the hook's first step (the model broadcast, the first buckets).
    from linkpilot.jobreport import JobReport

    JobReport.at_init(rank=torch.distributed.get_rank(),
                      world=torch.distributed.get_world_size())


def _timeout_floor() -> datetime.timedelta | None:
    text = os.environ.get(TIMEOUT_VAR)
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{TIMEOUT_VAR}={text!r} is not a positive number of seconds")
    return datetime.timedelta(seconds=seconds)
