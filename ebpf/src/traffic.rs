//! Per-interface and per-peer counters at TC ingress and egress: packets, bytes, ECN codepoints,
//! TCP ECE/CWR, egress DSCP (and its rewrite), RoCEv2 transport signals.

use crate::{
    losses::lost,
    maps::{iface_config, peer_stats, IFACE_STATS},
    peers::peer_of,
};
use core::ffi::c_void;

use aya_ebpf::{
    bindings::TC_ACT_UNSPEC,
    helpers::generated::bpf_loop,
    macros::{classifier, map},
    maps::{Array, LruHashMap, PerCpuArray},
    programs::TcContext,
};
use linkpilot_common::{
    fixed::{parse_fixed, Linear},
    packet::{
        parse, parse_bth, psn_repeated, unparsed_loss, wire_bytes, Headers, Loss, PacketBytes,
        CNP_OPCODE, ROCEV2_PORT,
    },
    DirCounters, DscpRule, PeerStats, QpKey, RoceCounters, MAX_DSCP_RULES, MAX_ROCE_QPS,
};

/// Egress DSCP rewrite rules, compacted: the first disabled slot ends the list.
#[map(name = "LP_DSCP_RULES")]
static DSCP_RULES: Array<DscpRule> = Array::with_max_entries(MAX_DSCP_RULES, 0);

/// Bytes of the packet the parser sees: enough for Ethernet + VLAN + IPv6 + one extension header
/// + TCP with options. Headers beyond it are "unparsed", never guessed.
const HEADER_BYTES: usize = 128;

/// Per-CPU scratch space for the packet's first bytes (the BPF stack is 512 bytes).
#[map(name = "LP_SCRATCH")]
static SCRATCH: PerCpuArray<[u8; HEADER_BYTES]> = PerCpuArray::with_max_entries(1, 0);

/// The slow path: the packet's first bytes, copied with one `bpf_skb_load_bytes` (which also
/// reads non-linear skbs), for what the fast path ([`Direct`]) does not take.
struct Head<'a> {
    bytes: &'a [u8; HEADER_BYTES],
    len: usize,
}

impl<'a> Head<'a> {
    #[inline(always)]
    fn load(ctx: &TcContext) -> Option<Self> {
        let buf = SCRATCH.get_ptr_mut(0)?;
        // SAFETY: per-CPU scratch, used only by this program invocation on this CPU.
        let buf: &'a mut [u8; HEADER_BYTES] = unsafe { &mut *buf };
        let len = (ctx.len() as usize).min(HEADER_BYTES);
        if len == 0 {
            return None;
        }
        let n = ctx.load_bytes(0, &mut buf[..len]).ok()?;
        Some(Head { bytes: buf, len: n })
    }
}

/// Byte `offset` of a copy holding `len` valid bytes.
#[inline(always)]
fn copied_byte(bytes: &[u8], len: usize, offset: usize) -> Option<u8> {
    if offset < len {
        bytes.get(offset).copied()
    } else {
        None
    }
}

impl PacketBytes for Head<'_> {
    #[inline(always)]
    fn byte(&self, offset: usize) -> Option<u8> {
        copied_byte(self.bytes, self.len, offset)
    }

    #[inline(always)]
    fn bytes16(&self, offset: usize) -> Option<[u8; 16]> {
        if offset + 16 > self.len || offset > HEADER_BYTES - 16 {
            return None;
        }
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.bytes[offset..offset + 16]);
        Some(a)
    }
}

/// The fast path: the skb's linear data read in place. Each read checks its own constant
/// offset against `data_end` and reads through the pointer it checked, the shape the verifier
/// follows (a check on a derived integer, which LLVM produces when several reads share one
/// check, is lost on it).
struct Direct {
    data: usize,
    end: usize,
    len: usize,
}

impl Linear for Direct {
    #[inline(always)]
    fn read<const N: usize>(&self, off: usize) -> Option<[u8; N]> {
        let at = self.data + off;
        if at + N > self.end {
            return None;
        }
        // SAFETY: `at..at + N` lies within the linear data, checked above.
        Some(unsafe { core::ptr::read_unaligned(at as *const [u8; N]) })
    }

    #[inline(always)]
    fn packet_len(&self) -> usize {
        self.len
    }
}

/// Up to 16 bytes from `at` (a RoCEv2 BTH and AETH), copied, for the BTH parser.
struct Bytes16 {
    bytes: [u8; 16],
    len: usize,
}

impl Bytes16 {
    /// Loads 16 bytes, or the 12 of a BTH alone when fewer are left (a RoCEv2 packet ends with
    /// a 4-byte ICRC, so a whole one always has 16): fixed sizes, as the verifier wants them.
    #[inline(always)]
    fn load(ctx: &TcContext, at: usize) -> Self {
        let mut b = Bytes16 { bytes: [0; 16], len: 0 };
        let left = (ctx.len() as usize).saturating_sub(at);
        if left >= 16 {
            if let Ok(bytes) = ctx.load::<[u8; 16]>(at) {
                b = Bytes16 { bytes, len: 16 };
            }
        } else if left >= 12 {
            if let Ok(bth) = ctx.load::<[u8; 12]>(at) {
                b.bytes[..12].copy_from_slice(&bth);
                b.len = 12;
            }
        }
        b
    }
}

impl PacketBytes for Bytes16 {
    #[inline(always)]
    fn byte(&self, offset: usize) -> Option<u8> {
        copied_byte(&self.bytes, self.len, offset)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Rx = 0,
    Tx = 1,
}

#[map(name = "LP_ROCE_QPS")]
static ROCE_QPS: LruHashMap<QpKey, u32> = LruHashMap::with_max_entries(MAX_ROCE_QPS, 0);

const IPPROTO_UDP: u8 = 17;
const IPPROTO_TCP: u8 = 6;

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
    let Some((l2, slot)) = iface_config(ifindex) else { return };
    let Some(stats) = IFACE_STATS.get_ptr_mut(slot) else { return };
    // A zeroed `Headers` (version 0) for non-IP rather than an Option: LLVM fills the None arm
    // of an Option with whatever register is at hand, which the verifier rejects as pointer
    // arithmetic when that register holds a pointer.
    let mut h = Headers::default();
    let direct = Direct { data: ctx.data(), end: ctx.data_end(), len: ctx.len() as usize };
    if !parse_fixed(&direct, l2, &mut h) {
        h = slow_parse(ctx, l2);
    }
    let segs = gso_segs.max(1);
    let header_len = (segs > 1 && h.header_len != 0).then_some(usize::from(h.header_len));
    let bytes = wire_bytes(ctx.len(), segs, header_len);
    let segs = u64::from(segs);
    // SAFETY: a per-CPU value, written only by programs on this CPU; TC runs with BH disabled.
    let stats = unsafe { &mut *stats };
    match dir {
        Direction::Rx => {
            stats.rx_packets += segs;
            stats.rx_bytes += bytes;
        }
        Direction::Tx => {
            stats.tx_packets += segs;
            stats.tx_bytes += bytes;
        }
    }
    if h.version == 0 {
        match dir {
            Direction::Rx => stats.rx_unknown += segs,
            Direction::Tx => stats.tx_unknown += segs,
        }
        return;
    }
    let remote = if dir == Direction::Rx { h.src } else { h.dst };
    let peer = peer_of(&remote);
    if dir == Direction::Tx {
        if let Some(new_tos) = rewrite_dscp(ctx, &mut h, ifindex, peer) {
            h.tos = new_tos;
            stats.tx_dscp_rewritten += segs;
        }
    }
    let Some(ps) = peer_stats(slot, peer) else { return };
    // SAFETY: a per-CPU value, as above.
    let ps = unsafe { &mut *ps };
    count_peer(ps, dir, &h, segs, bytes);
    if dir == Direction::Rx && h.proto == IPPROTO_TCP && h.l4 != 0 {
        crate::flows::count_marks(&h, segs);
    }
    if h.proto == IPPROTO_UDP && h.l4 != 0 && h.dport == ROCEV2_PORT {
        let roce = if dir == Direction::Rx { &mut ps.rx_roce } else { &mut ps.tx_roce };
        let qp = QpKey { ifindex, direction: dir as u32, dest_qp: 0, remote };
        count_roce(ctx, roce, &h, qp);
    }
}

/// The slow path: any layout the parser knows, from a copy of the first bytes; says what it
/// loses.
#[inline(always)]
fn slow_parse(ctx: &TcContext, l2: u32) -> Headers {
    let Some(head) = Head::load(ctx) else { return Headers::default() };
    let h = parse(&head, l2).unwrap_or_default();
    if h.version == 0 {
        if let Some(kind) = unparsed_loss(&head, l2) {
            lost(ctx, kind);
        }
    } else if h.truncated {
        lost(ctx, Loss::TruncatedHeader);
    }
    h
}

/// RoCEv2: BTH class, CNPs, AETH ACK/NAK syndromes, and repeated PSNs per destination QP.
#[inline(always)]
fn count_roce(ctx: &TcContext, r: &mut RoceCounters, h: &Headers, mut qp: QpKey) {
    r.packets += 1;
    let bth = Bytes16::load(ctx, usize::from(h.l4) + 8);
    let Some(b) = parse_bth(&bth, 0) else {
        r.truncated += 1;
        return;
    };
    r.by_class[b.class() & 7] += 1;
    if b.opcode == CNP_OPCODE {
        r.cnp += 1;
        return;
    }
    if b.syndrome != 0xff {
        match (b.syndrome >> 5) & 3 {
            0 => r.ack += 1,
            1 => r.nak_rnr += 1,
            3 if b.syndrome & 0x1f == 0 => r.nak_psn_seq += 1,
            _ => r.nak_other += 1,
        }
    }
    if b.is_ack() {
        return;
    }
    qp.dest_qp = b.dest_qp;
    // The last PSN updated in place: an insert (a second hash walk, and an LRU list update)
    // only for a QP not seen before.
    match ROCE_QPS.get_ptr_mut(qp) {
        // SAFETY: a plain u32; a concurrent update of the same QP on another CPU is one
        // store against another, either PSN being a recent one.
        Some(last) => unsafe {
            if psn_repeated(*last, b.psn) {
                r.retransmitted += 1;
            } else {
                *last = b.psn;
            }
        },
        None => {
            if ROCE_QPS.insert(qp, b.psn, 0).is_err() {
                lost(ctx, Loss::MapInsertFailed);
            }
        }
    }
}

/// State of the DSCP rule scan, shared with its `bpf_loop` callback.
#[repr(C)]
struct RuleScan {
    ifindex: u32,
    peer: u32,
    sport: u16,
    dport: u16,
    /// The first matching rule's DSCP, or -1.
    dscp: i32,
}

/// One step of the rule scan: 0 to go on, 1 to stop.
extern "C" fn scan_rule(i: u32, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `RuleScan` that `rewrite_dscp` passed to bpf_loop.
    let scan = unsafe { &mut *ctx.cast::<RuleScan>() };
    let Some(rule) = DSCP_RULES.get(i) else { return 1 };
    if rule.enabled == 0 {
        return 1;
    }
    if rule.matches(scan.ifindex, scan.peer, scan.sport, scan.dport) {
        scan.dscp = i32::from(rule.dscp & 0x3f);
        return 1;
    }
    0
}

/// Applies the first DSCP rule of this interface that matches an egress packet, keeping the ECN
/// bits and fixing the IPv4 header checksum. Returns the new TOS byte if the packet changed. The scan runs in
/// `bpf_loop`, whose callback the verifier checks once rather than once per unrolled rule and
/// path through the parser.
#[inline(always)]
fn rewrite_dscp(ctx: &TcContext, h: &mut Headers, ifindex: u32, peer: u32) -> Option<u8> {
    // No rules (the list is compacted): no scan.
    if DSCP_RULES.get(0).is_none_or(|r| r.enabled == 0) {
        return None;
    }
    let mut scan = RuleScan { ifindex, peer, sport: h.sport, dport: h.dport, dscp: -1 };
    // SAFETY: the callback and its context are valid for the duration of the call.
    unsafe {
        bpf_loop(MAX_DSCP_RULES, scan_rule as *mut c_void, (&raw mut scan).cast::<c_void>(), 0)
    };
    let dscp = u8::try_from(scan.dscp).ok();
    let tos = (dscp? << 2) | (h.tos & 3);
    if tos == h.tos {
        return None;
    }
    let l3 = usize::from(h.l3);
    if h.version == 4 {
        // The checksum covers 16-bit words: replace the (version/IHL, TOS) word.
        let old: [u8; 2] = ctx.load(l3).ok()?;
        let new = [old[0], tos];
        ctx.store(l3 + 1, &tos, 0).ok()?;
        let (from, to) = (u16::from_ne_bytes(old), u16::from_ne_bytes(new));
        ctx.l3_csum_replace(l3 + 10, u64::from(from), u64::from(to), 2).ok()?;
    } else {
        // Traffic class straddles the first two bytes; IPv6 has no header checksum.
        let old: [u8; 2] = ctx.load(l3).ok()?;
        let new = [(old[0] & 0xf0) | (tos >> 4), (tos << 4) | (old[1] & 0x0f)];
        ctx.store(l3, &new, 0).ok()?;
    }
    Some(tos)
}

#[inline(always)]
fn count_peer(ps: &mut PeerStats, dir: Direction, h: &Headers, segs: u64, bytes: u64) {
    let d: &mut DirCounters = if dir == Direction::Rx { &mut ps.rx } else { &mut ps.tx };
    d.packets += segs;
    d.bytes += bytes;
    d.ecn[usize::from(h.tos & 3)] += segs;
    if h.l4 == 0 {
        d.unparsed += segs;
    }
    if h.tcp_flags & 0x40 != 0 {
        d.tcp_ece += segs;
    }
    if h.tcp_flags & 0x80 != 0 {
        d.tcp_cwr += segs;
    }
    if dir == Direction::Tx {
        ps.tx_dscp[usize::from(h.tos >> 2)] += segs;
    }
}

/// Does nothing: the baseline that `linkpilot bench-programs` subtracts (the cost of the
/// BPF_PROG_TEST_RUN harness itself). Never attached.
#[classifier]
pub fn lp_tc_noop(_ctx: TcContext) -> i32 {
    TC_ACT_UNSPEC
}
