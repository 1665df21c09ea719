//! The lookup tables the controller writes for the programs: peer prefixes (and the generation
//! that invalidates the programs' caches of them), the local addresses, and the egress DSCP rules.

use std::collections::HashMap;

use aya::maps::lpm_trie::Key as LpmKey;
use ipnet::IpNet;
use linkpilot_common::{
    DscpRule, LocalAddr, MAP_DSCP_RULES, MAP_LOCAL_ADDRS, MAP_PEERS, MAP_PEER_GENERATION,
    MAX_DSCP_RULES, MAX_PEERS, PEER_OTHER,
};

use super::{map_error, mapped, ProbeError, Probes};

impl Probes {
    /// Maps `prefixes` to peer ids (1..=MAX_PEERS), replacing the previous set: prefixes no
    /// longer given leave the trie. Call before [`Probes::watch`], which creates the per-peer
    /// counters of each interface.
    pub fn set_peers(&mut self, prefixes: &[(u32, IpNet)]) -> Result<(), ProbeError> {
        if let Some(&(id, _)) = prefixes.iter().find(|(id, _)| *id == PEER_OTHER || *id > MAX_PEERS)
        {
            return Err(ProbeError::PeerId { id });
        }
        // Every (interface slot, peer id) has its counters from the start (an array).
        for &(id, _) in prefixes {
            if !self.peer_ids.contains(&id) {
                self.peer_ids.push(id);
            }
        }
        // Stale entries leave first, so that swapping one near-full set for another never
        // holds both (the trie's capacity is MAX_PEER_PREFIXES); only new or re-assigned
        // prefixes are written. `self.prefixes` follows each step, so that a failed update can
        // be undone by setting the previous list again.
        let want: Vec<(crate::kernel::peers::TrieKey, u32)> =
            prefixes.iter().map(|&(id, net)| (mapped(net), id)).collect();
        let gone: Vec<crate::kernel::peers::TrieKey> = (self.prefixes.iter())
            .map(|(k, _)| *k)
            .filter(|k| !want.iter().any(|(w, _)| w == k))
            .collect();
        let removed = gone.iter().try_for_each(|&(len, addr)| {
            self.peers.remove(&LpmKey::new(len, addr)).map_err(|e| map_error(MAP_PEERS, e))?;
            self.prefixes.retain(|(k, _)| *k != (len, addr));
            Ok(())
        });
        let updated = removed.and_then(|()| {
            want.iter().try_for_each(|&((len, addr), id)| {
                if self.prefixes.contains(&((len, addr), id)) {
                    return Ok(());
                }
                let key = LpmKey::new(len, addr);
                self.peers.insert(&key, id, 0).map_err(|e| map_error(MAP_PEERS, e))?;
                self.prefixes.retain(|(k, _)| *k != (len, addr));
                self.prefixes.push(((len, addr), id));
                Ok(())
            })
        });
        // The programs' address -> peer caches hold answers of the old trie: invalidate them,
        // also when the update stopped half way.
        let generation =
            self.peer_generation.get(&0, 0).map_err(|e| map_error(MAP_PEER_GENERATION, e))?;
        let next = generation.wrapping_add(1).max(1);
        self.peer_generation.set(0, next, 0).map_err(|e| map_error(MAP_PEER_GENERATION, e))?;
        updated
    }

    /// Replaces the egress DSCP rules (first match wins). Takes effect for the next packet.
    pub fn set_dscp_rules(&mut self, rules: &[DscpRule]) -> Result<(), ProbeError> {
        if rules.len() > MAX_DSCP_RULES as usize {
            return Err(ProbeError::TooManyRules { count: rules.len() });
        }
        // Write the new rules, then disable the slots after them: the program stops at the first
        // disabled slot, so a reader never sees a gap.
        for (i, rule) in rules.iter().enumerate() {
            let rule = DscpRule { enabled: 1, dscp: rule.dscp & 0x3f, ..*rule };
            self.dscp_rules.set(i as u32, rule, 0).map_err(|e| map_error(MAP_DSCP_RULES, e))?;
        }
        for i in rules.len() as u32..MAX_DSCP_RULES {
            self.dscp_rules
                .set(i, DscpRule::default(), 0)
                .map_err(|e| map_error(MAP_DSCP_RULES, e))?;
        }
        Ok(())
    }

    /// Makes the local-address map equal to `want` (address -> ifindex).
    pub fn sync_local_addrs(&mut self, want: &HashMap<LocalAddr, u32>) -> Result<(), ProbeError> {
        let map_err = |e| map_error(MAP_LOCAL_ADDRS, e);
        let have: Vec<LocalAddr> =
            self.local_addrs.keys().collect::<Result<_, _>>().map_err(map_err)?;
        for key in have.iter().filter(|k| !want.contains_key(k)) {
            self.local_addrs.remove(key).map_err(map_err)?;
        }
        for (key, ifindex) in want {
            if self.local_addrs.get(key, 0).ok() != Some(*ifindex) {
                self.local_addrs.insert(key, ifindex, 0).map_err(map_err)?;
            }
        }
        Ok(())
    }
}
