//! TCP connections opening and closing, from `sock:inet_sock_set_state`: counted per (interface,
//! peer), and a closed connection leaves the flow table at once instead of waiting for the LRU.

use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::tracepoint, programs::TracePointContext};
use linkpilot_common::{
    packet::Loss, sock_state_record as rec, tcp_state as st, FlowKey, FlowState,
};

use crate::{
    kernel::{in_watched_netns, Record},
    losses::{flow_table, lost},
    retransmit::LOCAL_ADDRS,
    rtt::{addresses, AddrOffsets, FLOWS},
    traffic::{iface_slot, peer_stats},
};

/// -EEXIST: the flow is there already (tcp_probe saw it first).
const EEXIST: i32 = -17;

const IPPROTO_TCP: u16 = 6;
/// BPF_NOEXIST: never overwrite what tcp_probe already recorded.
const NOEXIST: u64 = 1;

const SOCK_STATE_ADDRS: AddrOffsets = AddrOffsets {
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
    let family: u16 = unsafe { ctx.field(rec::FAMILY)? };
    let Some((local_key, local, remote)) = addresses(ctx, family, &SOCK_STATE_ADDRS)? else {
        return Ok(());
    };
    // SAFETY: the controller writes this map only with whole values.
    let Some(&ifindex) = (unsafe { LOCAL_ADDRS.get(local_key) }) else { return Ok(()) };
    if !in_watched_netns(ctx, rec::SKADDR) {
        return Ok(());
    }
    let peer = crate::peers::peer_of_uncached(&remote);
    if let Some(ps) = iface_slot(ifindex).and_then(|slot| peer_stats(slot, peer)) {
        // SAFETY: a per-CPU value.
        let f = unsafe { &mut (*ps).flows };
        match event {
            Event::ActiveOpen => f.active_opens += 1,
            Event::PassiveOpen => f.passive_opens += 1,
            Event::Close => f.closes += 1,
            Event::FailedOpen => f.failed_opens += 1,
        }
    }
    let (sport, dport): (u16, u16) = unsafe { (ctx.field(rec::SPORT)?, ctx.field(rec::DPORT)?) };
    let key = FlowKey { family, local_port: sport, remote_port: dport, _pad: 0, local, remote };
    match event {
        Event::ActiveOpen | Event::PassiveOpen => {
            // SAFETY: bpf_ktime_get_ns has no preconditions.
            let now = unsafe { bpf_ktime_get_ns() };
            let state = FlowState { last_ns: now, ifindex, peer, ..FlowState::default() };
            match FLOWS.insert(key, state, NOEXIST) {
                Ok(()) => flow_table(false),
                Err(EEXIST) => {}
                Err(_) => lost(ctx, Loss::MapInsertFailed),
            }
        }
        Event::Close | Event::FailedOpen => {
            if FLOWS.remove(key).is_ok() {
                flow_table(true);
            }
        }
    }
    Ok(())
}
