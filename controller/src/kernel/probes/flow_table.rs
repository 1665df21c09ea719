//! The flow table the tracepoints fill: read whole (batched, or entry by entry as the
//! benchmark's baseline), written for benchmarks, and its kernel memory.

use std::os::fd::AsFd;

use aya::maps::{HashMap, Map, MapData, MapError};
use linkpilot_common::{FlowKey, FlowState, MAP_FLOWS, MAX_FLOWS};

use super::{fdinfo, map_error, ProbeError, Probes};

impl Probes {
    /// The flows the tracepoints have seen (at most MAX_FLOWS, least recently updated evicted),
    /// read in batches.
    pub fn flows(&self) -> Result<Vec<(FlowKey, FlowState)>, ProbeError> {
        let missing = ProbeError::Missing { kind: "map", name: MAP_FLOWS };
        let Some(Map::LruHashMap(data)) = self.ebpf.map(MAP_FLOWS) else { return Err(missing) };
        crate::kernel::batch::lookup_all(data.fd(), MAX_FLOWS as usize).map_err(|e| {
            map_error(
                MAP_FLOWS,
                MapError::SyscallError(aya::sys::SyscallError {
                    call: "bpf_map_lookup_batch",
                    io_error: e,
                }),
            )
        })
    }

    /// Writes flows into the flow table as the tracepoints would: for benchmarks that need a
    /// full table without 100k real connections.
    pub fn insert_flows(&mut self, flows: &[(FlowKey, FlowState)]) -> Result<(), ProbeError> {
        let mut table = self.flow_table()?;
        for (k, v) in flows {
            table.insert(k, v, 0).map_err(|e| map_error(MAP_FLOWS, e))?;
        }
        Ok(())
    }

    /// The flow table, to write.
    pub(super) fn flow_table(
        &mut self,
    ) -> Result<HashMap<&mut MapData, FlowKey, FlowState>, ProbeError> {
        let map = self.ebpf.map_mut(MAP_FLOWS);
        HashMap::try_from(map.ok_or(ProbeError::Missing { kind: "map", name: MAP_FLOWS })?)
            .map_err(|e| map_error(MAP_FLOWS, e))
    }

    /// Kernel memory charged to the flow table (`memlock` in its fdinfo), bytes.
    pub fn flows_memlock(&self) -> Option<u64> {
        let Some(Map::LruHashMap(data)) = self.ebpf.map(MAP_FLOWS) else { return None };
        fdinfo(data.fd().as_fd(), "memlock")
    }

    /// The flow table as aya iterates it (two syscalls per entry): the baseline of the
    /// batched read in `linkpilot bench-sensors`.
    pub fn flows_iterated(&self) -> Result<Vec<(FlowKey, FlowState)>, ProbeError> {
        let flows: HashMap<&MapData, FlowKey, FlowState> = HashMap::try_from(
            self.ebpf.map(MAP_FLOWS).ok_or(ProbeError::Missing { kind: "map", name: MAP_FLOWS })?,
        )
        .map_err(|e| map_error(MAP_FLOWS, e))?;
        flows.iter().collect::<Result<Vec<_>, _>>().map_err(|e| map_error(MAP_FLOWS, e))
    }
}
