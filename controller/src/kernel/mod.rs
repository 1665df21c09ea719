//! The kernel side: loading and attaching the eBPF programs and reading their maps (`probes`,
//! the only module that talks to aya, with `batch` for whole-map reads and `peers` for the
//! peer table), and what the running system offers (`checks`: privileges, tracefs, tracepoint
//! layouts, BTF offsets; `iface`: interfaces and addresses).

pub mod batch;
pub mod checks;
pub mod datapath_log;
pub mod iface;
pub mod peers;
mod probe_error;
pub mod probes;
pub mod sockets;
