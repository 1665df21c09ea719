//! linkpilot-lab: two data centers and a long-haul link on one machine.
//!
//! Sites are network namespaces whose hosts reach each other only through a WAN router namespace,
//! where policy routing sends each direction's packets into a TUN device; a userspace delay line
//! reads them, applies the link model of the current scenario phase (delay, jitter, spikes,
//! bottleneck rate and queue, ECN marking, loss, outages) and writes them back at their delivery
//! time. Kernel delay emulation (sch_netem) is not available on every kernel we run on; this
//! works anywhere TUN does.

pub mod bench;
pub mod cmd;
pub mod delayline;
pub mod ip;
pub mod lab;
pub mod model;
pub mod scenario;
pub mod selftest;
pub mod tun;
pub use linkpilot_common::units;
