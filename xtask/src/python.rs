//! The training side's Python environment: a project-local virtualenv (`.venv`) with torch from
//! PyPI (a CUDA build that runs gloo on CPU), pytest and mypy, kubernetes-validate (the
//! manifests' schema check), and `python/` installed editable.

use std::{path::PathBuf, process::Command};

use crate::run::{status, succeeds, workspace_root};

/// The tested torch; the package itself asks for torch >= 2.3 (python/pyproject.toml).
const TORCH: &str = "torch==2.15.0";
/// numpy only quiets torch's warning at import; pytest and mypy run the checks;
/// kubernetes-validate checks deploy/k8s against the Kubernetes schemas offline (1.37.0
/// carries the schemas of Kubernetes 1.37, which controller/tests/deploy.rs names); atheris
/// fuzzes the env-file loader (`cargo xtask fuzz`, a cp311 manylinux wheel).
/// ziglang is the zig that cargo-zigbuild links the shipped NCCL tuner plugin with (against
/// glibc 2.28: `cargo xtask build-tuner`).
const TOOLS: &[&str] = &[
    "numpy",
    "pytest>=8",
    "mypy>=1.10",
    "kubernetes-validate==1.37.0",
    "atheris==3.0.0",
    "ziglang==0.15.2",
];

pub fn venv() -> PathBuf {
    workspace_root().join(".venv")
}

pub fn python() -> PathBuf {
    venv().join("bin/python")
}

/// Creates the virtualenv and installs what is missing (seconds when everything is there).
pub fn setup() -> anyhow::Result<()> {
    let ready = python().exists()
        && succeeds(Command::new(python()).args([
            "-c",
            "import torch, numpy, pytest, mypy, kubernetes_validate, atheris, ziglang, \
             linkpilot.board",
        ]));
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

/// mypy --strict on the package, then pytest (`linkpilot` is the binary the tests feed boards
/// with, `tuner` the NCCL tuner plugin they load).
pub fn test(linkpilot: &std::path::Path, tuner: &std::path::Path) -> anyhow::Result<()> {
    status(
        "mypy (python/)",
        Command::new(python()).args([
            "-m",
            "mypy",
            "--config-file",
            "python/pyproject.toml",
            "python/linkpilot",
        ]),
    )?;
    status(
        "pytest (python/)",
        Command::new(python())
            .args(["-m", "pytest", "-q", "python/tests"])
            .env("LINKPILOT_BIN", linkpilot)
            .env("LINKPILOT_TUNER_PLUGIN", tuner),
    )
}
