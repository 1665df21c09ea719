//! Every filesystem path linkpilot reads, in one place.

/// Where tracefs is normally mounted.
pub const TRACEFS: &str = "/sys/kernel/tracing";
/// The older location, under debugfs.
pub const TRACEFS_LEGACY: &str = "/sys/kernel/debug/tracing";
/// The running kernel's BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";
/// Our process status (effective capabilities).
pub const PROC_SELF_STATUS: &str = "/proc/self/status";
