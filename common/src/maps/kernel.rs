//! Kernel layout the tracepoint programs depend on: structure offsets read from the running
//! kernel's BTF at load time, handed to the programs as a global.

/// Global of type [`KernelOffsets`], set at load time from the running kernel's BTF.
pub const GLOBAL_KERNEL_OFFSETS: &str = "LP_KERNEL_OFFSETS";

/// Byte offsets inside kernel structures that the tracepoint programs read, and the network
/// namespace they count for. Zero in `tcp_gso_segs` means "unknown": each retransmitted skb then
/// counts as one segment.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    /// Offset of `tcp_skb_cb.tcp_gso_segs` (a `u16`) from the start of `struct sk_buff`, i.e.
    /// `offsetof(sk_buff, cb) + offsetof(tcp_skb_cb, tcp_gso_segs)`.
    pub skb_tcp_gso_segs: u32,
    /// Non-zero when the tracepoint record has the `err` field (Linux 6.13 and later); older
    /// kernels fire the tracepoint only for successful retransmissions.
    pub retransmit_has_err: u32,
    /// `offsetof(struct sock, __sk_common.skc_net)`: the socket's `struct net *`.
    pub sock_net: u32,
    /// `offsetof(struct net, ns.inum)`: the namespace's inode number, as `stat` shows it for
    /// `/proc/PID/ns/net`.
    pub net_inum: u32,
    /// The inode number of the network namespace whose interfaces are watched. Tracepoints are
    /// system-wide and addresses repeat across namespaces (containers, the lab), so a socket
    /// counts only when it lives in this namespace. Zero (or a zero offset): every namespace.
    pub netns_inum: u32,
    /// Non-zero when the `sock_*` offsets below were found in the kernel's BTF: retransmissions
    /// are then read from the socket by [`PROG_TCP_RETRANSMIT`](super::PROG_TCP_RETRANSMIT).
    /// (A zero offset is a real one: `skc_daddr` opens `struct sock`.)
    pub sock_known: u32,
    /// `offsetof(struct sock, __sk_common.skc_family)`, a `u16`.
    pub sock_family: u32,
    /// `__sk_common.skc_num`: the local port, host order (`u16`).
    pub sock_num: u32,
    /// `__sk_common.skc_dport`: the remote port, network order (`u16`).
    pub sock_dport: u32,
    /// `__sk_common.skc_rcv_saddr`: the local IPv4 address.
    pub sock_rcv_saddr: u32,
    /// `__sk_common.skc_daddr`: the remote IPv4 address.
    pub sock_daddr: u32,
    /// `__sk_common.skc_v6_rcv_saddr`: the local IPv6 address.
    pub sock_v6_rcv_saddr: u32,
    /// `__sk_common.skc_v6_daddr`: the remote IPv6 address.
    pub sock_v6_daddr: u32,
}
