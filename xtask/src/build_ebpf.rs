//! `cargo xtask build-ebpf`, and building with cargo in general: the controller's build script
//! builds the eBPF object (one build path); what a build made, the object and the executables,
//! is read from cargo's JSON messages (`cargo_metadata::Message`).

use std::{
    collections::BTreeMap,
    io::BufReader,
    path::PathBuf,
    process::{Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
};

use anyhow::{bail, Context as _};
use cargo_metadata::{Message, TargetKind};

use crate::run::workspace_root;

/// Set to an eBPF object built earlier in the same run, the controller's build script embeds
/// that object instead of building it again (controller/build.rs).
pub const PREBUILT: &str = "LINKPILOT_EBPF_OBJECT";

/// What one `cargo build` made.
#[derive(Debug, Default)]
pub struct Built {
    /// The eBPF object the controller embeds, if the controller was built.
    pub ebpf_object: Option<PathBuf>,
    /// Executables of binary targets (not test harnesses), by target name.
    pub bins: BTreeMap<String, PathBuf>,
}

impl Built {
    /// The executable of the binary target `name`; an error if the build made none.
    pub fn bin(&self, name: &str) -> anyhow::Result<PathBuf> {
        self.bins.get(name).cloned().with_context(|| format!("the build made no `{name}` binary"))
    }
}

/// Runs `cargo build ARGS` in the workspace root (diagnostics rendered on stderr as usual) and
/// returns what it made; `env` is set for cargo and so for the build scripts.
pub fn cargo_build(args: &[&str], env: &[(&str, PathBuf)]) -> anyhow::Result<Built> {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.arg("build").args(args);
    run_build(cmd, args, env)
}

fn run_build(mut cmd: Command, args: &[&str], env: &[(&str, PathBuf)]) -> anyhow::Result<Built> {
    cmd.arg("--message-format=json-render-diagnostics");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .current_dir(workspace_root())
        .stdout(Stdio::piped())
        .spawn()
        .context("could not start cargo")?;
    let stdout = child.stdout.take().context("no stdout from cargo")?;
    let mut built = Built::default();
    for message in Message::parse_stream(BufReader::new(stdout)) {
        match message.context("reading cargo's messages")? {
            // Path packages have ids like "path+file:///…/controller#linkpilot@0.1.0".
            Message::BuildScriptExecuted(s) if s.package_id.repr.contains("#linkpilot@") => {
                built.ebpf_object = Some(s.out_dir.join("linkpilot").into_std_path_buf());
            }
            Message::CompilerArtifact(a)
                if a.target.kind.contains(&TargetKind::Bin) && !a.profile.test =>
            {
                if let Some(exe) = a.executable {
                    built.bins.insert(a.target.name.clone(), exe.into_std_path_buf());
                }
            }
            _ => {}
        }
    }
    let status = child.wait().context("waiting for cargo")?;
    if !status.success() {
        bail!(
            "`cargo build {}` failed ({status}); run `cargo xtask setup` if a tool is missing",
            args.join(" ")
        );
    }
    if let Some(object) = &built.ebpf_object {
        if !object.is_file() {
            bail!("expected the eBPF object at {}, but it is not there", object.display());
        }
    }
    Ok(built)
}

/// Builds the `linkpilot` package and returns the path of the embedded eBPF object.
pub fn build(release: bool) -> anyhow::Result<PathBuf> {
    let mut args = vec!["--package", "linkpilot"];
    if release {
        args.push("--release");
    }
    cargo_build(&args, &[])
        .context("build-ebpf")?
        .ebpf_object
        .context("build-ebpf: cargo did not report the controller's build script")
}

/// Set once `cargo xtask test` has built every target: the tools it then runs (soak, benchmarks,
/// demo) use that build instead of starting builds whose other package selection would make
/// cargo compile the controller again with other features.
static WORKSPACE_BUILT: AtomicBool = AtomicBool::new(false);
static RELEASE_BUILT: AtomicBool = AtomicBool::new(false);

pub fn mark_workspace_built() {
    WORKSPACE_BUILT.store(true, Ordering::Relaxed);
}

/// The debug `linkpilot` and `linkpilot-lab` (`lab::bin` finds them), unless already built.
pub fn debug_binaries() -> anyhow::Result<()> {
    if WORKSPACE_BUILT.load(Ordering::Relaxed) {
        return Ok(());
    }
    cargo_build(&["--package", "linkpilot", "--package", "linkpilot-lab"], &[]).map(drop)
}

const RELEASE_DAEMON: &[&str] = &["--release", "--package", "linkpilot", "--bin", "linkpilot"];

/// The release `linkpilot` daemon, unless already built in this process (the portable one,
/// where this process built that: `cargo xtask test`).
pub fn release_daemon() -> anyhow::Result<PathBuf> {
    if let Some(portable) = crate::build_portable::built_in_this_run() {
        return Ok(portable);
    }
    if RELEASE_BUILT.load(Ordering::Relaxed) {
        return Ok(workspace_root().join("target/release/linkpilot"));
    }
    let built = cargo_build(RELEASE_DAEMON, &[])?;
    RELEASE_BUILT.store(true, Ordering::Relaxed);
    built.bin("linkpilot")
}
