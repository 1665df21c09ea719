//! The own network namespaces of reporting jobs (pods without the host's network), where a
//! policy opts in: the tracepoints count their flows on the interface named for each, and the
//! sock_ops program gives their connections to the peers the same profile as the host's.

use std::collections::{BTreeMap, BTreeSet};

use aya::maps::{Array, HashMap, MapData};
use linkpilot_common::{
    transport::MAP_TRANSPORT_NETNS, MAP_JOB_NETNS, MAP_JOB_NETNS_COUNT, MAX_JOB_NAMESPACES,
};

use super::{map_error, take_map, ProbeError, Probes};

/// One job namespace as the programs know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct JobNetns {
    /// Its inode number (`/proc/PID/ns/net`): how the tracepoints tell a socket's namespace.
    pub inum: u32,
    /// Its cookie (`SO_NETNS_COOKIE`): how the sock_ops program does.
    pub cookie: u64,
    /// The watched interface its flows count on.
    pub ifindex: u32,
}

/// The tracepoints' maps of job namespaces.
pub struct JobNetnsMaps {
    netns: HashMap<MapData, u32, u32>,
    count: Array<MapData, u32>,
}

impl Probes {
    /// Makes the programs' job namespaces exactly `want` (the first [`MAX_JOB_NAMESPACES`]). The sock_ops program's share is set only once it
    /// is attached: [`Probes::attach_sock_ops`] takes the namespaces given before.
    pub fn set_job_namespaces(&mut self, want_all: &BTreeSet<JobNetns>) -> Result<(), ProbeError> {
        if self.job_netns.is_none() {
            self.job_netns = Some(JobNetnsMaps {
                netns: take_map(&mut self.ebpf, MAP_JOB_NETNS)?,
                count: take_map(&mut self.ebpf, MAP_JOB_NETNS_COUNT)?,
            });
        }
        let maps = self.job_netns.as_mut().expect("taken above");
        let err = |e| map_error(MAP_JOB_NETNS, e);
        let want: BTreeMap<u32, u32> = want_all
            .iter()
            .take(MAX_JOB_NAMESPACES as usize)
            .map(|n| (n.inum, n.ifindex))
            .collect();
        let have: Vec<u32> = maps.netns.keys().collect::<Result<_, _>>().map_err(err)?;
        // The count first down, last up: while it is 0 the programs skip the map, never
        // while it holds entries.
        maps.count.set(0, 0, 0).map_err(|e| map_error(MAP_JOB_NETNS_COUNT, e))?;
        for inum in have.iter().filter(|i| !want.contains_key(i)) {
            maps.netns.remove(inum).map_err(err)?;
        }
        for (inum, ifindex) in &want {
            maps.netns.insert(inum, ifindex, 0).map_err(err)?;
        }
        maps.count.set(0, want.len() as u32, 0).map_err(|e| map_error(MAP_JOB_NETNS_COUNT, e))?;
        self.job_namespaces = want_all.iter().take(MAX_JOB_NAMESPACES as usize).copied().collect();
        self.sync_transport_netns()
    }

    /// The namespaces the sock_ops program acts in: this process's and the jobs'.
    pub(super) fn sync_transport_netns(&mut self) -> Result<(), ProbeError> {
        let Some(m) = self.sock_ops.as_mut() else { return Ok(()) };
        let err = |e| map_error(MAP_TRANSPORT_NETNS, e);
        let want: BTreeSet<u64> = std::iter::once(m.own_netns)
            .chain(self.job_namespaces.iter().map(|n| n.cookie).filter(|&c| c != 0))
            .collect();
        let have: Vec<u64> = m.netns.keys().collect::<Result<_, _>>().map_err(err)?;
        for cookie in have.iter().filter(|c| !want.contains(c)) {
            m.netns.remove(cookie).map_err(err)?;
        }
        for cookie in &want {
            m.netns.insert(cookie, 1, 0).map_err(err)?;
        }
        Ok(())
    }
}
