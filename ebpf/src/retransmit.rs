//! TCP retransmissions from `tcp:tcp_retransmit_skb`, attributed to the watched interface that
//! owns the flow's source address (the tracepoint carries no device).

use aya_ebpf::{
    helpers::bpf_probe_read_kernel,
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
};
use linkpilot_common::{
    retransmit_record::{
        DADDR as TP_DADDR, DADDR_V6 as TP_DADDR_V6, DPORT as TP_DPORT, ERR as TP_ERR,
        FAMILY as TP_FAMILY, SADDR as TP_SADDR, SADDR_V6 as TP_SADDR_V6, SKADDR as TP_SKADDR,
        SKBADDR as TP_SKBADDR, SPORT as TP_SPORT,
    },
    FlowKey, LocalAddr, MAX_LOCAL_ADDRS,
};

use crate::{
    kernel::{in_watched_netns, Record, LP_KERNEL_OFFSETS},
    rtt::{addresses, AddrOffsets, FLOWS},
    traffic::{iface_slot, peer_stats, IFACE_STATS},
};

#[map(name = "LP_LOCAL_ADDRS")]
pub(crate) static LOCAL_ADDRS: HashMap<LocalAddr, u32> =
    HashMap::with_max_entries(MAX_LOCAL_ADDRS, 0);

#[tracepoint]
pub fn lp_tcp_retrans(ctx: TracePointContext) -> u32 {
    // A failed read only loses this one event; there is nothing better to do in a tracepoint.
    let _ = try_count(&ctx);
    0
}

#[inline(always)]
fn try_count(ctx: &TracePointContext) -> Result<(), i64> {
    // SAFETY: offsets are within the record the format file describes.
    let family: u16 = unsafe { ctx.field(TP_FAMILY)? };
    let Some((key, local, remote)) = addresses(ctx, family, &RETRANSMIT_ADDRS)? else {
        return Ok(());
    };
    // SAFETY: the controller writes this map only with whole values.
    let Some(&ifindex) = (unsafe { LOCAL_ADDRS.get(key) }) else { return Ok(()) };
    if !in_watched_netns(ctx, TP_SKADDR) {
        return Ok(());
    }
    let Some(slot) = iface_slot(ifindex) else { return Ok(()) };
    let Some(stats) = IFACE_STATS.get_ptr_mut(slot) else { return Ok(()) };
    // SAFETY: a read-only global patched at load time; `err` is only read where it exists.
    let has_err = unsafe { core::ptr::read_volatile(&LP_KERNEL_OFFSETS.retransmit_has_err) };
    // SAFETY: offset within the record when `has_err` is set.
    let err: i32 = if has_err != 0 { unsafe { ctx.field(TP_ERR)? } } else { 0 };
    // SAFETY: a per-CPU value; see traffic.rs.
    let stats = unsafe { &mut *stats };
    if err != 0 {
        stats.retrans_failed += 1;
        return Ok(());
    }
    let segs = u64::from(segments(ctx));
    stats.retrans_segs += segs;
    attribute(ctx, family, slot, segs, local, remote)
}

const RETRANSMIT_ADDRS: AddrOffsets =
    AddrOffsets { local4: TP_SADDR, remote4: TP_DADDR, local6: TP_SADDR_V6, remote6: TP_DADDR_V6 };

/// Adds `segs` to the flow's and its peer's retransmission counts.
#[inline(always)]
fn attribute(
    ctx: &TracePointContext,
    family: u16,
    slot: u32,
    segs: u64,
    local: [u8; 16],
    remote: [u8; 16],
) -> Result<(), i64> {
    let peer = crate::peers::peer_of_uncached(&remote);
    if let Some(ps) = peer_stats(slot, peer) {
        // SAFETY: a per-CPU value.
        unsafe { (*ps).retrans_segs += segs };
    }
    // SAFETY: offsets within the record, checked against tracefs at load time.
    let (sport, dport): (u16, u16) = unsafe { (ctx.field(TP_SPORT)?, ctx.field(TP_DPORT)?) };
    let key = FlowKey { family, local_port: sport, remote_port: dport, _pad: 0, local, remote };
    if let Some(f) = FLOWS.get_ptr_mut(key) {
        // SAFETY: an LRU value; see rtt.rs on concurrent updates.
        unsafe { (*f).retrans_segs += segs };
    }
    Ok(())
}

/// `tcp_skb_pcount(skb)`: how many MSS-sized segments the retransmitted skb carries, which is
/// what TcpRetransSegs adds. One when the offset is unknown or the read fails.
#[inline(always)]
fn segments(ctx: &TracePointContext) -> u16 {
    // SAFETY: a read-only global patched at load time.
    let off = unsafe { core::ptr::read_volatile(&LP_KERNEL_OFFSETS.skb_tcp_gso_segs) };
    if off == 0 {
        return 1;
    }
    // SAFETY: offset within the tracepoint record.
    let Ok(skb) = (unsafe { ctx.field::<u64>(TP_SKBADDR) }) else { return 1 };
    let ptr = (skb + u64::from(off)) as *const u16;
    // SAFETY: bpf_probe_read_kernel tolerates any address and reports failure.
    match unsafe { bpf_probe_read_kernel(ptr) } {
        Ok(segs) if segs > 0 => segs,
        _ => 1,
    }
}
