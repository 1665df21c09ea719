//! Prometheus metrics (`prometheus-client`), served over HTTP on 127.0.0.1:9464 by default
//! (`serve.rs`):
//! signals per link and peer, state, knobs, decisions, map pressure and the daemon's health.
//! The loop sets values each tick; process figures are read from /proc when scraped. Rates are
//! in bytes per second, Prometheus's base unit (the dashboard shows bits).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{atomic::AtomicU64, Arc, Mutex},
};

use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use tracing::warn;

use super::ledger::ActuatorStatus;
use crate::{
    board::tuner_stats::TunerProcess,
    control::{estimator::Signals, knobs::Knobs},
    sense::sensors::Snapshot,
};

mod codec;
mod jobs;
mod outcome;
mod peers;
mod transport;

pub const DEFAULT_ADDR: &str = "127.0.0.1:9464";

type Labels = Vec<(String, String)>;
type F64 = Gauge<f64, AtomicU64>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

const LINK_RTT_STATS: [&str; 5] = ["ewma", "baseline", "p50", "p99", "peak_p99"];

/// The label values the per-link and per-peer series were written with, so that a reload can
/// remove the series of links, states and peers the new policy no longer has (they would
/// otherwise keep their last value: two states of one link reading 1).
#[derive(Default)]
struct Shown {
    links: BTreeSet<String>,
    states: BTreeSet<String>,
    /// interface -> peers.
    peers: BTreeMap<String, BTreeSet<String>>,
}

fn note(set: &mut BTreeSet<String>, v: &str) {
    if !set.contains(v) {
        set.insert(v.to_owned());
    }
}

/// Every metric the daemon exports. Cloning shares the values.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    link_state: Family<Labels, Gauge>,
    link_state_level: Family<Labels, Gauge>,
    link_rtt: Family<Labels, F64>,
    link_f64: Vec<(&'static str, Family<Labels, F64>)>,
    knob_compression: Family<Labels, Gauge>,
    knobs: Vec<(&'static str, Family<Labels, F64>)>,
    decisions: Family<Labels, Counter>,
    peers: peers::PeerMetrics,
    nic: Vec<(&'static str, Family<Labels, F64>)>,
    pub ticks: Counter,
    pub tick_duration: Histogram,
    pub last_tick: F64,
    pub map_entries: Family<Labels, Gauge>,
    pub map_capacity: Family<Labels, Gauge>,
    pub reloads: Family<Labels, Counter>,
    pub actuator_errors: Family<Labels, Counter>,
    pub sensing_errors: Counter,
    pub datapath_lost: Family<Labels, Counter>,
    pub interface_reattached: Family<Labels, Counter>,
    interface_present: Family<Labels, Gauge>,
    policy_info: Family<Labels, Gauge>,
    pub log_write_errors: Family<Labels, Counter>,
    actuator_pending: Family<Labels, Gauge>,
    actuator_released: Family<Labels, Gauge>,
    resident: Gauge,
    cpu: Counter<f64, AtomicU64>,
    tuner_processes: Gauge,
    tuner_calls: Family<Labels, Gauge>,
    tuner_choices: Family<Labels, Gauge>,
    pub jobs: jobs::JobMetrics,
    pub outcome: outcome::OutcomeMetrics,
    pub codec: codec::CodecMetrics,
    pub transport: transport::TransportMetrics,
    shown: Arc<Mutex<Shown>>,
}

fn family<M>(r: &mut Registry, name: &str, help: &str) -> Family<Labels, M>
where
    M: prometheus_client::metrics::TypedMetric
        + prometheus_client::encoding::EncodeMetric
        + Default
        + Clone
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let f = Family::<Labels, M>::default();
    r.register(name, help, f.clone());
    f
}

impl Metrics {
    pub fn new(dry_run: bool) -> Self {
        let mut root = Registry::default();
        let r = root.sub_registry_with_prefix("linkpilot");
        let link_state = family(r, "link_state", "1 for the link's current state, 0 otherwise");
        let link_state_level =
            family(r, "link_state_level", "The current state's place in the ladder (0: first)");
        let link_rtt =
            family(r, "link_rtt_seconds", "Link RTT: ewma, baseline, p50, p99, peak_p99");
        let link_f64 = [
            ("link_jitter_seconds", "RTT p99 - p50"),
            ("link_rtt_inflation_ratio", "RTT EWMA over baseline, minus one"),
            (
                "link_cross_rtt_inflation_ratio",
                "RTT inflation from others' traffic: the reporting jobs' flows count only with the \
                 first sample of each burst",
            ),
            ("link_ce_fraction", "CE (or echoed ECE) share of packets, EWMA"),
            (
                "link_cross_ce_fraction",
                "CE (or echoed ECE) share of packets, EWMA, without the marks on the reporting \
                 jobs' flows",
            ),
            ("link_retrans_fraction", "Retransmitted share of segments sent, EWMA"),
            ("link_cnp_per_second", "RoCE congestion notifications per second"),
            ("link_goodput_bytes_per_second", "Goodput EWMA"),
            ("link_delivery_bytes_per_second", "Largest goodput EWMA over the window"),
            ("link_goodput_capacity_ratio", "Goodput over the link's nominal capacity"),
        ]
        .map(|(n, h)| (n, family(r, n, h)))
        .to_vec();
        let knob_compression =
            family(r, "knob_compression", "1 for the gradient compression mode in force");
        let knobs = [
            ("knob_compression_ratio", "Wire bytes per fp32 gradient byte"),
            ("knob_chunk_bytes", "Bytes per pipelined chunk (NCCL_BUFFSIZE)"),
            ("knob_nccl_ib_timeout", "NCCL_IB_TIMEOUT exponent: 4.096us x 2^t"),
            ("knob_nccl_ib_retry_cnt", "NCCL_IB_RETRY_CNT"),
            ("knob_watchdog_seconds", "Collective watchdog timeout"),
            ("knob_dscp", "DSCP of the link's egress traffic (-1: left alone)"),
            ("knob_roce_traffic_class", "RoCE traffic class (NCCL_IB_TC; -1: left alone)"),
            ("knob_tcp_buffer_bytes", "TCP buffer limit asked for (0: left alone)"),
            (
                "knob_sync_every",
                "Inner steps per cross-site sync round (1: every step; 0: auto, the training side \
                 derives it)",
            ),
            ("knob_outer_compression_ratio", "Wire bytes per fp32 pseudo-gradient byte"),
            ("knob_fragments", "Parts of the parameters synced one at a time in a round"),
            ("knob_overlap", "Inner steps a fragment's exchange may take before it is applied"),
        ]
        .map(|(n, h)| (n, family(r, n, h)))
        .to_vec();
        let decisions = family(r, "decisions", "Decisions made, by the state they chose");
        let peers = peers::PeerMetrics::register(r);
        let nic = [
            ("nic_cnp_handled_per_second", "CNPs the RDMA NIC reacted to"),
            ("nic_cnp_sent_per_second", "CNPs the RDMA NIC sent"),
            ("nic_ecn_marked_per_second", "ECN-marked RoCE packets received"),
            ("nic_retrans_events_per_second", "RDMA retransmission events"),
        ]
        .map(|(n, h)| (n, family(r, n, h)))
        .to_vec();
        let ticks = Counter::default();
        r.register("ticks", "Control ticks run", ticks.clone());
        // 100 us .. ~3.3 s: a tick's work is well under a millisecond until the flow table
        // holds tens of thousands of flows.
        let tick_duration = Histogram::new(
            prometheus_client::metrics::histogram::exponential_buckets(1e-4, 2.0, 16),
        );
        r.register("tick_duration_seconds", "Work per tick", tick_duration.clone());
        let last_tick = F64::default();
        r.register("last_tick_timestamp_seconds", "Unix time of the last tick", last_tick.clone());
        let map_entries = family(r, "map_entries", "Entries in a kernel map");
        let map_capacity = family(r, "map_capacity", "Capacity of a kernel map");
        let reloads = family(r, "policy_reloads", "Policy reloads: applied or rejected");
        let actuator_errors =
            family(r, "actuator_errors", "Failed actuator writes (retries of pending ones too)");
        let actuator_pending = family(
            r,
            "actuator_pending",
            "1 while an actuator's last write failed: what the decisions want is not in place; \
             retried every tick",
        );
        let actuator_released = family(
            r,
            "actuator_released",
            "Settings an administrator changed under us, handed back: no longer managed or \
             restored",
        );
        // Zero series from the start: "no data" would read as "never happened" too.
        for r in ["applied", "rejected"] {
            let _ = reloads.get_or_create(&labels(&[("result", r)]));
        }
        for a in linkpilot_common::board::pending::NAMES {
            let _ = actuator_errors.get_or_create(&labels(&[("actuator", a)]));
            let _ = actuator_pending.get_or_create(&labels(&[("actuator", a)]));
        }
        let sensing_errors = Counter::default();
        r.register(
            "sensing_errors",
            "Ticks skipped because a sensing read failed",
            sensing_errors.clone(),
        );
        let datapath_lost = family(
            r,
            "datapath_lost",
            "Packets or flows the eBPF programs could not count, by kind: truncated_header, \
             unknown_link_type, map_insert_failed, map_remove_failed (a closed flow left in the table), flow_evicted (from the full flow table), \
             program_skipped (tracepoint runs the kernel skipped: events not seen)",
        );
        for k in crate::daemon::losses::KINDS {
            let _ = datapath_lost.get_or_create(&labels(&[("kind", k)]));
        }
        let policy_info = family(
            r,
            "policy_info",
            "1 for the running policy, labelled with the SHA-256 of its file's bytes (the \
             output of sha256sum): which version each node runs, through a rollout",
        );
        let interface_present = family(
            r,
            "interface_present",
            "1 while a watched interface exists and is watched; 0 while it is gone",
        );
        let interface_reattached = family(
            r,
            "interface_reattached",
            "Times a watched interface was created again and attached to anew",
        );
        let log_write_errors = family(
            r,
            "log_write_errors",
            "Lines not written to the decision log or the record (full disk...); the loop \
             keeps deciding",
        );
        for f in ["decision_log", "record"] {
            let _ = log_write_errors.get_or_create(&labels(&[("file", f)]));
        }
        let resident = Gauge::default();
        r.register("process_resident_bytes", "Resident set size", resident.clone());
        let cpu = Counter::<f64, AtomicU64>::default();
        r.register("process_cpu_seconds", "User + system CPU time", cpu.clone());
        let tuner_processes = Gauge::default();
        r.register(
            "nccl_tuner_processes",
            "Training processes with the NCCL tuner plugin loaded",
            tuner_processes.clone(),
        );
        let tuner_calls = family(
            r,
            "nccl_tuner_calls",
            "getCollInfo calls of the live processes: result adopted (followed the decision the \
             ranks adopted) or own (NCCL's own choice: none adopted)",
        );
        for res in ["adopted", "own"] {
            let _ = tuner_calls.get_or_create(&labels(&[("result", res)]));
        }
        let tuner_choices = family(
            r,
            "nccl_tuner_choices",
            "(process, size class) pairs whose latest choice for a collective is this algorithm \
             and protocol (nccl: NCCL's own)",
        );
        let jobs = jobs::JobMetrics::register(r);
        let outcome = outcome::OutcomeMetrics::register(r);
        let codec = codec::CodecMetrics::register(r);
        let transport = transport::TransportMetrics::register(r);
        let build = Family::<Labels, Gauge>::default();
        r.register("build_info", "The running version", build.clone());
        build.get_or_create(&labels(&[("version", env!("CARGO_PKG_VERSION"))])).set(1);
        let dry = Gauge::<i64>::default();
        r.register("dry_run", "1 when decisions are only logged", dry.clone());
        dry.set(i64::from(dry_run));
        Self {
            registry: Arc::new(root),
            link_state,
            link_state_level,
            link_rtt,
            link_f64,
            knob_compression,
            knobs,
            decisions,
            peers,
            nic,
            ticks,
            tick_duration,
            last_tick,
            map_entries,
            map_capacity,
            reloads,
            actuator_errors,
            sensing_errors,
            datapath_lost,
            interface_reattached,
            interface_present,
            policy_info,
            log_write_errors,
            actuator_pending,
            actuator_released,
            resident,
            cpu,
            tuner_processes,
            tuner_calls,
            tuner_choices,
            jobs,
            outcome,
            codec,
            transport,
            shown: Arc::default(),
        }
    }

    /// The tuner plugin's counters of the live training processes.
    pub fn tuner(&self, procs: &[TunerProcess]) {
        self.tuner_processes.set(procs.len() as i64);
        let adopted: u64 = procs.iter().map(|p| p.adopted_calls).sum();
        let all: u64 = procs.iter().map(|p| p.calls).sum();
        self.tuner_calls.get_or_create(&labels(&[("result", "adopted")])).set(adopted as i64);
        self.tuner_calls
            .get_or_create(&labels(&[("result", "own")]))
            .set(all.saturating_sub(adopted) as i64);
        // Choices come and go: rebuild the family from what the processes show now.
        self.tuner_choices.clear();
        for c in procs.iter().flat_map(|p| &p.choices) {
            let (algo, proto) = match c.own_choice {
                Some(_) => ("nccl", "nccl"),
                None => (c.algo.as_deref().unwrap_or("nccl"), c.proto.as_deref().unwrap_or("nccl")),
            };
            let l = labels(&[("collective", &c.collective), ("algo", algo), ("proto", proto)]);
            self.tuner_choices.get_or_create(&l).inc();
        }
    }

    fn set(fams: &[(&'static str, Family<Labels, F64>)], name: &str, l: &Labels, v: f64) {
        if let Some((_, f)) = fams.iter().find(|(n, _)| *n == name) {
            f.get_or_create(l).set(v);
        }
    }

    /// A link's state (out of `states`, the ladder), knobs and signals.
    pub fn link(&self, link: &str, states: &[String], state: &str, k: &Knobs, s: &Signals) {
        if let Ok(mut shown) = self.shown.lock() {
            note(&mut shown.links, link);
            states.iter().for_each(|st| note(&mut shown.states, st));
        }
        let l = labels(&[("link", link)]);
        for st in states {
            let on = i64::from(st == state);
            self.link_state.get_or_create(&labels(&[("link", link), ("state", st)])).set(on);
        }
        let level = states.iter().position(|s| s == state).unwrap_or(0);
        self.link_state_level.get_or_create(&l).set(level as i64);
        let rtt = [s.rtt_ms, s.baseline_ms, s.rtt_p50_ms, s.rtt_p99_ms, s.peak_p99_ms];
        for (stat, v) in LINK_RTT_STATS.into_iter().zip(rtt) {
            let ls = labels(&[("link", link), ("stat", stat)]);
            // Unmeasured (an idle link): no series, rather than the last value forever.
            match v {
                Some(v) => _ = self.link_rtt.get_or_create(&ls).set(v / 1e3),
                None => _ = self.link_rtt.remove(&ls),
            }
        }
        for (name, v) in [
            ("link_jitter_seconds", s.jitter_ms / 1e3),
            ("link_rtt_inflation_ratio", s.rtt_inflation),
            ("link_cross_rtt_inflation_ratio", s.cross_rtt_inflation),
            ("link_ce_fraction", s.ce_fraction),
            ("link_cross_ce_fraction", s.cross_ce_fraction),
            ("link_retrans_fraction", s.retrans),
            ("link_cnp_per_second", s.cnp_per_s),
            ("link_goodput_bytes_per_second", s.goodput_bps / 8.0),
            ("link_delivery_bytes_per_second", s.delivery_bps / 8.0),
            ("link_goodput_capacity_ratio", s.goodput_fraction),
        ] {
            Self::set(&self.link_f64, name, &l, v);
        }
        let mode = k.compression.mode();
        for m in crate::control::knobs::Compression::MODES {
            let on = i64::from(*m == mode);
            self.knob_compression.get_or_create(&labels(&[("link", link), ("mode", m)])).set(on);
        }
        for (name, v) in [
            ("knob_compression_ratio", k.compression.ratio()),
            ("knob_chunk_bytes", k.chunk_bytes as f64),
            ("knob_nccl_ib_timeout", f64::from(k.nccl_ib_timeout)),
            ("knob_nccl_ib_retry_cnt", f64::from(k.nccl_ib_retry_cnt)),
            ("knob_watchdog_seconds", f64::from(k.watchdog_s)),
            ("knob_dscp", k.dscp.map_or(-1.0, f64::from)),
            ("knob_roce_traffic_class", k.roce_traffic_class.map_or(-1.0, f64::from)),
            ("knob_tcp_buffer_bytes", k.tcp_buffer_bytes as f64),
            ("knob_sync_every", f64::from(k.sync.sync_every)),
            ("knob_outer_compression_ratio", k.sync.outer_compression.ratio()),
            ("knob_fragments", f64::from(k.sync.fragments)),
            ("knob_overlap", f64::from(k.sync.overlap)),
        ] {
            Self::set(&self.knobs, name, &l, v);
        }
    }

    /// Each actuator's standing, and how many settings of each kind were handed back.
    pub fn actuators(&self, standing: &[ActuatorStatus], released: &[(&str, usize)]) {
        for a in standing {
            let l = labels(&[("actuator", &a.actuator)]);
            self.actuator_pending.get_or_create(&l).set(i64::from(a.pending));
        }
        for (actuator, n) in released {
            self.actuator_released.get_or_create(&labels(&[("actuator", actuator)])).set(*n as i64);
        }
    }

    pub fn decision(&self, link: &str, state: &str) {
        if let Ok(mut shown) = self.shown.lock() {
            note(&mut shown.links, link);
            note(&mut shown.states, state);
        }
        self.decisions.get_or_create(&labels(&[("link", link), ("state", state)])).inc();
    }

    /// Per (interface, peer) and per NIC figures of a snapshot. `flows_read`: the flow table
    /// was read this tick (see [`peers::PeerMetrics::row`]).
    pub fn snapshot(&self, snap: &Snapshot, flows_read: bool) {
        if let Ok(mut shown) = self.shown.lock() {
            for p in &snap.peers {
                match shown.peers.get_mut(p.link.as_str()) {
                    Some(set) => note(set, &p.peer),
                    None => _ = shown.peers.insert(p.link.clone(), [p.peer.clone()].into()),
                }
            }
        }
        for p in &snap.peers {
            self.peers.row(p, flows_read);
        }
        for n in &snap.links {
            let l = labels(&[("interface", &n.link)]);
            for (name, v) in [
                ("nic_cnp_handled_per_second", n.cnp_handled_per_s),
                ("nic_cnp_sent_per_second", n.cnp_sent_per_s),
                ("nic_ecn_marked_per_second", n.ecn_marked_per_s),
                ("nic_retrans_events_per_second", n.retrans_events_per_s),
            ] {
                Self::set(&self.nic, name, &l, v);
            }
        }
    }

    /// Removes the series of links, states and (interface, peer) rows that are not in these
    /// lists (a reloaded policy's), whatever values they were written with.
    pub fn retain(&self, links: &[String], states: &[String], peers: &[(String, String)]) {
        let Ok(mut shown) = self.shown.lock() else { return };
        let all_states: BTreeSet<&String> = shown.states.iter().chain(states).collect();
        for link in &shown.links {
            let link_gone = !links.contains(link);
            for st in &all_states {
                if link_gone || !states.contains(st) {
                    let ls = labels(&[("link", link), ("state", st)]);
                    self.link_state.remove(&ls);
                    self.decisions.remove(&ls);
                }
            }
            if !link_gone {
                continue;
            }
            let l = labels(&[("link", link)]);
            self.link_state_level.remove(&l);
            for stat in LINK_RTT_STATS {
                self.link_rtt.remove(&labels(&[("link", link), ("stat", stat)]));
            }
            for (_, f) in self.link_f64.iter().chain(&self.knobs) {
                f.remove(&l);
            }
            for m in crate::control::knobs::Compression::MODES {
                self.knob_compression.remove(&labels(&[("link", link), ("mode", m)]));
            }
        }
        for (iface, names) in &shown.peers {
            for peer in names.iter().filter(|p| !peers.contains(&(iface.clone(), (*p).clone()))) {
                self.peers.remove(iface, peer);
            }
        }
        shown.links.retain(|l| links.contains(l));
        shown.states.retain(|s| states.contains(s));
        for (iface, names) in shown.peers.iter_mut() {
            names.retain(|p| peers.contains(&(iface.clone(), p.clone())));
        }
    }

    pub fn map(&self, map: &str, entries: u64, capacity: u64) {
        let l = labels(&[("map", map)]);
        self.map_entries.get_or_create(&l).set(entries as i64);
        self.map_capacity.get_or_create(&l).set(capacity as i64);
    }

    /// Also makes the interface's re-attach counter exist at 0, so "never re-attached" reads as 0
    /// rather than as no data.
    pub fn interface_present(&self, iface: &str, present: i64) {
        let l = labels(&[("interface", iface)]);
        self.interface_present.get_or_create(&l).set(present);
        let _ = self.interface_reattached.get_or_create(&l);
    }

    /// The running policy's digest: one series, the previous one's gone.
    pub fn policy(&self, sha256: &str) {
        self.policy_info.clear();
        self.policy_info.get_or_create(&labels(&[("sha256", sha256)])).set(1);
    }

    pub fn count(family: &Family<Labels, Counter>, key: &str, value: &str) {
        family.get_or_create(&labels(&[(key, value)])).inc();
    }

    /// The text exposition, with process figures read now.
    pub fn render(&self) -> String {
        if let Some((rss, cpu)) = process_figures() {
            self.resident.set(rss as i64);
            let seen = self.cpu.get();
            if cpu > seen {
                self.cpu.inc_by(cpu - seen);
            }
        }
        let mut out = String::new();
        if let Err(e) = encode(&mut out, &self.registry) {
            warn!("encoding metrics: {e}");
        }
        out
    }
}

/// (resident bytes, CPU seconds) of this process, from /proc/self.
pub fn process_figures() -> Option<(u64, f64)> {
    let statm = std::fs::read_to_string(crate::paths::PROC_SELF_STATM).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let stat = std::fs::read_to_string(crate::paths::PROC_SELF_STAT).ok()?;
    // Fields after the command name, which may itself hold spaces and parentheses.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some((pages * page, ticks / hz))
}

#[cfg(test)]
mod tests;
pub mod text;
