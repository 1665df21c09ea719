//! Connections that were open before the daemon started: the tracepoints put a flow in the
//! table when it opens or when it sends, so a connection that only receives (a job's rank
//! taking data from the other site) and was open before a restart would never be there, and
//! the marks on it would count as others'. They are written in as the open would have.

use std::{
    collections::HashSet,
    net::{IpAddr, Ipv6Addr},
};

use aya::maps::{lpm_trie::Key as LpmKey, MapError};
use linkpilot_common::{FlowKey, FlowState, LocalAddr, MAP_FLOWS, PEER_OTHER};

use super::{map_error, monotonic_ns, ProbeError, Probes};
use crate::kernel::{iface::local_addr_key, sockets};

/// `BPF_NOEXIST`: a flow a tracepoint already put in the table keeps its entry.
const NOEXIST: u64 = 1;

impl Probes {
    /// Writes the established connections of this namespace whose local address is on a
    /// watched interface into the flow table, unless a tracepoint already did, with the
    /// interface and peer the open's tracepoint would give them; then takes out those that
    /// closed meanwhile (a close between the listing and the write came before the entry, so
    /// nothing else would remove it). Call with the tracepoints attached, so that a connection
    /// opening after the listing is theirs. Returns how many stay.
    pub fn seed_open_connections(&mut self) -> Result<usize, ProbeError> {
        let listed: Vec<FlowKey> = sockets::established().into_iter().map(|(_, k)| k).collect();
        let written = self.seed_flows(&listed)?;
        let open: HashSet<FlowKey> = sockets::established().into_iter().map(|(_, k)| k).collect();
        let closed: Vec<&FlowKey> = written.iter().filter(|k| !open.contains(k)).collect();
        let mut table = self.flow_table()?;
        for k in &closed {
            match table.remove(k) {
                Ok(()) => {}
                Err(MapError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(map_error(MAP_FLOWS, e)),
            }
        }
        Ok(written.len() - closed.len())
    }

    /// Writes each of `conns` on a watched interface, unless its key is in the table already.
    /// Returns those written.
    fn seed_flows(&mut self, conns: &[FlowKey]) -> Result<Vec<FlowKey>, ProbeError> {
        let now = monotonic_ns();
        let mut rows = Vec::new();
        for k in conns {
            let Ok(ifindex) = self.local_addrs.get(&local_addr(k), 0) else { continue };
            let peer = self.peers.get(&LpmKey::new(128, k.remote), 0).unwrap_or(PEER_OTHER);
            rows.push((*k, FlowState { last_ns: now, ifindex, peer, ..FlowState::default() }));
        }
        let mut table = self.flow_table()?;
        let mut written = Vec::new();
        for (k, v) in rows {
            match table.insert(k, v, NOEXIST) {
                Ok(()) => written.push(k),
                Err(MapError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::EEXIST) => {}
                Err(e) => return Err(map_error(MAP_FLOWS, e)),
            }
        }
        Ok(written)
    }
}

/// The local-address map's key for a flow's local address, as the programs form it: a
/// dual-stack socket carrying IPv4 is looked up by its IPv4 address.
fn local_addr(k: &FlowKey) -> LocalAddr {
    let v6 = Ipv6Addr::from(k.local);
    local_addr_key(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4))
}

#[cfg(test)]
mod tests {
    use super::*;
    use linkpilot_common::{v4_mapped, AF_INET, AF_INET6};

    #[test]
    fn local_addresses_are_keyed_as_the_programs_key_them() {
        let k = |family, local| FlowKey {
            family,
            local_port: 1,
            remote_port: 2,
            _pad: 0,
            local,
            remote: [0; 16],
        };
        let v4 = local_addr(&k(AF_INET, v4_mapped([10, 0, 0, 1])));
        assert_eq!(
            (v4.family, &v4.addr[..4], &v4.addr[4..]),
            (AF_INET, &[10, 0, 0, 1][..], &[0; 12][..])
        );
        let dual = local_addr(&k(AF_INET6, v4_mapped([10, 0, 0, 1])));
        assert_eq!(dual, v4, "a dual-stack socket's IPv4 address");
        let mut v6 = [0u8; 16];
        v6[0] = 0xfd;
        v6[15] = 1;
        assert_eq!(local_addr(&k(AF_INET6, v6)), LocalAddr { family: AF_INET6, _pad: 0, addr: v6 });
    }
}
