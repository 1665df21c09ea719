//! `cargo xtask build-portable`: the daemon for glibc 2.28 userlands (RHEL 8, Ubuntu 20.04 and
//! newer), linked as the tuner plugin is (cargo-zigbuild against glibc 2.28), without libibverbs
//! (the `verbs` feature: only `linkpilot rdma`'s device list uses it; the daemon reads RDMA
//! ports from sysfs and netlink), so it needs nothing beyond the C library. Checked after the
//! build: the newest glibc symbol version it names, and the libraries it loads.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use anyhow::{bail, Context as _};

use crate::{
    build_tuner::{ship, zigbuild},
    run::{output, status, workspace_root},
};

/// What a glibc 2.28 system has without packages: the C library's own parts.
const LIBC_ONLY: &[&str] = &[
    "libc.so.6",
    "libm.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "ld-linux-x86-64.so.2",
];

pub fn shipped() -> PathBuf {
    workspace_root().join("target/portable/linkpilot")
}

pub fn build() -> anyhow::Result<PathBuf> {
    build_with(&[], None)
}

/// The portable daemon once built in this process (by [`in_background`]).
static BUILT: OnceLock<PathBuf> = OnceLock::new();

/// The portable daemon if this process built it: `cargo xtask test` builds it as the release
/// daemon its soak runs.
pub fn built_in_this_run() -> Option<PathBuf> {
    BUILT.get().cloned()
}

/// Builds it beside other steps (its own thread waits for it), with `env` for the build and
/// its diagnostics written to `log`; [`built_in_this_run`] then names it.
pub fn in_background(
    env: Vec<(&'static str, PathBuf)>,
    log: PathBuf,
) -> std::thread::JoinHandle<anyhow::Result<PathBuf>> {
    std::thread::spawn(move || {
        let out = build_with(&env, Some(&log))
            .with_context(|| format!("its output is in {}", log.display()))?;
        let _ = BUILT.set(out.clone());
        Ok(out)
    })
}

/// Builds it with `env` set (diagnostics to `log` if given) and checks it.
fn build_with(env: &[(&str, PathBuf)], log: Option<&Path>) -> anyhow::Result<PathBuf> {
    // At full priority even in the background: the lab tests beside it judge a daemon's start
    // by the daemon's own time, not the wall clock (tests/src/daemon.rs), so a busy CPU slows
    // them without failing them, and a build that ends early lets the soak's day run beside
    // pytest instead of after it.
    let mut cmd = zigbuild()?;
    cmd.args(["-p", "linkpilot", "--bin", "linkpilot"]).args([
        "--no-default-features",
        "--features",
        "ebpf",
    ]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    if let Some(log) = log {
        let file = fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        cmd.stderr(file);
    }
    status("cargo zigbuild (the daemon for glibc 2.28)", &mut cmd)?;
    let out = shipped();
    ship("linkpilot", &out)?;
    let headers = output(Command::new("objdump").arg("-p").arg(&out))
        .with_context(|| format!("objdump -p {} failed", out.display()))?;
    let others = other_libraries(&headers);
    if !others.is_empty() {
        bail!("{} loads {} beside the C library", out.display(), others.join(", "));
    }
    Ok(out)
}

/// The NEEDED libraries of `objdump -p` that are not the C library's.
fn other_libraries(headers: &str) -> Vec<String> {
    headers
        .lines()
        .filter_map(|l| l.trim().strip_prefix("NEEDED")?.split_whitespace().next())
        .filter(|lib| !LIBC_ONLY.contains(lib))
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libraries_beside_the_c_library_are_named() {
        let headers = "Dynamic Section:\n  NEEDED               libm.so.6\n  \
                       NEEDED               libibverbs.so.1\n  NEEDED               libc.so.6\n  \
                       SONAME               x\n";
        assert_eq!(other_libraries(headers), ["libibverbs.so.1"]);
        assert!(other_libraries("  NEEDED  libc.so.6\n  NEEDED  libdl.so.2\n").is_empty());
    }
}
