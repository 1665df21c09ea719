//! The only module that talks to aya: loads the embedded eBPF object, attaches it, and reads and
//! writes its maps. Dropping [`Probes`] detaches everything (TCX and perf links are fd-owned).

use std::collections::HashMap as StdHashMap;

use aya::{
    maps::{
        lpm_trie::{Key as LpmKey, LpmTrie},
        Array, HashMap, Map, MapData, MapError, PerCpuArray,
    },
    programs::{
        tc::{self, NlOptions, SchedClassifierLinkId, TcAttachOptions},
        ProgramError, RawTracePoint, SchedClassifier, TcAttachType, TracePoint,
    },
    util::KernelVersion,
    Ebpf, EbpfLoader,
};
use ipnet::IpNet;
use linkpilot_common::{
    DatapathLosses, DscpRule, FlowKey, FlowState, IfaceConfig, IfaceStats, KernelOffsets,
    LocalAddr, PeerStats, GLOBAL_KERNEL_OFFSETS, MAP_DSCP_RULES, MAP_FLOWS, MAP_IFACE_CONFIG,
    MAP_IFACE_INDEX, MAP_IFACE_STATS, MAP_LOCAL_ADDRS, MAP_LOSSES, MAP_PEERS, MAP_PEER_GENERATION,
    MAP_PEER_STATS, MAX_DSCP_RULES, MAX_FLOWS, MAX_IFACES, MAX_PEERS, PEER_OTHER, PROG_SOCK_STATE,
    PROG_TCP_PROBE, PROG_TCP_RETRANSMIT, PROG_TCP_RETRANSMIT_RECORD, PROG_TC_EGRESS,
    PROG_TC_INGRESS, PROG_TC_NOOP,
};
use tracing::{debug, info};

pub use super::probe_error::ProbeError;

mod counters;
mod jobs;
mod seed;
mod transport;
use super::probe_error::{load_error, map_error};
use crate::kernel::iface::Iface;
pub use jobs::JobNetns;
pub use transport::{netns_cookie, SockOpsMaps, TransportTotals};

/// CLOCK_MONOTONIC in nanoseconds: the clock of `bpf_ktime_get_ns`, so userspace can compare
/// it with the programs' timestamps.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The eBPF object built by build.rs from the `ebpf/` crate (empty without the `native`
/// feature).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/linkpilot"));

/// Loaded programs and the maps the controller uses.
pub struct Probes {
    ebpf: Ebpf,
    stats: PerCpuArray<MapData, IfaceStats>,
    config: HashMap<MapData, u32, IfaceConfig>,
    iface_index: Array<MapData, IfaceConfig>,
    local_addrs: HashMap<MapData, LocalAddr, u32>,
    peers: LpmTrie<MapData, [u8; 16], u32>,
    peer_stats: PerCpuArray<MapData, PeerStats>,
    losses: PerCpuArray<MapData, DatapathLosses>,
    /// The programs' warnings (aya-log), until [`Probes::take_logger`].
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    dscp_rules: Array<MapData, DscpRule>,
    peer_generation: Array<MapData, u32>,
    /// Peer ids in use, besides PEER_OTHER.
    peer_ids: Vec<u32>,
    /// What the trie holds: (trie key, peer id).
    prefixes: Vec<(crate::kernel::peers::TrieKey, u32)>,
    /// Interfaces with counters (watched, or set up for test runs) by counter slot; `None`: free.
    counted: Vec<Option<IfaceConfig>>,
    /// Counter slots the maps were sized for.
    slots: u32,
    watched: Vec<Iface>,
    /// Each watched interface's ingress and egress links, to detach those of a deleted device.
    tc_links: Vec<(u32, Vec<(&'static str, SchedClassifierLinkId)>)>,
    netlink_tc: bool,
    /// The sock_ops program's maps, once it is attached.
    sock_ops: Option<SockOpsMaps>,
    /// The tracepoints' maps of job namespaces, once some were set.
    job_netns: Option<jobs::JobNetnsMaps>,
    /// The reporting jobs' own namespaces the programs act in.
    job_namespaces: std::collections::BTreeSet<JobNetns>,
    /// Whether retransmissions are read by the raw tracepoint program (the socket's layout came
    /// from BTF) rather than from the tracepoint's record.
    raw_retransmit: bool,
}

/// The retransmission program for a kernel whose `offsets` are known (see
/// [`KernelOffsets::sock_known`]).
pub fn retransmit_program(offsets: &KernelOffsets) -> &'static str {
    if offsets.sock_known != 0 {
        PROG_TCP_RETRANSMIT
    } else {
        PROG_TCP_RETRANSMIT_RECORD
    }
}

impl Probes {
    /// Loads the object with `offsets` patched in and verifies every program, with counter
    /// slots for [`MAX_IFACES`] interfaces. Nothing is attached yet.
    pub fn load(offsets: KernelOffsets) -> Result<Self, ProbeError> {
        Self::load_for(offsets, MAX_IFACES)
    }

    /// [`Probes::load`] with counter slots for `ifaces` interfaces (1 to [`MAX_IFACES`]): the
    /// per-CPU counter arrays are sized at load, and the peer counters take 64 KB per interface
    /// and CPU (4 MB per CPU for all 64 slots, half a gigabyte on a 128-CPU node).
    pub fn load_for(offsets: KernelOffsets, ifaces: u32) -> Result<Self, ProbeError> {
        if OBJECT.is_empty() {
            return Err(ProbeError::NoObject);
        }
        let slots = ifaces.clamp(1, MAX_IFACES);
        let mut ebpf = EbpfLoader::new()
            .override_global(GLOBAL_KERNEL_OFFSETS, &offsets, true)
            .map_max_entries(MAP_IFACE_STATS, slots)
            .map_max_entries(MAP_PEER_STATS, slots * (MAX_PEERS + 1))
            .load(OBJECT)
            .map_err(|e| ProbeError::Object(Box::new(e)))?;
        for name in [PROG_TC_INGRESS, PROG_TC_EGRESS] {
            let prog: &mut SchedClassifier = program(&mut ebpf, name)?;
            prog.load().map_err(|e| load_error(name, e))?;
        }
        let raw_retransmit = retransmit_program(&offsets) == PROG_TCP_RETRANSMIT;
        if raw_retransmit {
            let prog: &mut RawTracePoint = program(&mut ebpf, PROG_TCP_RETRANSMIT)?;
            prog.load().map_err(|e| load_error(PROG_TCP_RETRANSMIT, e))?;
        }
        let record = if raw_retransmit { None } else { Some(PROG_TCP_RETRANSMIT_RECORD) };
        for name in record.into_iter().chain([PROG_TCP_PROBE, PROG_SOCK_STATE]) {
            let prog: &mut TracePoint = program(&mut ebpf, name)?;
            prog.load().map_err(|e| load_error(name, e))?;
        }
        let stats = take_map(&mut ebpf, MAP_IFACE_STATS)?;
        let config = take_map(&mut ebpf, MAP_IFACE_CONFIG)?;
        let iface_index = take_map(&mut ebpf, MAP_IFACE_INDEX)?;
        let local_addrs = take_map(&mut ebpf, MAP_LOCAL_ADDRS)?;
        let peers = take_map(&mut ebpf, MAP_PEERS)?;
        let peer_stats = take_map(&mut ebpf, MAP_PEER_STATS)?;
        let dscp_rules = take_map(&mut ebpf, MAP_DSCP_RULES)?;
        let peer_generation = take_map(&mut ebpf, MAP_PEER_GENERATION)?;
        let losses = take_map(&mut ebpf, MAP_LOSSES)?;
        let logger =
            aya_log::EbpfLogger::init(&mut ebpf).map_err(|e| ProbeError::Log(Box::new(e)))?;
        Ok(Self {
            slots,
            losses,
            logger: Some(logger),
            dscp_rules,
            peer_generation,
            ebpf,
            stats,
            config,
            iface_index,
            local_addrs,
            peers,
            peer_stats,
            peer_ids: Vec::new(),
            prefixes: Vec::new(),
            counted: Vec::new(),
            watched: Vec::new(),
            tc_links: Vec::new(),
            netlink_tc: false,
            sock_ops: None,
            job_netns: None,
            job_namespaces: Default::default(),
            raw_retransmit,
        })
    }

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

    /// Starts counting on `iface`: zeroes its counters, then attaches ingress and egress.
    pub fn watch(&mut self, iface: &Iface) -> Result<(), ProbeError> {
        self.count_on(iface)?;
        self.attach_tc(iface)
    }

    /// Attaches through the clsact qdisc (netlink) even where TCX exists: what kernels before
    /// 6.6 get. Such filters outlive a killed process; [`remove_stale`] finds them.
    pub fn use_netlink_tc(&mut self) {
        self.netlink_tc = true;
    }

    fn attach_tc(&mut self, iface: &Iface) -> Result<(), ProbeError> {
        let netlink = self.netlink_tc
            || KernelVersion::current().is_ok_and(|v| v < KernelVersion::new(6, 6, 0));
        if netlink {
            // Classifiers hang off the clsact qdisc; it may already exist.
            let _ = tc::qdisc_add_clsact(&iface.name);
        }
        let mut links = Vec::new();
        for (name, attach_type, direction) in [
            (PROG_TC_INGRESS, TcAttachType::Ingress, "ingress"),
            (PROG_TC_EGRESS, TcAttachType::Egress, "egress"),
        ] {
            let prog: &mut SchedClassifier = program(&mut self.ebpf, name)?;
            let attached = if netlink {
                prog.attach_with_options(
                    &iface.name,
                    attach_type,
                    TcAttachOptions::Netlink(NlOptions::default()),
                )
            } else {
                prog.attach(&iface.name, attach_type)
            };
            let link = attached.map_err(|e| ProbeError::Attach {
                program: name,
                iface: iface.name.clone(),
                direction,
                source: Box::new(e),
            })?;
            links.push((name, link));
            debug!(iface = %iface.name, ifindex = iface.ifindex, direction, "attached");
        }
        self.tc_links.push((iface.ifindex, links));
        self.watched.push(iface.clone());
        Ok(())
    }

    /// `old` was deleted and `new` carries its name now: detaches the links that went with the
    /// old device (defunct, but held until detached: bpftool would show them beside the new
    /// ones), drops its counters and watches `new`.
    pub fn rewatch(&mut self, old: &Iface, new: &Iface) -> Result<(), ProbeError> {
        if let Some(at) = self.tc_links.iter().position(|(i, _)| *i == old.ifindex) {
            let (_, links) = self.tc_links.remove(at);
            for (name, link) in links {
                // A link of a deleted device: detaching only closes it; nothing to report.
                if let Ok(prog) = program::<SchedClassifier>(&mut self.ebpf, name) {
                    let _ = prog.detach(link);
                }
            }
        }
        // An absent entry is fine: the configuration of an index nothing carries any more. Its
        // slot is free again (zeroed when next given out).
        let _ = self.config.remove(&old.ifindex);
        for c in self.counted.iter_mut().filter(|c| c.is_some_and(|c| c.ifindex == old.ifindex)) {
            *c = None;
        }
        self.refresh_index(old.ifindex)?;
        self.watched.retain(|w| w.ifindex != old.ifindex);
        self.watch(new)
    }

    /// Attaches the TCP tracepoints: retransmissions (raw, or the record's fallback), RTT
    /// (`tcp:tcp_probe`) and connection state (`sock:inet_sock_set_state`).
    pub fn attach_tracepoints(&mut self) -> Result<(), ProbeError> {
        let attaching = |program| {
            move |e| ProbeError::Program { action: "attaching", program, source: Box::new(e) }
        };
        if self.raw_retransmit {
            let prog: &mut RawTracePoint = program(&mut self.ebpf, PROG_TCP_RETRANSMIT)?;
            prog.attach("tcp_retransmit_skb").map_err(attaching(PROG_TCP_RETRANSMIT))?;
            info!("attached tcp_retransmit_skb (raw tracepoint)");
        }
        let record = (!self.raw_retransmit).then_some((
            PROG_TCP_RETRANSMIT_RECORD,
            "tcp",
            "tcp_retransmit_skb",
        ));
        for (name, category, event) in record.into_iter().chain([
            (PROG_TCP_PROBE, "tcp", "tcp_probe"),
            (PROG_SOCK_STATE, "sock", "inet_sock_set_state"),
        ]) {
            let prog: &mut TracePoint = program(&mut self.ebpf, name)?;
            prog.attach(category, event).map_err(attaching(name))?;
            info!("attached {category}:{event}");
        }
        Ok(())
    }

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
    fn flow_table(&mut self) -> Result<HashMap<&mut MapData, FlowKey, FlowState>, ProbeError> {
        let map = self.ebpf.map_mut(MAP_FLOWS);
        HashMap::try_from(map.ok_or(ProbeError::Missing { kind: "map", name: MAP_FLOWS })?)
            .map_err(|e| map_error(MAP_FLOWS, e))
    }

    /// Kernel memory charged to the flow table (`memlock` in its fdinfo), bytes.
    pub fn flows_memlock(&self) -> Option<u64> {
        use std::os::fd::{AsFd, AsRawFd};
        let Some(Map::LruHashMap(data)) = self.ebpf.map(MAP_FLOWS) else { return None };
        let fd = data.fd().as_fd().as_raw_fd();
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
        info.lines().find_map(|l| l.strip_prefix("memlock:")?.trim().parse().ok())
    }

    /// Runs of our tracepoint programs the kernel skipped because a BPF program, or a map
    /// syscall, was already active on that CPU (`recursion_misses` in each program's fdinfo):
    /// events those programs never saw. Programs whose fdinfo lacks the line count 0.
    pub fn skipped_runs(&self) -> u64 {
        use std::os::fd::{AsFd, AsRawFd};
        self.ebpf
            .programs()
            .filter_map(|(_, p)| {
                let fd = p.fd().ok()?.as_fd().as_raw_fd();
                let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
                info.lines()
                    .find_map(|l| l.strip_prefix("recursion_misses:")?.trim().parse::<u64>().ok())
            })
            .sum::<u64>()
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

    pub fn watched(&self) -> &[Iface] {
        &self.watched
    }

    /// Runs the ingress (or egress) classifier on `packet` (from its Ethernet header) `repeat`
    /// times with BPF_PROG_TEST_RUN. The test skb's device is loopback, so the counters of
    /// ifindex 1 move if [`Probes::count_on`] was called for `lo`. Returns the verdict and the
    /// kernel's mean time per run.
    pub fn run_classifier(
        &mut self,
        egress: bool,
        packet: &[u8],
        repeat: u32,
    ) -> Result<(i32, std::time::Duration), ProbeError> {
        let name = if egress { PROG_TC_EGRESS } else { PROG_TC_INGRESS };
        self.run_named(name, packet, repeat)
    }

    /// Like [`Probes::run_classifier`] for the empty classifier, the benchmark's baseline.
    pub fn run_noop(
        &mut self,
        packet: &[u8],
        repeat: u32,
    ) -> Result<(i32, std::time::Duration), ProbeError> {
        let prog: &mut SchedClassifier = program(&mut self.ebpf, PROG_TC_NOOP)?;
        if prog.fd().is_err() {
            prog.load().map_err(|e| load_error(PROG_TC_NOOP, e))?;
        }
        self.run_named(PROG_TC_NOOP, packet, repeat)
    }

    fn run_named(
        &mut self,
        name: &'static str,
        packet: &[u8],
        repeat: u32,
    ) -> Result<(i32, std::time::Duration), ProbeError> {
        use aya::programs::{TestRun, TestRunOptions};
        let prog: &mut SchedClassifier = program(&mut self.ebpf, name)?;
        let opts = TestRunOptions {
            data_in: Some(packet),
            repeat: repeat.max(1),
            ..TestRunOptions::default()
        };
        let r = prog.test_run(opts).map_err(|e| ProbeError::Program {
            action: "test-running",
            program: name,
            source: Box::new(e),
        })?;
        Ok((r.return_value as i32, r.duration))
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

    /// The reader of the programs' warnings (aya-log), once: poll it (see
    /// [`crate::kernel::datapath_log`]) or the warnings wait in their ring buffer.
    pub fn take_logger(&mut self) -> Option<aya_log::EbpfLogger<&'static dyn log::Log>> {
        self.logger.take()
    }

    /// Makes the local-address map equal to `want` (address -> ifindex).
    pub fn sync_local_addrs(
        &mut self,
        want: &StdHashMap<LocalAddr, u32>,
    ) -> Result<(), ProbeError> {
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

pub use crate::kernel::peers::mapped;

fn nr_cpus() -> Result<usize, ProbeError> {
    aya::util::nr_cpus().map_err(|(_, io_error)| {
        map_error(
            MAP_IFACE_STATS,
            MapError::SyscallError(aya::sys::SyscallError { call: "nr_cpus", io_error }),
        )
    })
}

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, ProbeError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    let prog = ebpf.program_mut(name).ok_or(ProbeError::Missing { kind: "program", name })?;
    prog.try_into().map_err(|e| ProbeError::Program {
        action: "typing",
        program: name,
        source: Box::new(e),
    })
}

fn take_map<V>(ebpf: &mut Ebpf, name: &'static str) -> Result<V, ProbeError>
where
    V: TryFrom<aya::maps::Map, Error = MapError>,
{
    let map = ebpf.take_map(name).ok_or(ProbeError::Missing { kind: "map", name })?;
    V::try_from(map).map_err(|e| map_error(name, e))
}

/// Removes our classifiers that a killed run left on `iface`'s clsact qdisc (netlink filters
/// outlive their process; TCX links do not), identified by program name, never anything else.
/// Returns what was removed. Also reports TCX attachments of ours that some other holder keeps
/// alive (a pinned link): those are not ours to remove.
pub fn remove_stale(iface: &str) -> (Vec<String>, Vec<String>) {
    let mut removed = Vec::new();
    let mut foreign = Vec::new();
    for (name, attach_type, direction) in [
        (PROG_TC_INGRESS, TcAttachType::Ingress, "ingress"),
        (PROG_TC_EGRESS, TcAttachType::Egress, "egress"),
    ] {
        // Each call removes every filter of that name; "not found" means there was none.
        if tc::qdisc_detach_program(iface, attach_type, name).is_ok() {
            removed.push(format!("{iface} {direction} clsact filter {name}"));
        }
        if let Ok((_, progs)) = SchedClassifier::query_tcx(iface, attach_type) {
            for p in progs {
                if p.name_as_str() == Some(name) {
                    foreign.push(format!("{iface} {direction} TCX program {name} id {}", p.id()));
                }
            }
        }
    }
    (removed, foreign)
}
