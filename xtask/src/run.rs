//! Running commands with their failure named.

use std::{
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::{bail, Context as _};

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(PathBuf::from).unwrap_or(here)
}

/// Runs `cmd` in the workspace root, inheriting stdio; an error names `step` and the command.
pub fn status(step: &str, cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("{step}: could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{step}: {cmd:?} failed ({status})");
    }
    Ok(())
}

/// Runs `cmd` quietly and reports whether it succeeded (a probe, not a step).
pub fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// Runs `cmd` and returns its stdout, or `None` if it could not run or failed.
pub fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.stderr(Stdio::null()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}
