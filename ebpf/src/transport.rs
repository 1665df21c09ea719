//! Per-peer transport: a sock_ops program that gives TCP connections to a watched link's peers
//! the profile of the link's state (congestion control, initial windows, a send-window clamp,
//! socket buffers, ECN), in the controller's network namespace and the reporting jobs' own
//! where the policy opts in, and leaves every other connection alone. Established connections are brought up to date at their next RTT sample
//! after the profile changes.

use aya_ebpf::{
    bindings::{
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, BPF_SOCK_OPS_NEEDS_ECN,
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB, BPF_SOCK_OPS_RTT_CB, BPF_SOCK_OPS_RTT_CB_FLAG,
        BPF_SOCK_OPS_RWND_INIT, BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_STATE_CB_FLAG,
    },
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_setsockopt},
    macros::{map, sock_ops},
    maps::{Array, HashMap, LruHashMap, PerCpuArray},
    programs::SockOpsContext,
    EbpfContext,
};
use linkpilot_common::{
    transport::{
        ManagedSocket, TransportCounters, TransportProfile, CC_NAME_LEN, MAX_MANAGED_SOCKETS,
    },
    v4_mapped, MAX_JOB_NAMESPACES, MAX_PEERS, PEER_OTHER,
};

use crate::peers::peer_of_uncached;

#[map(name = "LP_TRANSPORT")]
static PROFILES: Array<TransportProfile> = Array::with_max_entries(MAX_PEERS + 1, 0);

#[map(name = "LP_TRANSPORT_NS")]
static NETNS: HashMap<u64, u32> = HashMap::with_max_entries(MAX_JOB_NAMESPACES + 1, 0);

#[map(name = "LP_MANAGED_SK")]
static MANAGED: LruHashMap<u64, ManagedSocket> =
    LruHashMap::with_max_entries(MAX_MANAGED_SOCKETS, 0);

#[map(name = "LP_TRANSPORT_CNT")]
static COUNTERS: PerCpuArray<TransportCounters> = PerCpuArray::with_max_entries(MAX_PEERS + 1, 0);

const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;
const SOL_SOCKET: i32 = 1;
const SO_SNDBUF: i32 = 7;
const SO_RCVBUF: i32 = 8;
const SOL_TCP: i32 = 6;
const TCP_CONGESTION: i32 = 13;
const TCP_BPF_IW: i32 = 1001;
const TCP_BPF_SNDCWND_CLAMP: i32 = 1002;
const TCP_CLOSE: u32 = 7;

#[sock_ops]
pub fn lp_sock_ops(ctx: SockOpsContext) -> u32 {
    let op = ctx.op();
    // Only ours: the controller's namespace and the reporting jobs' own (none until it says
    // which: nothing is touched).
    // SAFETY: the helper reads the context's socket; valid for every sock_ops callback.
    let netns = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    // SAFETY: the controller writes this map only with whole values.
    if unsafe { NETNS.get(netns) }.is_none() {
        return 1;
    }
    match op {
        BPF_SOCK_OPS_RWND_INIT | BPF_SOCK_OPS_NEEDS_ECN => {
            if let Some(p) = profile_of(&ctx) {
                let reply = if op == BPF_SOCK_OPS_RWND_INIT { p.1.initial_rwnd } else { p.1.ecn };
                if reply != 0 {
                    ctx.set_reply(reply);
                }
            }
        }
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB | BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB => {
            if let Some((peer, p)) = profile_of(&ctx) {
                let refused = apply(&ctx, &p, true);
                // SAFETY: a full socket in the established callbacks.
                let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
                let entry = ManagedSocket { peer, generation: p.generation };
                let _ = MANAGED.insert(cookie, entry, 0);
                // RTT samples bring it up to date after a change; the state callback forgets it.
                let _ = ctx
                    .set_cb_flags((BPF_SOCK_OPS_RTT_CB_FLAG | BPF_SOCK_OPS_STATE_CB_FLAG) as i32);
                count(peer, |c| {
                    c.profiled += 1;
                    c.refused += refused;
                });
            }
        }
        BPF_SOCK_OPS_RTT_CB => {
            // SAFETY: a full socket in the RTT callback.
            let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
            let Some(m) = MANAGED.get_ptr_mut(cookie) else { return 1 };
            // SAFETY: a valid map value; only this socket's callbacks (serialized by its lock)
            // write it.
            let m = unsafe { &mut *m };
            let Some(p) = PROFILES.get(m.peer) else { return 1 };
            if p.generation != m.generation {
                let p = *p;
                m.generation = p.generation;
                let refused = if p.enabled != 0 { apply(&ctx, &p, false) } else { 0 };
                let peer = m.peer;
                count(peer, |c| {
                    c.updated += 1;
                    c.refused += refused;
                });
            }
        }
        BPF_SOCK_OPS_STATE_CB if ctx.arg(1) == TCP_CLOSE => {
            // SAFETY: the state callback's socket.
            let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
            // SAFETY: the value is copied out before the entry is removed.
            if let Some(peer) = unsafe { MANAGED.get(cookie) }.map(|m| m.peer) {
                let _ = MANAGED.remove(cookie);
                count(peer, |c| c.closed += 1);
            }
        }
        _ => {}
    }
    1
}

/// The peer of the connection's remote address and its profile, if that peer's is enabled.
#[inline(always)]
fn profile_of(ctx: &SockOpsContext) -> Option<(u32, TransportProfile)> {
    let addr = match ctx.family() {
        AF_INET => v4_mapped(ctx.remote_ip4().to_ne_bytes()),
        AF_INET6 => {
            // Each word at its own constant offset: the verifier refuses loads through a
            // context pointer the code moved ("modified ctx ptr"), as a copy of the array does.
            // SAFETY: fields of the context the kernel gave this program.
            let w = unsafe {
                let ip6 = core::ptr::addr_of!((*ctx.ops).remote_ip6);
                [
                    core::ptr::read_volatile(core::ptr::addr_of!((*ip6)[0])),
                    core::ptr::read_volatile(core::ptr::addr_of!((*ip6)[1])),
                    core::ptr::read_volatile(core::ptr::addr_of!((*ip6)[2])),
                    core::ptr::read_volatile(core::ptr::addr_of!((*ip6)[3])),
                ]
            };
            let mut a = [0u8; 16];
            a[..4].copy_from_slice(&w[0].to_ne_bytes());
            a[4..8].copy_from_slice(&w[1].to_ne_bytes());
            a[8..12].copy_from_slice(&w[2].to_ne_bytes());
            a[12..].copy_from_slice(&w[3].to_ne_bytes());
            a
        }
        _ => return None,
    };
    let peer = peer_of_uncached(&addr);
    if peer == PEER_OTHER {
        return None;
    }
    let p = PROFILES.get(peer)?;
    (p.enabled != 0).then_some((peer, *p))
}

/// Sets the profile's options on the connection; returns how many the kernel refused. The
/// initial window only on a new connection (it means nothing once data has flowed).
#[inline(always)]
fn apply(ctx: &SockOpsContext, p: &TransportProfile, new: bool) -> u64 {
    let mut refused = 0;
    if p.congestion_control[0] != 0 {
        let mut name = p.congestion_control;
        refused += set(ctx, SOL_TCP, TCP_CONGESTION, name.as_mut_ptr(), CC_NAME_LEN as i32);
    }
    let mut int = |level: i32, opt: i32, v: u32| {
        if v != 0 {
            let mut v = v as i32;
            refused += set(ctx, level, opt, (&mut v as *mut i32).cast(), 4);
        }
    };
    if new {
        int(SOL_TCP, TCP_BPF_IW, p.initial_cwnd);
    }
    int(SOL_TCP, TCP_BPF_SNDCWND_CLAMP, p.sndcwnd_clamp);
    int(SOL_SOCKET, SO_SNDBUF, p.socket_buffer);
    int(SOL_SOCKET, SO_RCVBUF, p.socket_buffer);
    refused
}

#[inline(always)]
fn set(ctx: &SockOpsContext, level: i32, opt: i32, val: *mut u8, len: i32) -> u64 {
    // SAFETY: `val` points to `len` readable bytes on this program's stack.
    let r = unsafe { bpf_setsockopt(ctx.as_ptr(), level, opt, val.cast(), len) };
    u64::from(r != 0)
}

#[inline(always)]
fn count(peer: u32, f: impl FnOnce(&mut TransportCounters)) {
    if let Some(c) = COUNTERS.get_ptr_mut(peer) {
        // SAFETY: this CPU's copy; sock_ops callbacks do not nest on a CPU.
        f(unsafe { &mut *c });
    }
}
