//! `cargo xtask setup`: installs what a fresh machine lacks. Every step checks first, so a
//! machine that has everything is done in seconds; a failing step is named in the error.

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    process::Command,
    sync::atomic::{AtomicBool, Ordering},
    thread::JoinHandle,
};

use anyhow::{bail, Context as _};

use crate::run::{output, status, succeeds};

/// Debian packages the build and the tests use, and why.
const DEBIAN_PACKAGES: &[(&str, &str)] = &[
    ("llvm-22-dev", "bpf-linker links against LLVM 22, the LLVM of the nightly toolchain"),
    ("iproute2", "ip, tc, ss and nstat for the test namespaces and as oracles"),
    ("iputils-ping", "ping, an RTT oracle"),
    ("iperf3", "a throughput oracle"),
    ("curl", "scrapes the daemon's metrics in tests, as Prometheus would"),
    ("tcpdump", "a packet oracle"),
    ("tshark", "a packet oracle"),
    ("bpftool", "lists attached programs, an oracle for detach"),
    ("ethtool", "offload settings in tests"),
    ("nftables", "loss and drop injection in tests"),
    ("python3-scapy", "crafting packets in tests"),
    ("python3-venv", "the training side's virtualenv (torch, pytest, mypy)"),
    ("util-linux", "setpriv and unshare for privilege and mount tests"),
    ("systemd", "systemd-analyze: the unit's exposure score and its syscall groups, offline"),
    ("strace", "the syscalls the daemon makes, checked against the unit's filter"),
    ("cmake", "the ibverbs crate builds rdma-core"),
    ("gcc", "builds the NCCL tuner plugin's C test harness (nm comes with it, via binutils)"),
    ("pkg-config", "the ibverbs crate's build"),
    ("libnl-3-dev", "the ibverbs crate's build"),
    ("libnl-route-3-dev", "the ibverbs crate's build"),
    ("libibverbs-dev", "the ibverbs crate's build"),
    ("libclang-dev", "bindgen for the ibverbs crate (LLVM 14's libclang)"),
    ("buildah", "builds deploy/Containerfile's runtime-prebuilt stage in a test, runs the image"),
    ("debootstrap", "that build's Debian 12 base, made from Debian's archive (no image registry)"),
    (
        "prometheus",
        "a real Prometheus server scrapes the daemon in tests; promtool checks the exposition and \
         the alert rules (installed without starting its service: see `NO_SERVICE_START`)",
    ),
];

/// Debian's policy-rc.d: while it exits 101, package scripts start no services (invoke-rc.d and
/// deb-systemd-invoke both ask it). The `prometheus` package would otherwise start a server on
/// :9090 (through its init script where systemd is not PID 1) that the tests do not want.
const POLICY_RC_D: &str = "/usr/sbin/policy-rc.d";
const NO_SERVICE_START: &str =
    "#!/bin/sh\n# Written by `cargo xtask setup` for one apt-get install: start no services.\nexit 101\n";

/// A policy-rc.d that denies service starts while it lives, unless the machine has its own.
struct NoServiceStart(bool);

impl NoServiceStart {
    fn install() -> anyhow::Result<Self> {
        if fs::symlink_metadata(POLICY_RC_D).is_ok() {
            return Ok(Self(false));
        }
        fs::write(POLICY_RC_D, NO_SERVICE_START)
            .with_context(|| format!("writing {POLICY_RC_D}"))?;
        fs::set_permissions(POLICY_RC_D, fs::Permissions::from_mode(0o755))?;
        Ok(Self(true))
    }
}

impl Drop for NoServiceStart {
    fn drop(&mut self) {
        if self.0 {
            let _ = fs::remove_file(POLICY_RC_D);
        }
    }
}

const NIGHTLY: &str = "nightly";
const TRACEFS: &str = "/sys/kernel/tracing";

/// Set once setup has run in this process: the suite's later steps (soak, benchmarks, demo)
/// call it again, and its checks (dpkg, importing torch) cost seconds each time.
static DONE: AtomicBool = AtomicBool::new(false);

pub fn run() -> anyhow::Result<()> {
    if DONE.load(Ordering::Relaxed) {
        return Ok(());
    }
    let python = start()?;
    finish(python)
}

/// Everything but the Python virtualenv, which installs in the background meanwhile (a
/// download of about 3 GB that needs no CPU the build wants): [`finish`] waits for it.
pub fn start() -> anyhow::Result<JoinHandle<anyhow::Result<()>>> {
    nightly_toolchain().context("setup step 'nightly toolchain with rust-src'")?;
    debian_packages().context("setup step 'Debian packages'")?;
    let python = std::thread::spawn(|| {
        crate::python::setup().context("setup step 'Python virtualenv with torch'")
    });
    bpf_linker().context("setup step 'bpf-linker (LLVM 22)'")?;
    tracefs().context("setup step 'tracefs mounted'")?;
    Ok(python)
}

/// Waits for the virtualenv [`start`] left installing.
pub fn finish(python: JoinHandle<anyhow::Result<()>>) -> anyhow::Result<()> {
    python.join().map_err(|_| anyhow::anyhow!("the virtualenv's setup panicked"))??;
    eprintln!("setup: everything is in place");
    DONE.store(true, Ordering::Relaxed);
    Ok(())
}

fn nightly_toolchain() -> anyhow::Result<()> {
    if !succeeds(Command::new("rustup").args(["run", NIGHTLY, "rustc", "--version"])) {
        status(
            "installing the nightly toolchain",
            Command::new("rustup").args(["toolchain", "install", NIGHTLY, "--profile", "minimal"]),
        )?;
    }
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        NIGHTLY,
    ]))
    .unwrap_or_default();
    for component in ["rust-src", "clippy"] {
        if !installed.lines().any(|l| l.starts_with(component)) {
            status(
                &format!("adding {component} to nightly"),
                Command::new("rustup").args([
                    "component",
                    "add",
                    component,
                    "--toolchain",
                    NIGHTLY,
                ]),
            )?;
        }
    }
    Ok(())
}

fn is_installed(package: &str) -> bool {
    output(Command::new("dpkg-query").args(["-W", "-f=${Status}", package]))
        .is_some_and(|s| s.ends_with("install ok installed"))
}

fn debian_packages() -> anyhow::Result<()> {
    let missing: Vec<&str> =
        DEBIAN_PACKAGES.iter().map(|(p, _)| *p).filter(|p| !is_installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    for (p, why) in DEBIAN_PACKAGES.iter().filter(|(p, _)| missing.contains(p)) {
        eprintln!("setup: installing {p}: {why}");
    }
    if !nix_is_root() {
        bail!(
            "these Debian packages are missing and installing them needs root: {}",
            missing.join(" ")
        );
    }
    status("apt-get update", Command::new("apt-get").args(["update", "-q"]))?;
    let _no_services = NoServiceStart::install()?;
    status(
        "apt-get install",
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

fn bpf_linker() -> anyhow::Result<()> {
    // Linked against LLVM 22 if its dynamic libLLVM is 22; a build against another LLVM cannot
    // link nightly's bitcode.
    if let Some(path) = output(Command::new("sh").args(["-c", "command -v bpf-linker"])) {
        let libs = output(Command::new("ldd").arg(path.trim())).unwrap_or_default();
        if libs.contains("libLLVM.so.22") || libs.contains("libLLVM-22") {
            return Ok(());
        }
        eprintln!("setup: {} is not linked against LLVM 22; rebuilding it", path.trim());
    }
    let path = format!("/usr/lib/llvm-22/bin:{}", std::env::var("PATH").unwrap_or_default());
    status(
        "cargo install bpf-linker",
        Command::new(env!("CARGO"))
            .args([
                "install",
                "bpf-linker",
                "--locked",
                "--force",
                "--no-default-features",
                "--features",
                "llvm-22",
            ])
            .env("PATH", path),
    )
}

/// cargo-fuzz builds and runs the fuzz targets on nightly: installed by `cargo xtask fuzz` when
/// first run, since the suite runs the seeds without it.
pub fn cargo_fuzz() -> anyhow::Result<()> {
    if succeeds(Command::new(env!("CARGO")).args(["fuzz", "--version"])) {
        return Ok(());
    }
    status(
        "cargo install cargo-fuzz",
        Command::new(env!("CARGO")).args(["install", "cargo-fuzz", "--locked"]),
    )
}

fn tracefs() -> anyhow::Result<()> {
    let mounts = fs::read_to_string("/proc/mounts").context("reading /proc/mounts")?;
    if mounts.lines().any(|l| l.split_whitespace().nth(1) == Some(TRACEFS)) {
        return Ok(());
    }
    if !nix_is_root() {
        bail!("tracefs is not mounted at {TRACEFS} and mounting it needs root");
    }
    status("mounting tracefs", Command::new("mount").args(["-t", "tracefs", "nodev", TRACEFS]))
}

fn nix_is_root() -> bool {
    output(Command::new("id").arg("-u")).is_some_and(|u| u.trim() == "0")
}
