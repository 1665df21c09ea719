//! Which watched interface a TCP socket's flow counts on: in the watched network namespace, the
//! one owning the socket's local address; in the own namespace of a reporting job (a pod's,
//! whose addresses no watched interface owns), the one the controller named for it.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap},
};
use linkpilot_common::{LocalAddr, MAX_JOB_NAMESPACES};

use crate::{
    kernel::{sock_netns, watched_netns},
    maps::LOCAL_ADDRS,
};

#[map(name = "LP_JOB_NETNS")]
static JOB_NETNS: HashMap<u32, u32> = HashMap::with_max_entries(MAX_JOB_NAMESPACES, 0);

#[map(name = "LP_JOB_NETNS_N")]
static JOB_NETNS_COUNT: Array<u32> = Array::with_max_entries(1, 0);

/// The ifindex of the watched interface socket `sk` (local address `local`) counts on, and the
/// socket's namespace (0: not read, when no namespace is checked); None for a socket of neither
/// the watched namespace nor a job's.
#[inline(always)]
pub(crate) fn flow_iface(sk: u64, local: &LocalAddr) -> Option<(u32, u32)> {
    // SAFETY: the controller writes this map only with whole values.
    if let Some(&ifindex) = unsafe { LOCAL_ADDRS.get(local) } {
        let Some(want) = watched_netns() else { return Some((ifindex, 0)) };
        let netns = sock_netns(sk)?;
        if netns == want {
            return Some((ifindex, netns));
        }
        // The address reused in another namespace (the lab's hosts): a job's, or no one's.
        return job_iface(netns);
    }
    // Most sockets of the host: no read of their namespace while no job has one of its own.
    if JOB_NETNS_COUNT.get(0).copied().unwrap_or(0) == 0 {
        return None;
    }
    job_iface(sock_netns(sk)?)
}

#[inline(always)]
fn job_iface(netns: u32) -> Option<(u32, u32)> {
    // SAFETY: the controller writes this map only with whole values.
    unsafe { JOB_NETNS.get(netns) }.map(|&ifindex| (ifindex, netns))
}
