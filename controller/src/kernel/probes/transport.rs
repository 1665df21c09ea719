//! The sock_ops program: attached to a cgroup v2 directory, it gives TCP connections to the
//! policy's peers their link's transport profile, in this process's network namespace and the
//! reporting jobs' own ones it is given (`jobs.rs`).

use std::{collections::BTreeMap, fs::File, os::fd::AsRawFd, path::Path};

use aya::{
    maps::{Array, HashMap, MapData, MapError, PerCpuArray},
    programs::{CgroupAttachMode, SockOps},
};
use linkpilot_common::{
    transport::{
        ManagedSocket, TransportCounters, TransportProfile, MAP_MANAGED_SOCKETS, MAP_TRANSPORT,
        MAP_TRANSPORT_COUNTERS, MAP_TRANSPORT_NETNS, PROG_SOCK_OPS,
    },
    MAX_PEERS,
};

use super::{load_error, map_error, program, take_map, ProbeError, Probes};

/// The attached program's maps.
pub struct SockOpsMaps {
    /// The namespaces (cookies) whose sockets the program acts on.
    pub(super) netns: HashMap<MapData, u64, u32>,
    /// This process's namespace's cookie, always among them.
    pub(super) own_netns: u64,
    profiles: Array<MapData, TransportProfile>,
    managed: HashMap<MapData, u64, ManagedSocket>,
    counters: PerCpuArray<MapData, TransportCounters>,
}

/// This process's network namespace cookie (SO_NETNS_COOKIE, Linux 5.14+), as
/// `bpf_get_netns_cookie` gives it to the program.
pub fn netns_cookie() -> std::io::Result<u64> {
    const SO_NETNS_COOKIE: libc::c_int = 71;
    let s = std::net::UdpSocket::bind("127.0.0.1:0")
        .or_else(|_| std::net::UdpSocket::bind("[::1]:0"))?;
    let mut cookie = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: a valid socket, and an out-buffer of `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cookie)
}

impl Probes {
    /// Loads the sock_ops program, scopes it to this network namespace (and the jobs' given
    /// to [`Probes::set_job_namespaces`]) and attaches it to
    /// `cgroup` (alongside other programs there). The link goes with the process, also on
    /// SIGKILL. Profiles start disabled: nothing changes until [`Probes::set_transport`].
    pub fn attach_sock_ops(&mut self, cgroup: &Path) -> Result<(), ProbeError> {
        let attach_err = |source: aya::programs::ProgramError| ProbeError::Attach {
            program: PROG_SOCK_OPS,
            iface: format!("cgroup {}", cgroup.display()),
            direction: "sock_ops",
            source: Box::new(source),
        };
        let cookie = netns_cookie().map_err(|e| {
            attach_err(aya::programs::ProgramError::IOError(std::io::Error::new(
                e.kind(),
                format!("reading this network namespace's cookie: {e}"),
            )))
        })?;
        let maps = SockOpsMaps {
            netns: take_map(&mut self.ebpf, MAP_TRANSPORT_NETNS)?,
            own_netns: cookie,
            profiles: take_map(&mut self.ebpf, MAP_TRANSPORT)?,
            managed: take_map(&mut self.ebpf, MAP_MANAGED_SOCKETS)?,
            counters: take_map(&mut self.ebpf, MAP_TRANSPORT_COUNTERS)?,
        };
        let file = File::open(cgroup).map_err(|e| attach_err(e.into()))?;
        let prog: &mut SockOps = program(&mut self.ebpf, PROG_SOCK_OPS)?;
        prog.load().map_err(|e| load_error(PROG_SOCK_OPS, e))?;
        // As a link (Linux 5.7+), which the kernel always lets other programs share; the
        // link-create call refuses the legacy "allow multiple" flag.
        prog.attach(file, CgroupAttachMode::Single).map_err(attach_err)?;
        self.sock_ops = Some(maps);
        // This namespace, and the jobs' given before.
        self.sync_transport_netns()
    }

    /// Whether [`Probes::attach_sock_ops`] succeeded.
    pub fn sock_ops_attached(&self) -> bool {
        self.sock_ops.is_some()
    }

    /// Sets peer `peer`'s profile (`enabled` 0: left alone from now on).
    pub fn set_transport(&mut self, peer: u32, p: TransportProfile) -> Result<(), ProbeError> {
        if peer == 0 || peer > MAX_PEERS {
            return Err(ProbeError::PeerId { id: peer });
        }
        let Some(m) = self.sock_ops.as_mut() else { return Ok(()) };
        m.profiles.set(peer, p, 0).map_err(|e| map_error(MAP_TRANSPORT, e))
    }

    /// Per peer id: the counters summed over CPUs, and the connections carrying a profile now
    /// (those whose generation is `current(peer)` and all of them).
    pub fn transport_state(&self) -> Result<BTreeMap<u32, TransportTotals>, ProbeError> {
        let Some(m) = self.sock_ops.as_ref() else { return Ok(BTreeMap::new()) };
        let mut out: BTreeMap<u32, TransportTotals> = BTreeMap::new();
        for &peer in &self.peer_ids {
            let values =
                m.counters.get(&peer, 0).map_err(|e| map_error(MAP_TRANSPORT_COUNTERS, e))?;
            let mut sum = TransportCounters::default();
            for v in values.iter() {
                sum.accumulate(v);
            }
            if sum != TransportCounters::default() {
                out.entry(peer).or_default().counters = sum;
            }
        }
        // One read per peer, not one per connection (there may be tens of thousands).
        let generations: BTreeMap<u32, u32> = self
            .peer_ids
            .iter()
            .filter_map(|&id| m.profiles.get(&id, 0).ok().map(|p| (id, p.generation)))
            .collect();
        let generation = |peer: u32| generations.get(&peer).copied();
        for entry in m.managed.iter() {
            let (_, s) = match entry {
                Ok(e) => e,
                // An entry evicted between the key walk and its read.
                Err(MapError::KeyNotFound) => continue,
                Err(e) => return Err(map_error(MAP_MANAGED_SOCKETS, e)),
            };
            let t = out.entry(s.peer).or_default();
            t.connections += 1;
            if generation(s.peer) == Some(s.generation) {
                t.current += 1;
            }
        }
        Ok(out)
    }
}

/// One peer's transport figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportTotals {
    pub counters: TransportCounters,
    /// Connections carrying a profile now.
    pub connections: u64,
    /// Of those, the ones with the peer's current profile.
    pub current: u64,
}
