//! Builds the eBPF crate for bpfel-unknown-none (nightly, build-std, bpf-linker) into OUT_DIR, so
//! the controller embeds the object. `cargo xtask build-ebpf` goes through this same path.
//! Without the `ebpf` feature (the fuzz targets) the embedded object is empty. With
//! `LINKPILOT_EBPF_OBJECT` set (by `cargo xtask test`, to an object an earlier build of the same
//! run made) that object is embedded instead of building it again for another profile.
#[cfg(feature = "ebpf")]
use anyhow::{anyhow, Context as _};

#[cfg(not(feature = "ebpf"))]
fn main() -> anyhow::Result<()> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("linkpilot"), b"")?;
    Ok(())
}

#[cfg(feature = "ebpf")]
fn main() -> anyhow::Result<()> {
    println!("cargo::rerun-if-env-changed=LINKPILOT_EBPF_OBJECT");
    if let Some(object) = std::env::var_os("LINKPILOT_EBPF_OBJECT") {
        let object = std::path::PathBuf::from(object);
        println!("cargo::rerun-if-changed={}", object.display());
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("linkpilot");
        std::fs::copy(&object, &out).with_context(|| {
            format!("copying the eBPF object LINKPILOT_EBPF_OBJECT={}", object.display())
        })?;
        return Ok(());
    }
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("reading the workspace metadata")?;
    let ebpf = metadata
        .packages
        .iter()
        .find(|p| p.name.as_str() == "linkpilot-ebpf")
        .ok_or_else(|| anyhow!("the linkpilot-ebpf package is missing from the workspace"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent directory", ebpf.manifest_path))?;
    // aya-build watches the eBPF crate's directory; the shared types it compiles in live in
    // common/, which must trigger a rebuild of the object too.
    if let Some(common) = metadata.packages.iter().find(|p| p.name.as_str() == "linkpilot-common") {
        if let Some(dir) = common.manifest_path.parent() {
            println!("cargo::rerun-if-changed={dir}");
        }
    }
    let package = aya_build::Package {
        name: ebpf.name.as_str(),
        root_dir: root_dir.as_str(),
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::default())
        .context("building the eBPF programs (run `cargo xtask setup` if a tool is missing)")
}
