//! The sock_ops program's ABI: the transport profile a watched link's peers get, and what the
//! program tells the controller back.

/// The sock_ops program, attached to a cgroup v2 directory.
pub const PROG_SOCK_OPS: &str = "lp_sock_ops";
/// Array of [`TransportProfile`], indexed by peer id (1..=[`crate::MAX_PEERS`]; slot 0, traffic to
/// no named peer, is never enabled).
pub const MAP_TRANSPORT: &str = "LP_TRANSPORT";
/// Hash: network namespace cookie (`u64`) -> `u32` (1), the namespaces whose sockets the program
/// may touch: the controller's, and the reporting jobs' own where the policy opts in (none
/// until the controller says). Cgroup programs see every namespace's sockets, and the lab's
/// namespaces reuse addresses: the peer's address alone would tune another namespace's
/// connections.
pub const MAP_TRANSPORT_NETNS: &str = "LP_TRANSPORT_NS";
/// LRU hash: socket cookie (`u64`) -> [`ManagedSocket`], the connections carrying a profile.
pub const MAP_MANAGED_SOCKETS: &str = "LP_MANAGED_SK";
/// Per-CPU array of [`TransportCounters`], indexed by peer id.
pub const MAP_TRANSPORT_COUNTERS: &str = "LP_TRANSPORT_CNT";
/// Capacity of [`MAP_MANAGED_SOCKETS`]; beyond it the oldest entry goes (that connection keeps
/// its settings but is no longer updated or counted).
pub const MAX_MANAGED_SOCKETS: u32 = 65_536;

/// Congestion control names are at most this long with their NUL (`TCP_CA_NAME_MAX`).
pub const CC_NAME_LEN: usize = 16;

/// What connections to one peer get. A zero field is left as the kernel made it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportProfile {
    /// Non-zero: the peer's connections are managed.
    pub enabled: u32,
    /// Bumped by the controller at every change; a managed connection whose
    /// [`ManagedSocket::generation`] differs is brought up to date at its next RTT sample.
    pub generation: u32,
    /// `TCP_CONGESTION`, NUL-padded; all zero: the host's default.
    pub congestion_control: [u8; CC_NAME_LEN],
    /// `TCP_BPF_IW`: segments of the initial congestion window (new connections only).
    pub initial_cwnd: u32,
    /// Segments of the initial receive window offered (`BPF_SOCK_OPS_RWND_INIT`, new
    /// connections only).
    pub initial_rwnd: u32,
    /// `TCP_BPF_SNDCWND_CLAMP`: the most segments the send window may grow to.
    pub sndcwnd_clamp: u32,
    /// `SO_SNDBUF` and `SO_RCVBUF` in bytes (the kernel caps them at `wmem_max`/`rmem_max`
    /// and doubles them, as for setsockopt).
    pub socket_buffer: u32,
    /// Non-zero: the connection negotiates ECN (`BPF_SOCK_OPS_NEEDS_ECN`), whatever
    /// `net.ipv4.tcp_ecn` says (new connections only).
    pub ecn: u32,
}

/// A connection carrying a profile.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ManagedSocket {
    pub peer: u32,
    /// The profile generation last applied.
    pub generation: u32,
}

/// Per peer: connections that got the profile when established, established ones brought up to
/// date, and settings the kernel refused (a connection counts once per refused option).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportCounters {
    pub profiled: u64,
    pub updated: u64,
    pub refused: u64,
    pub closed: u64,
}

impl TransportCounters {
    pub fn accumulate(&mut self, o: &Self) {
        self.profiled = self.profiled.wrapping_add(o.profiled);
        self.updated = self.updated.wrapping_add(o.updated);
        self.refused = self.refused.wrapping_add(o.refused);
        self.closed = self.closed.wrapping_add(o.closed);
    }
}

const _: () = assert!(core::mem::size_of::<TransportProfile>() == 44);
const _: () = assert!(core::mem::size_of::<ManagedSocket>() == 8);
const _: () = assert!(core::mem::size_of::<TransportCounters>() == 32);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)], Copy, integers only, no implicit padding (sizes asserted above).
    unsafe impl aya::Pod for super::TransportProfile {}
    unsafe impl aya::Pod for super::ManagedSocket {}
    unsafe impl aya::Pod for super::TransportCounters {}
}
