//! TCP retransmissions from `tcp_retransmit_skb`, attributed to the watched interface that owns
//! the flow's source address (the event carries no device).
//!
//! Read as a raw tracepoint from the socket itself where the kernel's BTF gave the socket's
//! layout: the kernel runs a tracepoint program only while no other tracing program is running
//! on that CPU, so a retransmission sent from a softirq that interrupted `lp_tcp_probe` (or
//! another tool's kprobe) would go uncounted; a raw tracepoint is skipped only inside itself.
//! The tracepoint's record is read instead on a kernel without BTF.

use aya_ebpf::{
    helpers::bpf_probe_read_kernel,
    macros::{raw_tracepoint, tracepoint},
    programs::{RawTracePointContext, TracePointContext},
};
use linkpilot_common::{
    retransmit_record::{
        DADDR as TP_DADDR, DADDR_V6 as TP_DADDR_V6, DPORT as TP_DPORT, ERR as TP_ERR,
        FAMILY as TP_FAMILY, SADDR as TP_SADDR, SADDR_V6 as TP_SADDR_V6, SKADDR as TP_SKADDR,
        SKBADDR as TP_SKBADDR, SPORT as TP_SPORT,
    },
    FlowKey, AF_INET, AF_INET6,
};

use crate::{
    jobs::flow_iface,
    kernel::{Record, LP_KERNEL_OFFSETS},
    maps::{iface_slot, peer_stats, FLOWS, IFACE_STATS},
    rtt::{addresses, v4_addresses, v6_addresses, Addresses, SockOffsets},
};

/// One retransmission, whichever way it was read.
struct Retransmission {
    family: u16,
    addrs: Addresses,
    /// Host order.
    sport: u16,
    /// Host order.
    dport: u16,
    /// The `struct sock *` and `struct sk_buff *`.
    sk: u64,
    skb: u64,
    /// The transmission's result; always 0 on kernels that fire only for successful ones.
    err: i32,
}

#[raw_tracepoint(tracepoint = "tcp_retransmit_skb")]
pub fn lp_tcp_retrans(ctx: RawTracePointContext) -> u32 {
    // A failed read only loses this one event; there is nothing better to do in a tracepoint.
    if let Ok(Some(r)) = from_socket(&ctx) {
        let _ = count(&r);
    }
    0
}

#[tracepoint]
pub fn lp_tcp_retr_tp(ctx: TracePointContext) -> u32 {
    // As above.
    if let Ok(Some(r)) = from_record(&ctx) {
        let _ = count(&r);
    }
    0
}

/// A value of `T` at kernel address `base + off`.
#[inline(always)]
fn kernel<T>(base: u64, off: u32) -> Result<T, i64> {
    // SAFETY: bpf_probe_read_kernel tolerates any address and reports failure.
    unsafe { bpf_probe_read_kernel((base + u64::from(off)) as *const T) }.map_err(i64::from)
}

/// `TP_PROTO(const struct sock *sk, const struct sk_buff *skb[, int err])`: the addresses and
/// ports as the tracepoint's record would hold them, read from `sk->__sk_common`.
#[inline(always)]
fn from_socket(ctx: &RawTracePointContext) -> Result<Option<Retransmission>, i64> {
    let o = &LP_KERNEL_OFFSETS;
    // SAFETY: read-only globals patched at load time.
    let (family_at, has_err) = unsafe {
        (core::ptr::read_volatile(&o.sock_family), core::ptr::read_volatile(&o.retransmit_has_err))
    };
    let sk: u64 = ctx.arg(0);
    let family: u16 = kernel(sk, family_at)?;
    // SAFETY (all): as above.
    let addrs = if family == AF_INET {
        let (l, r) = unsafe {
            (core::ptr::read_volatile(&o.sock_rcv_saddr), core::ptr::read_volatile(&o.sock_daddr))
        };
        v4_addresses(kernel(sk, l)?, kernel(sk, r)?)
    } else if family == AF_INET6 {
        let (l, r) = unsafe {
            (
                core::ptr::read_volatile(&o.sock_v6_rcv_saddr),
                core::ptr::read_volatile(&o.sock_v6_daddr),
            )
        };
        v6_addresses(kernel(sk, l)?, kernel(sk, r)?)
    } else {
        return Ok(None);
    };
    let (num, dport) =
        unsafe { (core::ptr::read_volatile(&o.sock_num), core::ptr::read_volatile(&o.sock_dport)) };
    let sport: u16 = kernel(sk, num)?;
    let dport = u16::from_be(kernel(sk, dport)?);
    // The int argument arrives widened to 64 bits; its low half is the value.
    let err = if has_err != 0 { ctx.arg::<u64>(2) as i32 } else { 0 };
    Ok(Some(Retransmission { family, addrs, sport, dport, sk, skb: ctx.arg(1), err }))
}

const RETRANSMIT_SOCK: SockOffsets = SockOffsets {
    family: TP_FAMILY,
    skaddr: TP_SKADDR,
    sport: TP_SPORT,
    dport: TP_DPORT,
    local4: TP_SADDR,
    remote4: TP_DADDR,
    local6: TP_SADDR_V6,
    remote6: TP_DADDR_V6,
};

/// The same from the tracepoint's record.
#[inline(always)]
fn from_record(ctx: &TracePointContext) -> Result<Option<Retransmission>, i64> {
    // SAFETY (all reads): offsets within the record, checked against tracefs at load time;
    // `err` is read only where it exists.
    let off = &RETRANSMIT_SOCK;
    let family: u16 = unsafe { ctx.field(off.family)? };
    let Some(addrs) = addresses(ctx, family, off)? else { return Ok(None) };
    let has_err = unsafe { core::ptr::read_volatile(&LP_KERNEL_OFFSETS.retransmit_has_err) };
    let err: i32 = if has_err != 0 { unsafe { ctx.field(TP_ERR)? } } else { 0 };
    let (sport, dport, sk, skb) = unsafe {
        (
            ctx.field(off.sport)?,
            ctx.field(off.dport)?,
            ctx.field(off.skaddr)?,
            ctx.field(TP_SKBADDR)?,
        )
    };
    Ok(Some(Retransmission { family, addrs, sport, dport, sk, skb, err }))
}

/// Adds the retransmission to its interface's, peer's and flow's counts.
#[inline(always)]
fn count(r: &Retransmission) -> Result<(), i64> {
    let (key, local, remote) = &r.addrs;
    let Some((ifindex, _)) = flow_iface(r.sk, key) else { return Ok(()) };
    let Some(slot) = iface_slot(ifindex) else { return Ok(()) };
    let Some(stats) = IFACE_STATS.get_ptr_mut(slot) else { return Ok(()) };
    // SAFETY: a per-CPU value; see traffic.rs.
    let stats = unsafe { &mut *stats };
    if r.err != 0 {
        stats.retrans_failed += 1;
        return Ok(());
    }
    let segs = u64::from(segments(r.skb));
    stats.retrans_segs += segs;
    let peer = crate::peers::peer_of_uncached(remote);
    if let Some(ps) = peer_stats(slot, peer) {
        // SAFETY: a per-CPU value.
        unsafe { (*ps).retrans_segs += segs };
    }
    let key = FlowKey {
        family: r.family,
        local_port: r.sport,
        remote_port: r.dport,
        _pad: 0,
        local: *local,
        remote: *remote,
    };
    if let Some(f) = FLOWS.get_ptr_mut(key) {
        // SAFETY: an LRU value; see rtt.rs on concurrent updates.
        unsafe { (*f).retrans_segs += segs };
    }
    Ok(())
}

/// `tcp_skb_pcount(skb)`: how many MSS-sized segments the retransmitted skb carries, which is
/// what TcpRetransSegs adds. One when the offset is unknown or the read fails.
#[inline(always)]
fn segments(skb: u64) -> u16 {
    // SAFETY: a read-only global patched at load time.
    let off = unsafe { core::ptr::read_volatile(&LP_KERNEL_OFFSETS.skb_tcp_gso_segs) };
    if off == 0 {
        return 1;
    }
    match kernel::<u16>(skb, off) {
        Ok(segs) if segs > 0 => segs,
        _ => 1,
    }
}
