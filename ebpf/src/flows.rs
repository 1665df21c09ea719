//! TCP connections opening and closing, from `sock:inet_sock_set_state`: counted per (interface,
//! peer), and a closed connection leaves the flow table at once instead of waiting for the LRU.
//! The ingress classifier adds each flow's received congestion marks ([`count_marks`]).

use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::tracepoint, programs::TracePointContext};
use linkpilot_common::{
    packet::{Headers, Loss},
    sock_state_record as rec, tcp_state as st, FlowKey, FlowState, AF_INET, AF_INET6,
};

use crate::{
    kernel::Record,
    losses::{flow_table, lost},
    maps::FLOWS,
    rtt::{record_flow, RecordFlow, SockOffsets},
};

/// -EEXIST: the flow is there already (tcp_probe saw it first).
const EEXIST: i32 = -17;
/// -ENOENT: the flow is not there (evicted, or opened before the program was attached).
const ENOENT: i32 = -2;

const IPPROTO_TCP: u16 = 6;
/// BPF_NOEXIST: never overwrite what tcp_probe already recorded.
const NOEXIST: u64 = 1;

const SOCK_STATE: SockOffsets = SockOffsets {
    family: rec::FAMILY,
    skaddr: rec::SKADDR,
    sport: rec::SPORT,
    dport: rec::DPORT,
    local4: rec::SADDR,
    remote4: rec::DADDR,
    local6: rec::SADDR_V6,
    remote6: rec::DADDR_V6,
};

#[tracepoint]
pub fn lp_sock_state(ctx: TracePointContext) -> u32 {
    // A failed read loses one event; nothing better to do in a tracepoint.
    let _ = try_state(&ctx);
    0
}

/// What a transition means for the counters.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Event {
    ActiveOpen,
    PassiveOpen,
    Close,
    FailedOpen,
}

#[inline(always)]
fn classify(old: i32, new: i32) -> Option<Event> {
    match (old, new) {
        (st::SYN_SENT, st::ESTABLISHED) => Some(Event::ActiveOpen),
        (st::SYN_RECV, st::ESTABLISHED) => Some(Event::PassiveOpen),
        (st::SYN_SENT, st::CLOSE) => Some(Event::FailedOpen),
        // Every state an established connection passes through on its way out; the full
        // socket reaches CLOSE exactly once (TIME_WAIT lives on in a separate minisock).
        (
            st::ESTABLISHED
            | st::FIN_WAIT1
            | st::FIN_WAIT2
            | st::CLOSE_WAIT
            | st::LAST_ACK
            | st::CLOSING,
            st::CLOSE,
        ) => Some(Event::Close),
        _ => None,
    }
}

#[inline(always)]
fn try_state(ctx: &TracePointContext) -> Result<(), i64> {
    // SAFETY (all reads): offsets within the record, checked against tracefs at load time.
    let (protocol, old, new): (u16, i32, i32) = unsafe {
        (ctx.field(rec::PROTOCOL)?, ctx.field(rec::OLDSTATE)?, ctx.field(rec::NEWSTATE)?)
    };
    if protocol != IPPROTO_TCP {
        return Ok(());
    }
    let Some(event) = classify(old, new) else { return Ok(()) };
    let Some(RecordFlow { key, ifindex, netns, peer, stats }) = record_flow(ctx, &SOCK_STATE)?
    else {
        return Ok(());
    };
    if let Some(ps) = stats {
        // SAFETY: a per-CPU value.
        let f = unsafe { &mut (*ps).flows };
        match event {
            Event::ActiveOpen => f.active_opens += 1,
            Event::PassiveOpen => f.passive_opens += 1,
            Event::Close => f.closes += 1,
            Event::FailedOpen => f.failed_opens += 1,
        }
    }
    match event {
        Event::ActiveOpen | Event::PassiveOpen => {
            // SAFETY: bpf_ktime_get_ns has no preconditions.
            let now = unsafe { bpf_ktime_get_ns() };
            let state = FlowState { last_ns: now, ifindex, peer, netns, ..FlowState::default() };
            match FLOWS.insert(key, state, NOEXIST) {
                Ok(()) => flow_table(false),
                Err(EEXIST) => {}
                Err(_) => lost(ctx, Loss::MapInsertFailed),
            }
        }
        Event::Close | Event::FailedOpen => match FLOWS.remove(key) {
            Ok(()) => flow_table(true),
            Err(ENOENT) => {}
            Err(_) => lost(ctx, Loss::MapRemoveFailed),
        },
    }
    Ok(())
}

/// Counts a received segment's CE mark or ECE flag on its flow, if the flow is in the table:
/// which marks fall on whose flows (a job's or others'). Only marked segments pay the lookup.
#[inline(always)]
pub(crate) fn count_marks(h: &Headers, segs: u64) {
    let ce = h.tos & 3 == 3;
    let ece = h.tcp_flags & 0x40 != 0;
    if !(ce || ece) {
        return;
    }
    // Received: the packet's destination is this host's end of the flow.
    let mut key = FlowKey {
        family: if h.version == 4 { AF_INET } else { AF_INET6 },
        local_port: h.dport,
        remote_port: h.sport,
        _pad: 0,
        local: h.dst,
        remote: h.src,
    };
    let mut f = FLOWS.get_ptr_mut(key);
    if f.is_none() && h.version == 4 {
        // A dual-stack (AF_INET6) socket speaking IPv4 is keyed by its family.
        key.family = AF_INET6;
        f = FLOWS.get_ptr_mut(key);
    }
    let Some(f) = f else { return };
    // SAFETY: an LRU value. Plain adds (this target has no atomic read-modify-write in
    // `core`): a flow's segments are received on one CPU at a time (its RX queue's, kept by
    // RSS/RPS), so two CPUs adding to one flow at once is rare and loses one count.
    let f = unsafe { &mut *f };
    if ce {
        f.ce_segs += segs;
    }
    if ece {
        f.ece_segs += segs;
    }
}
