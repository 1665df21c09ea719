//! What linkpilot needs from the running kernel, checked up front so that a missing privilege or
//! feature is one clear error instead of a syscall failure deep inside loading.
//! Privileges, tracefs and the up-front check are here; tracepoint layouts in `tracepoints`,
//! structure offsets from BTF in `btf`.

use std::{fs, path::PathBuf};

use linkpilot_common::KernelOffsets;

use crate::paths::{PROC_SELF_STATUS, TRACEFS, TRACEFS_LEGACY};

mod btf;
mod tracepoints;
pub use btf::{kernel_offsets, own_netns_inum};
pub use tracepoints::{
    check_probe_tracepoint, check_retransmit_tracepoint, check_sock_state_tracepoint,
};

/// A kernel prerequisite that is not met.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(
        "missing privileges: loading and attaching eBPF programs needs root, or CAP_BPF, \
         CAP_NET_ADMIN and CAP_PERFMON (missing: {missing})"
    )]
    MissingCapabilities { missing: String },
    #[error(
        "tracefs is not mounted (looked in {TRACEFS} and {TRACEFS_LEGACY}) and mounting it for \
         this process failed ({why}); mount it with `mount -t tracefs nodev {TRACEFS}` \
         (`cargo xtask setup` does this)"
    )]
    NoTracefs { why: String },
    #[error("tracepoint {name} is not available in this kernel ({path} is missing)")]
    NoTracepoint { name: String, path: String },
    #[error(
        "tracepoint {tracepoint}: field {field} is at offset {found:?} in this kernel, linkpilot \
         reads it at {expected}; this kernel's record layout is not supported"
    )]
    TracepointLayout {
        tracepoint: String,
        field: &'static str,
        expected: usize,
        found: Option<usize>,
    },
    #[error("reading {path}: {source}")]
    Read { path: String, source: std::io::Error },
}

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Checks that this process may load and attach our programs.
pub fn check_privileges() -> Result<(), KernelError> {
    let status = fs::read_to_string(PROC_SELF_STATUS)
        .map_err(|source| KernelError::Read { path: PROC_SELF_STATUS.into(), source })?;
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    missing_capabilities(eff)
        .map_or(Ok(()), |missing| Err(KernelError::MissingCapabilities { missing }))
}

fn missing_capabilities(eff: u64) -> Option<String> {
    let has = |cap: u32| eff & (1u64 << cap) != 0;
    // Before CAP_BPF/CAP_PERFMON existed, CAP_SYS_ADMIN covered both.
    let mut missing = Vec::new();
    if !has(CAP_BPF) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_BPF");
    }
    if !has(CAP_PERFMON) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_PERFMON");
    }
    if !has(CAP_NET_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    (!missing.is_empty()).then(|| missing.join(", "))
}

/// The tracefs mount point.
pub fn tracefs() -> Result<PathBuf, KernelError> {
    [TRACEFS, TRACEFS_LEGACY]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.join("events").is_dir())
        .ok_or(KernelError::NoTracefs { why: "not tried".into() })
}

/// tracefs, mounted for this process if it is not there: `ip netns exec` gives its command a
/// fresh /sys without it. The mount goes into a mount namespace of our own (a slave of the one
/// we came from, so nothing propagates back): nobody else sees it, and it ends with us.
/// Needs CAP_SYS_ADMIN; without it, the error says how to mount tracefs instead.
pub fn ensure_tracefs() -> Result<PathBuf, KernelError> {
    if let Ok(p) = tracefs() {
        return Ok(p);
    }
    let why = match mount_own_tracefs() {
        Ok(()) => match tracefs() {
            Ok(p) => {
                tracing::info!(
                    "tracefs was not mounted here: mounted it at {TRACEFS} for this process"
                );
                return Ok(p);
            }
            Err(_) => format!("mounted at {TRACEFS}, but it has no events/"),
        },
        Err(e) => e,
    };
    Err(KernelError::NoTracefs { why })
}

fn mount_own_tracefs() -> Result<(), String> {
    use nix::{
        mount::{mount, MsFlags},
        sched::{unshare, CloneFlags},
    };
    if !std::path::Path::new(TRACEFS).is_dir() {
        return Err(format!("{TRACEFS} does not exist to mount it on"));
    }
    // Before any thread starts: a threaded process cannot leave its mount namespace.
    unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("a mount namespace of our own: {e}"))?;
    let none = None::<&str>;
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_SLAVE, none)
        .map_err(|e| format!("making our mounts private: {e}"))?;
    mount(Some("nodev"), TRACEFS, Some("tracefs"), MsFlags::empty(), none)
        .map_err(|e| format!("mount -t tracefs nodev {TRACEFS}: {e}"))
}

/// Everything `watch` and `run` need from the kernel, checked before anything is loaded:
/// privileges (unless `capabilities` is false: then the kernel judges, syscall by syscall), the
/// three tracepoints' layouts, and the structure offsets (a note is logged when BTF is missing
/// and skbs are counted instead of segments).
pub fn preflight(capabilities: bool) -> Result<KernelOffsets, KernelError> {
    if capabilities {
        check_privileges()?;
    }
    ensure_tracefs()?;
    let has_err = check_retransmit_tracepoint()?;
    check_probe_tracepoint()?;
    check_sock_state_tracepoint()?;
    let (offsets, notes) = kernel_offsets(has_err);
    for note in notes {
        tracing::warn!("{note}");
    }
    Ok(offsets)
}

/// The congestion control algorithms this kernel offers
/// (`net.ipv4.tcp_available_congestion_control`, read under `proc_sys`).
pub fn congestion_controls(proc_sys: &std::path::Path) -> std::io::Result<Vec<String>> {
    let text = std::fs::read_to_string(proc_sys.join("net/ipv4/tcp_available_congestion_control"))?;
    Ok(text.split_whitespace().map(str::to_owned).collect())
}

/// Asks the kernel for congestion control `name` on a socket that is closed unused: with
/// CAP_NET_ADMIN the kernel loads its module (`tcp_<name>`) if it is not loaded yet, as writing
/// `net.ipv4.tcp_congestion_control` would. Distribution kernels ship BBR as a module that
/// nothing loads until asked. Nothing else on the host changes.
pub fn load_congestion_control(name: &str) -> std::io::Result<()> {
    use socket2::{Domain, Socket, Type};
    Socket::new(Domain::IPV4, Type::STREAM, None)?.set_tcp_congestion(name.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asking_for_a_congestion_control() {
        // Reno is built into every kernel and allowed to every socket.
        load_congestion_control("reno").unwrap();
        let e = load_congestion_control("no_such_cc").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    }

    #[test]
    fn capabilities() {
        assert_eq!(missing_capabilities(u64::MAX), None);
        assert_eq!(missing_capabilities(1 << CAP_SYS_ADMIN | 1 << CAP_NET_ADMIN), None);
        assert_eq!(missing_capabilities(1 << CAP_BPF), Some("CAP_PERFMON, CAP_NET_ADMIN".into()));
        assert_eq!(missing_capabilities(0), Some("CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN".into()));
    }
}
