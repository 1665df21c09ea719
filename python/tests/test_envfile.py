"""linkpilot.envfile against the daemon's own env file, and a real single-rank gloo group."""

from __future__ import annotations

import datetime
import importlib.util
import json
import logging
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, linkpilot_bin

from linkpilot.envfile import EnvFileError, EnvFileMissing, init_process_group, load_env_file


@pytest.fixture
def daemon_env_file(tmp_path: Path) -> Path:
    """What the daemon writes for the reference policy's start (`linkpilot env --policy`)."""
    text = subprocess.run(
        [linkpilot_bin(), "env", "--policy", str(REPO / "policies" / "hk-us.toml")],
        check=True, capture_output=True, text=True,
    ).stdout
    path = tmp_path / "nccl.env"
    path.write_text(text)
    return path


def test_the_daemons_file_loads(daemon_env_file: Path, caplog: pytest.LogCaptureFixture
                                ) -> None:
    environ = {"NCCL_IB_TIMEOUT": "18", "NCCL_IB_TC": "106", "UNRELATED": "x"}
    got = load_env_file(daemon_env_file, environ=environ)
    # A value the job set itself and the file changes is named; an equal one is not.
    assert [r.getMessage() for r in caplog.records] == [
        f"{daemon_env_file}: NCCL_IB_TIMEOUT=22 replaces the job's 18"]
    caplog.clear()
    assert got == {
        "NCCL_IB_TIMEOUT": "22", "NCCL_IB_RETRY_CNT": "7", "NCCL_IB_TC": "106",
        "NCCL_BUFFSIZE": "8388608", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "LINKPILOT_COLLECTIVE_TIMEOUT_S": "600", "LINKPILOT_COMPRESSION": "int8",
        "LINKPILOT_LINK": "hk-us", "LINKPILOT_STATE": "healthy", "LINKPILOT_DECISION_ID": "1",
    }
    assert environ == {**got, "UNRELATED": "x"}
    kept = {"NCCL_IB_TIMEOUT": "18"}
    load_env_file(daemon_env_file, environ=kept, override=False)
    assert kept["NCCL_IB_TIMEOUT"] == "18" and kept["NCCL_IB_TC"] == "106"
    assert [r.getMessage() for r in caplog.records] == [
        f"{daemon_env_file}: the job's NCCL_IB_TIMEOUT=18 kept (the daemon's: 22)"]


def test_the_rust_parsers_rules(tmp_path: Path) -> None:
    path = tmp_path / "env"
    # Trimmed lines, indented comments, CRLF, '=' in values, the last of a repeated key.
    path.write_bytes(b"  # c\r\n\n\tA=1 \r\nB==x=y\n   # d\nA=2\nC=\n\xe2\x80\x83D=sp\xc2\xa0\n")
    assert load_env_file(path, environ={}) == {"A": "2", "B": "=x=y", "C": "", "D": "sp"}


@pytest.mark.parametrize(
    "line, words",
    [
        ("NCCL_X", "not KEY=value: 'NCCL_X'"),
        ("export A=1", "'export A' is not an environment variable name"),
        ("A =1", "'A ' is not an environment variable name"),
        ("1A=1", "'1A' is not an environment variable name"),
        ("=1", "'' is not an environment variable name"),
    ],
)
def test_a_garbage_line_names_file_and_line_and_applies_nothing(
    tmp_path: Path, line: str, words: str
) -> None:
    path = tmp_path / "nccl.env"
    path.write_text(f"# header\nNCCL_IB_TIMEOUT=22\n{line}\nNCCL_IB_TC=106\n")
    environ: dict[str, str] = {}
    with pytest.raises(EnvFileError) as e:
        load_env_file(path, environ=environ)
    assert str(e.value) == f"{path}:3: {words}"
    assert (e.value.path, e.value.line, environ) == (str(path), 3, {})


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(EnvFileMissing, match=f"{tmp_path}/none: no such file"):
        load_env_file(tmp_path / "none", environ={})
    latin = tmp_path / "latin"
    latin.write_bytes(b"A=caf\xe9\n")
    with pytest.raises(EnvFileError, match=f"{latin}: not UTF-8"):
        load_env_file(latin, environ={})


def test_default_path_from_the_environment(daemon_env_file: Path) -> None:
    environ = {"LINKPILOT_ENV_FILE": str(daemon_env_file)}
    assert load_env_file(environ=environ)["LINKPILOT_LINK"] == "hk-us"
    with pytest.raises(EnvFileMissing, match="/run/linkpilot/nccl.env"):
        load_env_file(environ={})


@pytest.fixture
def clean_environ(tmp_path: Path) -> Iterator[None]:
    """Restores os.environ, which init_process_group changes on purpose; no job report unless
    a test makes the directory."""
    from linkpilot import jobreport

    saved = dict(os.environ)
    os.environ["LINKPILOT_JOBS"] = str(tmp_path / "no-jobs")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.pop("LINKPILOT_COLLECTIVE_TIMEOUT_S", None)
    yield
    os.environ.clear()
    os.environ.update(saved)
    if jobreport._unclaimed is not None:
        jobreport._unclaimed.close()
        jobreport._unclaimed = None


def group_timeout() -> datetime.timedelta:
    """The default group's timeout as the backend got it (torch has no public accessor)."""
    import torch
    import torch.distributed as dist

    timeout: datetime.timedelta = (
        dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout  # type: ignore[union-attr]
    )
    dist.destroy_process_group()
    return timeout


@pytest.mark.parametrize(
    "given, want_s",
    [(None, 600), (datetime.timedelta(seconds=1200), 1200), (datetime.timedelta(seconds=30), 600)],
)
def test_init_process_group_applies_the_file_and_the_timeout_floor(
    clean_environ: None, daemon_env_file: Path, given: datetime.timedelta | None, want_s: int
) -> None:
    kwargs: dict[str, Any] = {} if given is None else {"timeout": given}
    init_process_group("gloo", rank=0, world_size=1, env_file=daemon_env_file, **kwargs)
    assert group_timeout() == datetime.timedelta(seconds=want_s)
    assert (os.environ["NCCL_IB_TIMEOUT"], os.environ["NCCL_BUFFSIZE"]) == ("22", "8388608")


def test_a_positional_timeout_is_floored_too(clean_environ: None, daemon_env_file: Path) -> None:
    init_process_group(
        "gloo", None, datetime.timedelta(seconds=5), 1, 0, env_file=daemon_env_file
    )
    assert group_timeout() == datetime.timedelta(seconds=600)


def test_without_a_file(
    clean_environ: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(EnvFileMissing):
        init_process_group("gloo", rank=0, world_size=1, env_file=tmp_path / "no", required=True)
    with caplog.at_level(logging.WARNING, logger="linkpilot"):
        init_process_group("gloo", rank=0, world_size=1, env_file=tmp_path / "no",
                           timeout=datetime.timedelta(seconds=77))
    assert f"{tmp_path}/no: no such file" in caplog.text
    assert group_timeout() == datetime.timedelta(seconds=77)


def test_a_garbage_file_stops_init(clean_environ: None, tmp_path: Path) -> None:
    path = tmp_path / "nccl.env"
    path.write_text("NCCL_IB_TIMEOUT=22\nnonsense\n")
    os.environ.pop("NCCL_IB_TIMEOUT", None)
    with pytest.raises(EnvFileError, match=":2: not KEY=value"):
        init_process_group("gloo", rank=0, world_size=1, env_file=path)
    import torch.distributed as dist

    assert "NCCL_IB_TIMEOUT" not in os.environ and not dist.is_initialized()


def test_the_job_report_starts_with_the_group_and_the_hook_takes_it_over(
    clean_environ: None, daemon_env_file: Path, tmp_path: Path
) -> None:
    from linkpilot import jobreport

    jobs = tmp_path / "jobs"
    jobs.mkdir()
    os.environ["LINKPILOT_JOBS"] = str(jobs)
    init_process_group("gloo", rank=0, world_size=1, env_file=daemon_env_file)
    group_timeout()  # destroys the group: the report outlives it, as in a job
    (path,) = jobs.iterdir()
    doc = json.loads(path.read_bytes())
    assert (doc["kind"], doc["rank"], doc["world"], doc["steps"]) == ("init", 0, 1, 0)
    hook = jobreport.JobReport.auto(rank=0, world=1, kind="ddp", link="wan")
    assert hook is not None and hook.path == str(path)
    assert (json.loads(path.read_bytes())["kind"], hook.link) == ("ddp", "wan")
    other = jobreport.JobReport.auto(rank=0, world=1, kind="outer")  # taken over once only
    assert other is not None and other.path != hook.path
    hook.close()
    other.close()
    assert list(jobs.iterdir()) == []


def _fuzz_oracle() -> Any:
    """The env-file fuzz target's module (fuzz/python/envfile.py), loaded by path."""
    path = REPO / "fuzz" / "python" / "envfile.py"
    spec = importlib.util.spec_from_file_location("fuzz_envfile", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SEEDS = sorted((REPO / "fuzz" / "seeds" / "envfile").iterdir())


def test_the_fuzz_seeds_exist() -> None:
    assert _SEEDS, "no seeds in fuzz/seeds/envfile"


@pytest.mark.parametrize("seed", _SEEDS, ids=[p.name for p in _SEEDS])
def test_each_fuzz_seed_passes_the_fuzz_targets_oracle(seed: Path) -> None:
    """The fuzz target's oracle on every committed seed (timed fuzzing: `cargo xtask fuzz`)."""
    _fuzz_oracle().one_input(seed.read_bytes())
