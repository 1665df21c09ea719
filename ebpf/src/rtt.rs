//! Smoothed RTT per flow and per (interface, peer) from `tcp:tcp_probe`, which fires for every
//! segment an established socket receives and carries `srtt_us >> 3`. Chosen over sockops RTT
//! callbacks because it sees flows that existed before linkpilot started and needs no cgroup.

use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::tracepoint, programs::TracePointContext};
use linkpilot_common::{
    probe_record as rec, v4_mapped, FlowKey, FlowState, LocalAddr, PeerStats, AF_INET, AF_INET6,
};

use crate::{
    jobs::flow_iface,
    kernel::Record,
    losses::{flow_table, lost},
    maps::{iface_slot, peer_stats, FLOWS},
};
use linkpilot_common::packet::Loss;

#[tracepoint]
pub fn lp_tcp_probe(ctx: TracePointContext) -> u32 {
    // A failed read loses one sample; nothing better to do in a tracepoint.
    let _ = try_probe(&ctx);
    0
}

/// Where a TCP tracepoint record keeps the socket's fields: family, `struct sock *`, ports, and
/// the local and remote addresses per family.
pub(crate) struct SockOffsets {
    pub family: usize,
    pub skaddr: usize,
    pub sport: usize,
    pub dport: usize,
    pub local4: usize,
    pub remote4: usize,
    pub local6: usize,
    pub remote6: usize,
}

/// A TCP tracepoint record's flow: its key, the interface and network namespace of its local
/// address, its peer, and that peer's counters on the interface (None: not a watched one).
pub(crate) struct RecordFlow {
    pub key: FlowKey,
    pub ifindex: u32,
    pub netns: u32,
    pub peer: u32,
    pub stats: Option<*mut PeerStats>,
}

/// The record's flow; `None` for a family other than IPv4 and IPv6, or a local address that
/// is not a watched interface's.
#[inline(always)]
pub(crate) fn record_flow(
    ctx: &TracePointContext,
    off: &SockOffsets,
) -> Result<Option<RecordFlow>, i64> {
    // SAFETY (all reads): offsets within the record, checked against tracefs at load time.
    let family: u16 = unsafe { ctx.field(off.family)? };
    let Some((local_key, local, remote)) = addresses(ctx, family, off)? else {
        return Ok(None);
    };
    let sk: u64 = unsafe { ctx.field(off.skaddr)? };
    let Some((ifindex, netns)) = flow_iface(sk, &local_key) else { return Ok(None) };
    let peer = crate::peers::peer_of_uncached(&remote);
    let stats = iface_slot(ifindex).and_then(|slot| peer_stats(slot, peer));
    let (sport, dport): (u16, u16) = unsafe { (ctx.field(off.sport)?, ctx.field(off.dport)?) };
    let key = FlowKey { family, local_port: sport, remote_port: dport, _pad: 0, local, remote };
    Ok(Some(RecordFlow { key, ifindex, netns, peer, stats }))
}

/// (local-address map key, local address, remote address), the last two IPv4-mapped.
pub(crate) type Addresses = (LocalAddr, [u8; 16], [u8; 16]);

/// The record's local address as a local-address map key, and both addresses as flow keys
/// (IPv4-mapped). Reads only the fields of the record's family; `None` for other families.
#[inline(always)]
pub(crate) fn addresses(
    ctx: &TracePointContext,
    family: u16,
    off: &SockOffsets,
) -> Result<Option<Addresses>, i64> {
    // SAFETY (reads): offsets within the record, checked against tracefs at load time.
    if family == AF_INET {
        let (l, r): ([u8; 4], [u8; 4]) =
            unsafe { (ctx.field(off.local4)?, ctx.field(off.remote4)?) };
        Ok(Some(v4_addresses(l, r)))
    } else if family == AF_INET6 {
        let (l, r): ([u8; 16], [u8; 16]) =
            unsafe { (ctx.field(off.local6)?, ctx.field(off.remote6)?) };
        Ok(Some(v6_addresses(l, r)))
    } else {
        Ok(None)
    }
}

/// [`Addresses`] of an IPv4 socket's local and remote address.
#[inline(always)]
pub(crate) fn v4_addresses(l: [u8; 4], r: [u8; 4]) -> Addresses {
    let mut la = LocalAddr { family: AF_INET, _pad: 0, addr: [0; 16] };
    la.addr[..4].copy_from_slice(&l);
    (la, v4_mapped(l), v4_mapped(r))
}

/// [`Addresses`] of an IPv6 socket's local and remote address.
#[inline(always)]
pub(crate) fn v6_addresses(l: [u8; 16], r: [u8; 16]) -> Addresses {
    let mut la = LocalAddr { family: AF_INET6, _pad: 0, addr: l };
    if l[..12] == V4_MAPPED_PREFIX {
        // A dual-stack socket carrying IPv4: its local address is an IPv4 one.
        la.family = AF_INET;
        la.addr = [0; 16];
        la.addr[..4].copy_from_slice(&l[12..]);
    }
    (la, l, r)
}

const V4_MAPPED_PREFIX: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];

/// sockaddr_in keeps the address at +4, sockaddr_in6 at +8.
const PROBE_SOCK: SockOffsets = SockOffsets {
    family: rec::FAMILY,
    skaddr: rec::SKADDR,
    sport: rec::SPORT,
    dport: rec::DPORT,
    local4: rec::SADDR + 4,
    remote4: rec::DADDR + 4,
    local6: rec::SADDR + 8,
    remote6: rec::DADDR + 8,
};

#[inline(always)]
fn try_probe(ctx: &TracePointContext) -> Result<(), i64> {
    // SAFETY (all reads): offsets within the record, checked against tracefs at load time.
    let (snd_nxt, snd_una): (u32, u32) =
        unsafe { (ctx.field(rec::SND_NXT)?, ctx.field(rec::SND_UNA)?) };
    if snd_nxt == snd_una {
        return Ok(()); // nothing in flight: this end is not refreshing its RTT
    }
    let srtt: u32 = unsafe { ctx.field(rec::SRTT)? };
    if srtt == 0 {
        return Ok(());
    }
    let Some(RecordFlow { key, ifindex, netns, peer, stats }) = record_flow(ctx, &PROBE_SOCK)?
    else {
        return Ok(());
    };
    if let Some(ps) = stats {
        // SAFETY: a per-CPU value.
        let rtt = unsafe { &mut (*ps).rtt };
        let us = u64::from(srtt);
        rtt.samples += 1;
        rtt.sum_us += us;
        if rtt.min_us == 0 || us < rtt.min_us {
            rtt.min_us = us;
        }
        if us > rtt.max_us {
            rtt.max_us = us;
        }
    }
    let cwnd: u32 = unsafe { ctx.field(rec::SND_CWND)? };
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    match FLOWS.get_ptr_mut(key) {
        Some(f) => {
            // SAFETY: an LRU value; a concurrent update of the same flow on another CPU can
            // interleave fields, which costs at most one sample's accuracy.
            let f = unsafe { &mut *f };
            f.srtt_us = srtt;
            if srtt < f.min_srtt_us || f.min_srtt_us == 0 {
                f.min_srtt_us = srtt;
            }
            burst_sample(f, srtt, snd_una, now);
            f.rtt_samples += 1;
            f.last_ns = now;
            f.snd_cwnd = cwnd;
            f.snd_nxt = snd_nxt;
        }
        None => {
            let state = FlowState {
                srtt_us: srtt,
                min_srtt_us: srtt,
                rtt_samples: 1,
                retrans_segs: 0,
                last_ns: now,
                ifindex,
                peer,
                snd_cwnd: cwnd,
                snd_nxt,
                netns,
                ..FlowState::default()
            };
            match FLOWS.insert(key, state, 0) {
                Ok(()) => flow_table(false),
                Err(_) => lost(ctx, Loss::MapInsertFailed),
            }
        }
    }
    Ok(())
}

/// The first RTT sample of each burst: a segment sent after the flow's flight emptied queued
/// behind others' traffic only. The record carries the smoothed RTT from before this segment's
/// ACK is processed, so a burst notes the value it starts from and the first value that moves
/// gives the sample: the kernel adds `m - srtt/8` to `8 * srtt`, hence `m = 8 * s1 - 7 * s0`
/// to within 8 us of rounding.
#[inline(always)]
fn burst_sample(f: &mut FlowState, srtt: u32, snd_una: u32, now: u64) {
    if f.burst_from_us != 0 && srtt != f.burst_from_us {
        let m = (8 * i64::from(srtt) - 7 * i64::from(f.burst_from_us)).max(1);
        f.burst_rtt_us = m.min(i64::from(u32::MAX)) as u32;
        f.burst_ns = now;
        f.burst_from_us = 0;
    }
    // Everything in flight at the last sample acknowledged since (sequence space wraps).
    if f.rtt_samples > 0 && snd_una.wrapping_sub(f.snd_nxt) as i32 >= 0 {
        f.burst_from_us = srtt;
    }
}
