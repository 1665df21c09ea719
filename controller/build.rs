//! Builds the eBPF crate for bpfel-unknown-none (nightly, build-std, bpf-linker) into OUT_DIR, so
//! the controller embeds the object. `cargo xtask build-ebpf` goes through this same path.
//! Without the `native` feature (the fuzz targets) the embedded object is empty.
#[cfg(feature = "native")]
use anyhow::{anyhow, Context as _};

#[cfg(not(feature = "native"))]
fn main() -> anyhow::Result<()> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("linkpilot"), b"")?;
    Ok(())
}

#[cfg(feature = "native")]
fn main() -> anyhow::Result<()> {
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
