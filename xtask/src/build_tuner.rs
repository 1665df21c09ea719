//! `cargo xtask build-tuner`: the NCCL tuner plugin as shipped, built against glibc 2.28 (RHEL 8;
//! every newer distribution loads it too) with cargo-zigbuild, whose zig links against that
//! glibc's symbol versions. Built on this machine's glibc it would need GLIBC_2.34 (pthread
//! symbols moved into libc then), and where NCCL cannot load a plugin it runs without it,
//! saying nothing. The highest GLIBC version it names is checked here, from its dynamic symbols.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};

use crate::run::{output, status, workspace_root};

/// The oldest glibc the shipped plugin loads on.
pub const GLIBC: (u32, u32) = (2, 28);
const TARGET: &str = "x86_64-unknown-linux-gnu";

/// Where the shipped plugin lands, under the name NCCL looks for (`NCCL_TUNER_PLUGIN=linkpilot`).
pub fn shipped() -> PathBuf {
    workspace_root().join("target/nccl-tuner/libnccl-tuner-linkpilot.so")
}

/// Builds it, checks its glibc needs, and returns its path.
pub fn build() -> anyhow::Result<PathBuf> {
    let mut cmd = zigbuild()?;
    cmd.args(["-p", "linkpilot-nccl-tuner"]);
    status("cargo zigbuild (the tuner plugin for glibc 2.28)", &mut cmd)?;
    let out = shipped();
    ship("libnccl_tuner_linkpilot.so", &out)?;
    Ok(out)
}

/// One target directory for everything built for glibc 2.28 (the plugin and the portable daemon).
fn glibc_target_dir() -> PathBuf {
    workspace_root().join(format!("target/glibc-{}.{}", GLIBC.0, GLIBC.1))
}

/// `cargo zigbuild --release` for [`GLIBC`] with the setup's zig on PATH; the caller adds what
/// it builds.
pub fn zigbuild() -> anyhow::Result<Command> {
    let path = crate::python::path_with_tools(&[crate::python::zig_dir()?]);
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["zigbuild", "--release", "--target"])
        .arg(format!("{TARGET}.{}.{}", GLIBC.0, GLIBC.1))
        .arg("--target-dir")
        .arg(glibc_target_dir())
        .env("PATH", path);
    Ok(cmd)
}

/// Copies `file`, as [`zigbuild`] left it, to `out` and checks its glibc needs.
pub fn ship(file: &str, out: &Path) -> anyhow::Result<()> {
    let built = glibc_target_dir().join(TARGET).join("release").join(file);
    fs::create_dir_all(out.parent().context("a parent")?)?;
    fs::copy(&built, out).with_context(|| format!("copying {}", built.display()))?;
    check_glibc(out)
}

/// Fails unless the newest glibc symbol version `binary` names (`objdump -T`) is at most
/// [`GLIBC`]: what every shipped binary is built for.
pub fn check_glibc(binary: &Path) -> anyhow::Result<()> {
    let symbols = output(Command::new("objdump").arg("-T").arg(binary))
        .with_context(|| format!("objdump -T {} failed", binary.display()))?;
    match highest_glibc(&symbols) {
        Some(v) if v <= GLIBC => Ok(()),
        Some(v) => bail!(
            "{} needs GLIBC_{}.{}, newer than the {}.{} it is built for",
            binary.display(),
            v.0,
            v.1,
            GLIBC.0,
            GLIBC.1
        ),
        None => bail!("objdump -T {}: no GLIBC symbol versions", binary.display()),
    }
}

/// The highest `GLIBC_x.y` version in `objdump -T` output.
pub fn highest_glibc(objdump: &str) -> Option<(u32, u32)> {
    objdump
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let mut parts = v.split('.');
            Some((parts.next()?.parse().ok()?, parts.next().unwrap_or("0").parse().ok()?))
        })
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_highest_glibc_version_is_read_from_objdump() {
        let out = "0000 w   DF *UND*  0000 (GLIBC_2.30) gettid\n\
                   0000     DF *UND*  0000 (GLIBC_2.34) pthread_create\n\
                   0000     DF *UND*  0000  GLIBC_2.2.5 memcpy\n\
                   0000     DF *UND*  0000 (GLIBC_PRIVATE) _dl_x\n";
        assert_eq!(highest_glibc(out), Some((2, 34)));
        assert_eq!(highest_glibc("(GLIBC_2.28) a\n(GLIBC_2.3) b"), Some((2, 28)));
        assert_eq!(highest_glibc("nothing"), None);
    }
}
