//! The only module that talks to aya: loads the embedded eBPF object, attaches it, and reads and
//! writes its maps. Dropping [`Probes`] detaches everything (TCX and perf links are fd-owned).
//! Loading is here; each map or program family the loaded object offers has its own submodule
//! (`attach`, `counters`, `flow_table`, `tables`, `jobs`, `seed`, `transport`, `test_run`).

use std::os::fd::{AsFd, AsRawFd};

use aya::{
    maps::{lpm_trie::LpmTrie, Array, HashMap, MapData, MapError, PerCpuArray},
    programs::{
        tc::SchedClassifierLinkId, ProgramError, RawTracePoint, SchedClassifier, TracePoint,
    },
    Ebpf, EbpfLoader,
};
use linkpilot_common::{
    DatapathLosses, DscpRule, IfaceConfig, IfaceStats, KernelOffsets, LocalAddr, PeerStats,
    GLOBAL_KERNEL_OFFSETS, MAP_DSCP_RULES, MAP_IFACE_CONFIG, MAP_IFACE_INDEX, MAP_IFACE_STATS,
    MAP_LOCAL_ADDRS, MAP_LOSSES, MAP_PEERS, MAP_PEER_GENERATION, MAP_PEER_STATS, MAX_IFACES,
    MAX_PEERS, PROG_SOCK_STATE, PROG_TCP_PROBE, PROG_TCP_RETRANSMIT, PROG_TCP_RETRANSMIT_RECORD,
    PROG_TC_EGRESS, PROG_TC_INGRESS,
};

pub use super::probe_error::ProbeError;

mod attach;
mod counters;
mod flow_table;
mod jobs;
mod seed;
mod tables;
mod test_run;
mod transport;
use super::probe_error::{load_error, map_error};
use crate::kernel::iface::Iface;
pub use attach::remove_stale;
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

    pub fn watched(&self) -> &[Iface] {
        &self.watched
    }

    /// The reader of the programs' warnings (aya-log), once: poll it (see
    /// [`crate::kernel::datapath_log`]) or the warnings wait in their ring buffer.
    pub fn take_logger(&mut self) -> Option<aya_log::EbpfLogger<&'static dyn log::Log>> {
        self.logger.take()
    }

    /// Runs of our tracepoint programs the kernel skipped because a BPF program, or a map
    /// syscall, was already active on that CPU (`recursion_misses` in each program's fdinfo):
    /// events those programs never saw. Programs whose fdinfo lacks the line count 0.
    pub fn skipped_runs(&self) -> u64 {
        self.ebpf
            .programs()
            .filter_map(|(_, p)| fdinfo(p.fd().ok()?.as_fd(), "recursion_misses"))
            .sum::<u64>()
    }
}

pub use crate::kernel::peers::mapped;

/// A number the kernel reports for one of our fds (`key:` in `/proc/self/fdinfo`), if it
/// reports it.
fn fdinfo(fd: std::os::fd::BorrowedFd<'_>, key: &str) -> Option<u64> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    info.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.trim().parse().ok())
}

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
