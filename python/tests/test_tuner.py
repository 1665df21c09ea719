"""linkpilot.tuner (the NCCL tuner plugin's gate and its load check) and the agreement on the
plugin's rule that the DDP hook's proposals carry. The plugin is the repository's debug build or
$LINKPILOT_TUNER_PLUGIN."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_tuner_ranks import plugin

from linkpilot.ddp import Proposal, agree
from linkpilot.tuner import TunerError, TunerGate, TunerRule, diagnose, plugin_path

CONGESTED = TunerRule(algo=0, proto=2, max_channels=4, state_index=1, min_bytes=1 << 20,
                      chunk_bytes=2 << 20)
SEVERE = TunerRule(algo=1, proto=0, max_channels=2, state_index=2, min_bytes=1 << 20,
                   chunk_bytes=1 << 20)


def test_the_plugin_is_found_as_nccl_finds_it() -> None:
    assert plugin_path("") is None and plugin_path("none") is None and plugin_path("NONE") is None
    assert plugin_path("linkpilot") == "libnccl-tuner-linkpilot.so"
    assert plugin_path("/opt/lp/libnccl-tuner-linkpilot.so") == "/opt/lp/libnccl-tuner-linkpilot.so"


def test_the_gate_takes_decisions_and_refuses_bad_ones() -> None:
    gate = TunerGate(plugin())
    gate.adopt(CONGESTED, step=3)
    gate.adopt(None, step=4)
    with pytest.raises(TunerError, match="a field out of range"):
        gate.adopt(TunerRule(algo=9), step=5)
    with pytest.raises(TunerError, match="no linkpilot_tuner_adopt"):
        TunerGate("libc.so.6")
    with pytest.raises(TunerError, match="cannot be loaded"):
        TunerGate("/nonexistent/libnccl-tuner-linkpilot.so")


def test_proposals_carry_the_rule_exactly_and_ranks_agree_on_the_worst_states() -> None:
    for p in (Proposal("int8", 600, True, CONGESTED), Proposal("topk:0.01", 1800, True, SEVERE),
              Proposal("none"), Proposal("int4", 3000, True, TunerRule())):
        digits = p.encode()
        assert len(digits) == 16 and all(0 <= d <= 255 for d in digits), digits
        assert Proposal.decode(digits) == p
    # A chunk the daemon derived (not a KiB multiple) travels rounded down to KiB, on every rank.
    odd = TunerRule(chunk_bytes=(2 << 20) + 700, state_index=1)
    assert Proposal.decode(Proposal("int8", 0, True, odd).encode()).tuner == TunerRule(
        chunk_bytes=2 << 20, state_index=1)
    a, b, c = (Proposal("int8", 600, True, CONGESTED), Proposal("int4", 900, True, SEVERE),
               Proposal("int8", 600, True, TunerRule(state_index=2)))
    assert agree([a, b, c]) == Proposal("int4", 900, True, SEVERE)  # first of the worst
    assert agree([c, b]).tuner == TunerRule(state_index=2)
    assert agree([a, Proposal("none")]).tuner is None  # a stale board: NCCL's own everywhere


def test_a_load_check_says_why_nccl_would_run_without_it(tmp_path: Path) -> None:
    so = plugin()
    ctypes.CDLL(so)  # loaded in this process, as NCCL would
    d = diagnose(so, pid=os.getpid())
    assert (d.ok, d.load_error, d.has_gate, d.loaded_in_pid) == (True, None, True, True)
    assert d.needs_glibc is not None and d.needs_glibc.startswith("2.")
    garbage = tmp_path / "libnccl-tuner-broken.so"
    garbage.write_bytes(b"not an ELF file")
    d = diagnose(str(garbage), pid=os.getpid())
    assert not d.ok and d.load_error and d.loaded_in_pid is False
    # No env file: a daemon's on this host would name the plugin in place of the environment.
    env = dict(os.environ, NCCL_TUNER_PLUGIN=str(garbage),
               LINKPILOT_ENV_FILE=str(tmp_path / "no-env-file"))
    out = subprocess.run([sys.executable, "-m", "linkpilot", "tuner"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "NOT LOADABLE here" in out.stdout, out.stdout
    env["NCCL_TUNER_PLUGIN"] = so
    out = subprocess.run([sys.executable, "-m", "linkpilot", "tuner"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "linkpilot's plugin, with the gate" in out.stdout, out.stdout


def test_the_check_reads_the_plugin_the_daemons_env_file_names(tmp_path: Path) -> None:
    """A job that loads the env file gets NCCL_TUNER_PLUGIN from it: so does the check."""
    so = plugin()
    env_file = tmp_path / "nccl.env"
    env_file.write_text(f"NCCL_BUFFSIZE=33554432\nNCCL_TUNER_PLUGIN={so}\n")
    env = {k: v for k, v in os.environ.items() if k != "NCCL_TUNER_PLUGIN"}
    env["LINKPILOT_ENV_FILE"] = str(env_file)
    run = lambda: subprocess.run([sys.executable, "-m", "linkpilot", "tuner"], env=env,  # noqa: E731
                                 capture_output=True, text=True, timeout=60)
    out = run()
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"(from {env_file}, which linkpilot.init_process_group loads)" in out.stdout, out.stdout
    # The env file's wins over the environment's, as init_process_group makes it win.
    env["NCCL_TUNER_PLUGIN"] = "none"
    out = run()
    assert out.returncode == 0 and f"(from {env_file}" in out.stdout, out.stdout
    # Without it in the file, the environment's.
    env_file.write_text("NCCL_BUFFSIZE=33554432\n")
    out = run()
    assert out.returncode == 1 and "NCCL loads no tuner plugin" in out.stdout, out.stdout
    # Neither: said so.
    del env["NCCL_TUNER_PLUGIN"]
    out = run()
    assert out.returncode == 1 and "set nowhere" in out.stdout, out.stdout
