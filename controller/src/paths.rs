//! The kernel's files linkpilot reads, in one place (its own files' defaults live with the
//! modules that write them).

/// Where tracefs is normally mounted.
pub const TRACEFS: &str = "/sys/kernel/tracing";
/// The older location, under debugfs.
pub const TRACEFS_LEGACY: &str = "/sys/kernel/debug/tracing";
/// The running kernel's BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";
/// Our process status (effective capabilities).
pub const PROC_SELF_STATUS: &str = "/proc/self/status";
/// Our network namespace (its inode number identifies it to the tracepoints).
pub const PROC_SELF_NS_NET: &str = "/proc/self/ns/net";
/// Our process's memory (RSS) and CPU time.
pub const PROC_SELF_STATM: &str = "/proc/self/statm";
pub const PROC_SELF_STAT: &str = "/proc/self/stat";
/// The routing tables, for `@default-route`.
pub const PROC_NET_ROUTE: &str = "/proc/net/route";
pub const PROC_NET_IPV6_ROUTE: &str = "/proc/net/ipv6_route";
