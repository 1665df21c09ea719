//! Connection state kept between events: the TCP flow table the tracepoints write (and the job
//! namespaces whose flows count), and the RoCEv2 queue-pair table that spots resent PSNs.

/// LRU hash: [`FlowKey`] -> [`FlowState`], written by the TCP tracepoints.
pub const MAP_FLOWS: &str = "LP_FLOWS";
/// Flows tracked; the least recently updated are forgotten first.
pub const MAX_FLOWS: u32 = 131_072;

/// A TCP flow seen from this host: local and remote address and port.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    /// [`AF_INET`](super::AF_INET) or [`AF_INET6`](super::AF_INET6).
    pub family: u16,
    pub local_port: u16,
    pub remote_port: u16,
    pub _pad: u16,
    /// IPv4 as IPv4-mapped IPv6.
    pub local: [u8; 16],
    pub remote: [u8; 16],
}

/// What the tracepoints know of a flow.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowState {
    /// Latest smoothed RTT (`tp->srtt_us >> 3`), microseconds.
    pub srtt_us: u32,
    /// Smallest smoothed RTT seen, microseconds.
    pub min_srtt_us: u32,
    /// RTT samples taken (ACKs received while data was in flight).
    pub rtt_samples: u64,
    /// Retransmitted segments.
    pub retrans_segs: u64,
    /// `bpf_ktime_get_ns` of the last update.
    pub last_ns: u64,
    pub ifindex: u32,
    pub peer: u32,
    pub snd_cwnd: u32,
    /// `snd_nxt` at the last RTT sample: once `snd_una` reaches it, everything the flow had in
    /// flight was acknowledged, so its own queue at the bottleneck had drained.
    pub snd_nxt: u32,
    /// Segments received CE-marked, counted by the TC ingress program (only for flows in the
    /// table): with the jobs' sockets, which marks fall on a job's flows and which on others'.
    pub ce_segs: u64,
    /// Segments received with TCP ECE set (the peer echoing marks on what this host sent).
    pub ece_segs: u64,
    /// The RTT of the first segment a flow sent after its flight emptied (a job's burst after
    /// an idle gap), microseconds: it queued only behind others' traffic, not the flow's own.
    /// Derived from the first smoothed RTT that moved (`srtt += (m - srtt) / 8`, within 8 us).
    pub burst_rtt_us: u32,
    /// Non-zero while waiting for that sample: the smoothed RTT the burst started from.
    pub burst_from_us: u32,
    /// `bpf_ktime_get_ns` when `burst_rtt_us` was taken (0: never).
    pub burst_ns: u64,
    /// The socket's network namespace (inode number; 0: not read, on kernels without BTF): a
    /// flow in a reporting job's own namespace is that job's.
    pub netns: u32,
    pub _pad: u32,
}

/// Hash: network namespace inode number (`u32`) -> the ifindex (`u32`) of the watched interface
/// whose counters take the flows of that namespace: the namespaces of reporting jobs that run
/// in their own (a pod's), whose addresses no watched interface owns. Empty unless the
/// policy opts in.
pub const MAP_JOB_NETNS: &str = "LP_JOB_NETNS";
/// Array of one `u32`: how many entries [`MAP_JOB_NETNS`] has; while 0 the tracepoints skip
/// the namespace read a socket of no watched address would otherwise cost.
pub const MAP_JOB_NETNS_COUNT: &str = "LP_JOB_NETNS_N";
/// Capacity of [`MAP_JOB_NETNS`].
pub const MAX_JOB_NAMESPACES: u32 = 256;

/// Key of [`MAP_ROCE_QPS`]: one direction of one destination QP of one peer address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpKey {
    pub ifindex: u32,
    /// 0 ingress, 1 egress.
    pub direction: u32,
    pub dest_qp: u32,
    pub remote: [u8; 16],
}

/// LRU hash: [`QpKey`] -> last PSN seen (`u32`), to spot repeated PSNs.
pub const MAP_ROCE_QPS: &str = "LP_ROCE_QPS";
/// Queue pairs tracked for retransmissions; the least recently used are forgotten.
pub const MAX_ROCE_QPS: u32 = 65536;
