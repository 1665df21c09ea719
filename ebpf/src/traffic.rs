//! Per-interface packet and byte counters at TC ingress and egress.

use aya_ebpf::{
    bindings::TC_ACT_UNSPEC,
    macros::{classifier, map},
    maps::{HashMap, PerCpuHashMap},
    programs::TcContext,
};
use linkpilot_common::{
    packet::{segment_header_len, wire_bytes, PacketBytes},
    IfaceConfig, IfaceStats, MAX_IFACES,
};

#[map(name = "LP_IFACE_STATS")]
pub(crate) static IFACE_STATS: PerCpuHashMap<u32, IfaceStats> =
    PerCpuHashMap::with_max_entries(MAX_IFACES, 0);

#[map(name = "LP_IFACE_CONFIG")]
static IFACE_CONFIG: HashMap<u32, IfaceConfig> = HashMap::with_max_entries(MAX_IFACES, 0);

struct Skb<'a>(&'a TcContext);

impl PacketBytes for Skb<'_> {
    #[inline(always)]
    fn byte(&self, offset: usize) -> Option<u8> {
        self.0.load::<u8>(offset).ok()
    }
}

#[derive(Clone, Copy)]
enum Direction {
    Rx,
    Tx,
}

#[classifier]
pub fn lp_tc_ingress(ctx: TcContext) -> i32 {
    count(&ctx, Direction::Rx);
    TC_ACT_UNSPEC
}

#[classifier]
pub fn lp_tc_egress(ctx: TcContext) -> i32 {
    count(&ctx, Direction::Tx);
    TC_ACT_UNSPEC
}

#[inline(always)]
fn count(ctx: &TcContext, dir: Direction) {
    // SAFETY: `skb` is the context pointer the kernel passed to this program.
    let (ifindex, gso_segs) = unsafe { ((*ctx.skb.skb).ifindex, (*ctx.skb.skb).gso_segs) };
    // SAFETY: the controller writes this map only with whole values.
    let Some(config) = (unsafe { IFACE_CONFIG.get(ifindex) }) else { return };
    let Some(stats) = IFACE_STATS.get_ptr_mut(ifindex) else { return };
    let segs = gso_segs.max(1);
    let header_len = if segs > 1 { segment_header_len(&Skb(ctx), config.l2) } else { None };
    let bytes = wire_bytes(ctx.len(), segs, header_len);
    // SAFETY: a per-CPU value, written only by programs on this CPU; TC runs with BH disabled.
    let stats = unsafe { &mut *stats };
    match dir {
        Direction::Rx => {
            stats.rx_packets += u64::from(segs);
            stats.rx_bytes += bytes;
        }
        Direction::Tx => {
            stats.tx_packets += u64::from(segs);
            stats.tx_bytes += bytes;
        }
    }
}
