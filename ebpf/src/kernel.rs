//! What the controller patches in at load time from the running kernel (BTF offsets, the watched
//! network namespace), and the namespace check every tracepoint makes before it counts.

use aya_ebpf::{helpers::bpf_probe_read_kernel, programs::TracePointContext};
use linkpilot_common::KernelOffsets;

/// Set by the controller at load time.
#[unsafe(no_mangle)]
pub(crate) static LP_KERNEL_OFFSETS: KernelOffsets = KernelOffsets {
    skb_tcp_gso_segs: 0,
    retransmit_has_err: 0,
    sock_net: 0,
    net_inum: 0,
    netns_inum: 0,
    _pad: 0,
};

/// Whether the socket at record offset `skaddr` lives in the watched network namespace.
/// Tracepoints see every namespace's sockets, and the same addresses recur in each: the address
/// alone would count another namespace's connections. True when no namespace is set.
#[inline(always)]
pub(crate) fn in_watched_netns(ctx: &TracePointContext, skaddr: usize) -> bool {
    // SAFETY: a read-only global patched at load time.
    let (want, sock_net, net_inum) = unsafe {
        (
            core::ptr::read_volatile(&LP_KERNEL_OFFSETS.netns_inum),
            core::ptr::read_volatile(&LP_KERNEL_OFFSETS.sock_net),
            core::ptr::read_volatile(&LP_KERNEL_OFFSETS.net_inum),
        )
    };
    if want == 0 || net_inum == 0 {
        return true;
    }
    // SAFETY: the offset is within the record (checked against tracefs at load time);
    // bpf_probe_read_kernel tolerates any address and reports failure.
    let Ok(sk) = (unsafe { ctx.read_at::<u64>(skaddr) }) else { return false };
    let Ok(net) = (unsafe { bpf_probe_read_kernel((sk + u64::from(sock_net)) as *const u64) })
    else {
        return false;
    };
    let inum = unsafe { bpf_probe_read_kernel((net + u64::from(net_inum)) as *const u32) };
    inum == Ok(want)
}
