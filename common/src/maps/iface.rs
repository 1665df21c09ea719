//! Watched interfaces: how the TC programs find an interface's configuration and counter slot,
//! the per-interface counters, and the local addresses that attribute retransmissions to one.

/// Per-CPU array of [`IfaceStats`], [`MAX_IFACES`] slots: the slot of a watched interface is
/// the one its [`IfaceConfig`] names, assigned (and zeroed) by the controller before attaching.
/// An array rather than a hash keyed by ifindex: the verifier inlines its lookup.
pub const MAP_IFACE_STATS: &str = "LP_IFACE_STATS";
/// Hash: ifindex (`u32`) -> [`IfaceConfig`]. Only watched interfaces have an entry.
pub const MAP_IFACE_CONFIG: &str = "LP_IFACE_CONFIG";
/// Array of [`IfaceConfig`], [`IFACE_INDEX_SLOTS`] slots: the configuration of a watched
/// interface at `ifindex % IFACE_INDEX_SLOTS` (its `ifindex` field says whose it is), in front
/// of [`MAP_IFACE_CONFIG`], whose hash lookup costs a packet more than all its counters. Two
/// watched interfaces at the same slot: the second is found in the hash.
pub const MAP_IFACE_INDEX: &str = "LP_IFACE_INDEX";
/// Slots of [`MAP_IFACE_INDEX`] (a power of two).
pub const IFACE_INDEX_SLOTS: u32 = 256;
/// Hash: [`LocalAddr`] -> ifindex (`u32`): addresses of watched interfaces, used to attribute a
/// retransmission (whose tracepoint carries no device) to the interface owning its source address.
pub const MAP_LOCAL_ADDRS: &str = "LP_LOCAL_ADDRS";

/// Capacity of the per-interface maps.
pub const MAX_IFACES: u32 = 64;
/// Capacity of [`MAP_LOCAL_ADDRS`].
pub const MAX_LOCAL_ADDRS: u32 = 1024;

/// Per-interface counters, one copy per CPU; the controller sums them.
///
/// Packets are wire segments, not skbs: a GSO/GRO skb of `n` segments counts `n` packets and
/// `len + (n - 1) * header_len` bytes, the bytes the segments occupy on the wire including their
/// L2 header (without preamble, FCS and inter-frame gap). `linkpilot watch` prints them as they
/// are (summed), hence serde on the host.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "std", derive(serde::Serialize, serde::Deserialize))]
pub struct IfaceStats {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// TCP segments retransmitted successfully from a source address of this interface
    /// (`tcp_skb_pcount` of each retransmitted skb, as the kernel's TcpRetransSegs counts).
    pub retrans_segs: u64,
    /// Retransmission attempts that the stack reported as failed (tracepoint `err != 0`).
    pub retrans_failed: u64,
    /// Egress packets whose DSCP a rule rewrote.
    pub tx_dscp_rewritten: u64,
    /// Packets that are not IPv4/IPv6 (ARP, LLDP, ...) or whose IP header is malformed or
    /// truncated, by direction: counted, never parsed further.
    pub rx_unknown: u64,
    pub tx_unknown: u64,
}

impl IfaceStats {
    /// Adds another CPU's counters to these.
    pub fn accumulate(&mut self, other: &Self) {
        add_wrapping!(self, other;
            rx_packets, rx_bytes, tx_packets, tx_bytes, retrans_segs, retrans_failed,
            rx_unknown, tx_unknown, tx_dscp_rewritten);
    }
}

/// Link-layer framing of an interface, as TC programs see `skb->data`.
pub const L2_ETHERNET: u32 = 1;
/// No link-layer header: `skb->data` starts at the IP header (tun, wireguard, ...).
pub const L2_RAW_IP: u32 = 2;

/// What the TC programs need to know about a watched interface.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IfaceConfig {
    /// The interface's index (0: an empty slot of [`MAP_IFACE_INDEX`]).
    pub ifindex: u32,
    /// [`L2_ETHERNET`] or [`L2_RAW_IP`].
    pub l2: u32,
    /// The interface's slot in [`MAP_IFACE_STATS`] and
    /// [`MAP_PEER_STATS`](super::MAP_PEER_STATS) (below [`MAX_IFACES`]).
    pub slot: u32,
    pub _pad: u32,
}

/// Key of [`MAP_LOCAL_ADDRS`]: an IPv4 address occupies the first 4 bytes, the rest are zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LocalAddr {
    /// [`AF_INET`](super::AF_INET) or [`AF_INET6`](super::AF_INET6).
    pub family: u16,
    pub _pad: u16,
    pub addr: [u8; 16],
}
