//! `cargo xtask build-ebpf`: the controller's build script builds the eBPF object (one build
//! path); this reads where it put it from cargo's JSON messages.

use std::{
    io::BufRead as _,
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::{bail, Context as _};

use crate::run::workspace_root;

/// Builds the `linkpilot` package and returns the path of the embedded eBPF object.
pub fn build(release: bool) -> anyhow::Result<PathBuf> {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "--package", "linkpilot", "--message-format=json-render-diagnostics"]);
    if release {
        cmd.arg("--release");
    }
    let mut child = cmd
        .current_dir(workspace_root())
        .stdout(Stdio::piped())
        .spawn()
        .context("build-ebpf: could not start cargo")?;
    let stdout = child.stdout.take().context("build-ebpf: no stdout from cargo")?;
    let mut out_dir = None;
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.context("build-ebpf: reading cargo's output")?;
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
        // Path packages have ids like "path+file:///…/controller#linkpilot@0.1.0".
        let is_ours = msg["package_id"].as_str().is_some_and(|id| id.contains("#linkpilot@"));
        if msg["reason"] == "build-script-executed" && is_ours {
            out_dir = msg["out_dir"].as_str().map(PathBuf::from);
        }
    }
    let status = child.wait().context("build-ebpf: waiting for cargo")?;
    if !status.success() {
        bail!("build-ebpf: `cargo build -p linkpilot` failed ({status}); run `cargo xtask setup` if a tool is missing");
    }
    let object = out_dir
        .context("build-ebpf: cargo did not report the controller's build script")?
        .join("linkpilot");
    if !object.is_file() {
        bail!("build-ebpf: expected the eBPF object at {}, but it is not there", object.display());
    }
    Ok(object)
}
