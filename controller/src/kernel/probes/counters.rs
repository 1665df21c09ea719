//! The counters: each counted interface's slot in the per-CPU arrays (given out, zeroed and
//! found again through the kernel's configuration map), and reading them.

use aya::maps::{MapError, PerCpuValues};
use linkpilot_common::{
    peer_stats_index, DatapathLosses, IfaceConfig, IfaceStats, PeerStats, IFACE_INDEX_SLOTS,
    MAP_IFACE_CONFIG, MAP_IFACE_INDEX, MAP_IFACE_STATS, MAP_LOSSES, MAP_PEER_STATS, MAX_PEERS,
};

use super::{map_error, nr_cpus, ProbeError, Probes};
use crate::kernel::iface::Iface;

impl Probes {
    /// Zeroes the counters of interface slot `slot`: its own and those of every peer id.
    pub(super) fn zero_slot(&mut self, slot: u32) -> Result<(), ProbeError> {
        let cpus = nr_cpus()?;
        let zero = PerCpuValues::try_from(vec![IfaceStats::default(); cpus])
            .map_err(|e| map_error(MAP_IFACE_STATS, MapError::from(e)))?;
        self.stats.set(slot, zero, 0).map_err(|e| map_error(MAP_IFACE_STATS, e))?;
        for peer in 0..=MAX_PEERS {
            let zero = PerCpuValues::try_from(vec![PeerStats::default(); cpus])
                .map_err(|e| map_error(MAP_PEER_STATS, MapError::from(e)))?;
            self.peer_stats
                .set(peer_stats_index(slot, peer), zero, 0)
                .map_err(|e| map_error(MAP_PEER_STATS, e))?;
        }
        Ok(())
    }

    /// The counter slot of `ifindex`, as the configuration map the programs read says (not as
    /// this process remembers it: an entry gone from the map is an error to report, not one to
    /// read around).
    pub(super) fn slot_of(&self, ifindex: u32) -> Result<u32, ProbeError> {
        let config = self.config.get(&ifindex, 0).map_err(|e| map_error(MAP_IFACE_CONFIG, e))?;
        if config.slot >= self.slots {
            return Err(ProbeError::Slot { ifindex, slot: config.slot, slots: self.slots });
        }
        Ok(config.slot)
    }

    /// Gives `iface` a counter slot (the lowest free one, or the one it has), zeroes its
    /// counters and writes its configuration, without attaching anything, so that
    /// [`Probes::run_classifier`] counts into them.
    pub fn count_on(&mut self, iface: &Iface) -> Result<(), ProbeError> {
        let slot =
            match self.counted.iter().position(|c| c.is_some_and(|c| c.ifindex == iface.ifindex)) {
                Some(slot) => slot,
                None => match self.counted.iter().position(Option::is_none) {
                    Some(free) => free,
                    None if self.counted.len() < self.slots as usize => {
                        self.counted.push(None);
                        self.counted.len() - 1
                    }
                    None => {
                        let slots = self.slots;
                        return Err(ProbeError::TooManyIfaces { ifindex: iface.ifindex, slots });
                    }
                },
            };
        // Counters zeroed before the configuration points the programs at them.
        self.zero_slot(slot as u32)?;
        let config =
            IfaceConfig { ifindex: iface.ifindex, l2: iface.l2, slot: slot as u32, _pad: 0 };
        self.counted[slot] = Some(config);
        self.config.insert(iface.ifindex, config, 0).map_err(|e| map_error(MAP_IFACE_CONFIG, e))?;
        self.refresh_index(iface.ifindex)
    }

    /// Writes the direct-mapped index entry that `ifindex` falls on: the counted interface of
    /// the lowest slot that falls there too, or an empty entry.
    pub(super) fn refresh_index(&mut self, ifindex: u32) -> Result<(), ProbeError> {
        let at = ifindex % IFACE_INDEX_SLOTS;
        let entry = (self.counted.iter().flatten())
            .find(|c| c.ifindex % IFACE_INDEX_SLOTS == at)
            .copied()
            .unwrap_or_default();
        self.iface_index.set(at, entry, 0).map_err(|e| map_error(MAP_IFACE_INDEX, e))
    }

    /// Adds to `r` every watched interface's counters per peer row (`rows`: id, name) and the
    /// RDMA ports whose netdev it is: the sensors' readings, as `watch` and `run` take them.
    pub fn read_rows(
        &self,
        ifaces: &[Iface],
        rows: &[(u32, String)],
        ports: &[crate::rdma::RdmaPort],
        r: &mut crate::kernel::readings::Readings,
    ) -> Result<(), ProbeError> {
        for iface in ifaces {
            let slot = self.slot_of(iface.ifindex)?;
            for (id, name) in rows {
                let stats = self.slot_peer_stats(slot, *id)?;
                r.peers.push(crate::kernel::readings::PeerReading {
                    link: iface.name.clone(),
                    ifindex: iface.ifindex,
                    peer: name.clone(),
                    id: *id,
                    stats,
                });
            }
            let on = crate::rdma::ports_of(ports, &iface.name).cloned().collect();
            r.nic.push((iface.name.clone(), on));
        }
        Ok(())
    }

    /// Counters of `ifindex` summed over CPUs, since it was watched.
    pub fn stats(&self, ifindex: u32) -> Result<IfaceStats, ProbeError> {
        let slot = self.slot_of(ifindex)?;
        let per_cpu = self.stats.get(&slot, 0).map_err(|e| map_error(MAP_IFACE_STATS, e))?;
        let mut sum = IfaceStats::default();
        per_cpu.iter().for_each(|v| sum.accumulate(v));
        Ok(sum)
    }

    /// Counters of (`ifindex`, `peer`) summed over CPUs.
    pub fn peer_stats(&self, ifindex: u32, peer: u32) -> Result<PeerStats, ProbeError> {
        self.slot_peer_stats(self.slot_of(ifindex)?, peer)
    }

    pub(super) fn slot_peer_stats(&self, slot: u32, peer: u32) -> Result<PeerStats, ProbeError> {
        if peer > MAX_PEERS {
            return Err(ProbeError::PeerId { id: peer });
        }
        let per_cpu = self
            .peer_stats
            .get(&peer_stats_index(slot, peer), 0)
            .map_err(|e| map_error(MAP_PEER_STATS, e))?;
        let mut sum = PeerStats::default();
        per_cpu.iter().for_each(|v| sum.accumulate(v));
        Ok(sum)
    }

    /// What the programs lost, summed over CPUs.
    pub fn losses(&self) -> Result<DatapathLosses, ProbeError> {
        let per_cpu = self.losses.get(&0, 0).map_err(|e| map_error(MAP_LOSSES, e))?;
        let mut sum = DatapathLosses::default();
        per_cpu.iter().for_each(|v| sum.accumulate(v));
        Ok(sum)
    }
}
