//! Connections that were open before the daemon started: the tracepoints put a flow in the
//! table when it opens or when it sends, so a connection that only receives (a job's rank
//! taking data from the other site) and was open before a restart would never be there, and
//! the marks on it would count as others'. They are written in as the open would have.

use aya::maps::{lpm_trie::Key as LpmKey, HashMap, MapData, MapError};
use linkpilot_common::{FlowKey, FlowState, LocalAddr, AF_INET, MAP_FLOWS, PEER_OTHER};

use super::{map_error, monotonic_ns, ProbeError, Probes};

/// `BPF_NOEXIST`: a flow a tracepoint already put in the table keeps its entry.
const NOEXIST: u64 = 1;

impl Probes {
    /// Puts each of `conns` (established connections of this namespace) whose local address is
    /// on a watched interface into the flow table, unless a tracepoint already did: with the
    /// interface and peer the open's tracepoint would give it. Returns those written.
    pub fn seed_flows(&mut self, conns: &[FlowKey]) -> Result<Vec<FlowKey>, ProbeError> {
        let now = monotonic_ns();
        let mut rows = Vec::new();
        for k in conns {
            let Ok(ifindex) = self.local_addrs.get(&local_addr(k), 0) else { continue };
            let peer = self.peers.get(&LpmKey::new(128, k.remote), 0).unwrap_or(PEER_OTHER);
            rows.push((*k, FlowState { last_ns: now, ifindex, peer, ..FlowState::default() }));
        }
        let mut table: HashMap<&mut MapData, FlowKey, FlowState> = HashMap::try_from(
            self.ebpf
                .map_mut(MAP_FLOWS)
                .ok_or(ProbeError::Missing { kind: "map", name: MAP_FLOWS })?,
        )
        .map_err(|e| map_error(MAP_FLOWS, e))?;
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

    /// Takes `flows` out of the flow table (those already gone are no error): seeded
    /// connections that closed before their entry was written, which no close will remove.
    pub fn unseed_flows(&mut self, flows: &[FlowKey]) -> Result<(), ProbeError> {
        let mut table: HashMap<&mut MapData, FlowKey, FlowState> = HashMap::try_from(
            self.ebpf
                .map_mut(MAP_FLOWS)
                .ok_or(ProbeError::Missing { kind: "map", name: MAP_FLOWS })?,
        )
        .map_err(|e| map_error(MAP_FLOWS, e))?;
        for k in flows {
            match table.remove(k) {
                Ok(()) => {}
                Err(MapError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(map_error(MAP_FLOWS, e)),
            }
        }
        Ok(())
    }
}

/// The local-address map's key for a flow's local address, as the programs form it: a
/// dual-stack socket carrying IPv4 is looked up by its IPv4 address.
fn local_addr(k: &FlowKey) -> LocalAddr {
    let mut la = LocalAddr { family: k.family, _pad: 0, addr: [0; 16] };
    if k.local[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] {
        la.family = AF_INET;
        la.addr[..4].copy_from_slice(&k.local[12..]);
    } else {
        la.addr = k.local;
    }
    la
}

#[cfg(test)]
mod tests {
    use super::*;
    use linkpilot_common::{v4_mapped, AF_INET6};

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
