//! The kernel side: loading and attaching the eBPF programs and reading their maps (`probes`,
//! with `batch` for whole-map reads, `peers` for the peer table and `readings` for what a read
//! hands up; this module is the only one that talks to aya), and what the running system offers (`checks`: privileges, tracefs, tracepoint
//! layouts, BTF offsets; `iface`: interfaces and addresses).

pub mod batch;
pub mod checks;
pub mod datapath_log;
pub mod iface;
pub mod peers;
mod probe_error;
pub mod probes;
pub mod readings;
pub mod sockets;
