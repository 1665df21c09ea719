//! One reading of the programs' maps, as the kernel side hands it up: the per-(interface, peer)
//! counters, the flow table and the RDMA ports' counters. The sensors (`sense::sensors`) make
//! snapshots of it.

use linkpilot_common::{FlowKey, FlowState, PeerStats};

use crate::rdma::RdmaPort;

/// One (interface, peer) row of a reading.
#[derive(Clone, Debug, Default)]
pub struct PeerReading {
    /// The interface's name, the snapshot's `link`: a policy's link takes the rows of its
    /// interfaces.
    pub link: String,
    /// The interface's ifindex: the row takes the RTT samples of flows on it.
    pub ifindex: u32,
    pub peer: String,
    /// The peer's id (0: "other").
    pub id: u32,
    pub stats: PeerStats,
}

/// One reading of the kernel's counters.
#[derive(Clone, Debug, Default)]
pub struct Readings {
    /// A row for every watched interface and peer.
    pub peers: Vec<PeerReading>,
    /// The flow table.
    pub flows: Vec<(FlowKey, FlowState)>,
    /// CLOCK_MONOTONIC (the clock of `bpf_ktime_get_ns`) just before the flow table was read:
    /// a flow whose `last_ns` is past the previous reading's has a fresh RTT sample.
    pub kernel_ns: u64,
    /// (link name, the RDMA ports whose netdev it is) for every watched link.
    pub nic: Vec<(String, Vec<RdmaPort>)>,
    /// The flow table was not read this tick (a large one is read less often than the
    /// counters): RTT samples wait for the next reading, flow counts repeat the last one.
    pub flows_skipped: bool,
}
