//! Prometheus metrics (`prometheus-client`), served over HTTP on 127.0.0.1:9464 by default
//! (`serve.rs`):
//! signals per link and peer, state, knobs, decisions, map pressure and the daemon's health.
//! The loop sets values each tick; process figures are read from /proc when scraped. Rates are
//! in bytes per second, Prometheus's base unit (the dashboard shows bits).
//!
//! This file holds the registry, the daemon's own health series and the helpers the series
//! groups share; each group with state of its own (links, peers, jobs, ...) has its file.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{atomic::AtomicU64, Arc, Mutex},
};

use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Metric, Registry},
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
mod links;
mod outcome;
mod peers;
mod transport;
mod tuner;

pub const DEFAULT_ADDR: &str = "127.0.0.1:9464";

type Labels = Vec<(String, String)>;
type F64 = Gauge<f64, AtomicU64>;
/// Families looked up by their name.
type Named<M> = Vec<(&'static str, Family<Labels, M>)>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn note(set: &mut BTreeSet<String>, v: &str) {
    if !set.contains(v) {
        set.insert(v.to_owned());
    }
}

/// Sets the series `l` of the family called `name` among `fams`.
fn set(fams: &Named<F64>, name: &str, l: &Labels, v: f64) {
    if let Some((_, f)) = fams.iter().find(|(n, _)| *n == name) {
        f.get_or_create(l).set(v);
    }
}

/// Every metric the daemon exports. Cloning shares the values.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    links: links::LinkMetrics,
    peers: peers::PeerMetrics,
    nic: Named<F64>,
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
    tuner: tuner::TunerMetrics,
    pub jobs: jobs::JobMetrics,
    pub outcome: outcome::OutcomeMetrics,
    pub codec: codec::CodecMetrics,
    pub transport: transport::TransportMetrics,
    /// The (interface, peer) rows written: interface -> peers, so that a reload can remove the
    /// rows the new policy no longer has.
    shown_peers: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>>,
}

/// A metric without labels, registered under `name`.
fn metric<M: Metric + Default + Clone>(r: &mut Registry, name: &str, help: &str) -> M {
    let m = M::default();
    r.register(name, help, m.clone());
    m
}

fn family<M>(r: &mut Registry, name: &str, help: &str) -> Family<Labels, M>
where
    Family<Labels, M>: Metric + Default + Clone,
{
    metric(r, name, help)
}

/// One family per (name, help) pair, kept with its name for [`set`].
fn families<M>(r: &mut Registry, specs: &[(&'static str, &str)]) -> Named<M>
where
    Family<Labels, M>: Metric + Default + Clone,
{
    specs.iter().map(|&(n, h)| (n, family(r, n, h))).collect()
}

impl Metrics {
    pub fn new(dry_run: bool) -> Self {
        let mut root = Registry::default();
        let r = root.sub_registry_with_prefix("linkpilot");
        let links = links::LinkMetrics::register(r);
        let peers = peers::PeerMetrics::register(r);
        let nic = families(
            r,
            &[
                ("nic_cnp_handled_per_second", "CNPs the RDMA NIC reacted to"),
                ("nic_cnp_sent_per_second", "CNPs the RDMA NIC sent"),
                ("nic_ecn_marked_per_second", "ECN-marked RoCE packets received"),
                ("nic_retrans_events_per_second", "RDMA retransmission events"),
            ],
        );
        let ticks = metric(r, "ticks", "Control ticks run");
        // 100 us .. ~3.3 s: a tick's work is well under a millisecond until the flow table
        // holds tens of thousands of flows.
        let tick_duration = Histogram::new(
            prometheus_client::metrics::histogram::exponential_buckets(1e-4, 2.0, 16),
        );
        r.register("tick_duration_seconds", "Work per tick", tick_duration.clone());
        let last_tick = metric(r, "last_tick_timestamp_seconds", "Unix time of the last tick");
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
        let sensing_errors =
            metric(r, "sensing_errors", "Ticks skipped because a sensing read failed");
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
        let resident = metric(r, "process_resident_bytes", "Resident set size");
        let cpu = metric(r, "process_cpu_seconds", "User + system CPU time");
        let tuner = tuner::TunerMetrics::register(r);
        let jobs = jobs::JobMetrics::register(r);
        let outcome = outcome::OutcomeMetrics::register(r);
        let codec = codec::CodecMetrics::register(r);
        let transport = transport::TransportMetrics::register(r);
        let build: Family<Labels, Gauge> = family(r, "build_info", "The running version");
        build.get_or_create(&labels(&[("version", env!("CARGO_PKG_VERSION"))])).set(1);
        let dry: Gauge = metric(r, "dry_run", "1 when decisions are only logged");
        dry.set(i64::from(dry_run));
        Self {
            registry: Arc::new(root),
            links,
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
            tuner,
            jobs,
            outcome,
            codec,
            transport,
            shown_peers: Arc::default(),
        }
    }

    /// The tuner plugin's counters of the live training processes.
    pub fn tuner(&self, procs: &[TunerProcess]) {
        self.tuner.update(procs);
    }

    /// A link's state (out of `states`, the ladder), knobs and signals.
    pub fn link(&self, link: &str, states: &[String], state: &str, k: &Knobs, s: &Signals) {
        self.links.link(link, states, state, k, s);
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
        self.links.decision(link, state);
    }

    /// Per (interface, peer) and per NIC figures of a snapshot. `flows_read`: the flow table
    /// was read this tick (see [`peers::PeerMetrics::row`]).
    pub fn snapshot(&self, snap: &Snapshot, flows_read: bool) {
        if let Ok(mut shown) = self.shown_peers.lock() {
            for p in &snap.peers {
                match shown.get_mut(p.link.as_str()) {
                    Some(set) => note(set, &p.peer),
                    None => _ = shown.insert(p.link.clone(), [p.peer.clone()].into()),
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
                set(&self.nic, name, &l, v);
            }
        }
    }

    /// Removes the series of links, states and (interface, peer) rows that are not in these
    /// lists (a reloaded policy's), whatever values they were written with.
    pub fn retain(&self, links: &[String], states: &[String], peers: &[(String, String)]) {
        self.links.retain(links, states);
        let Ok(mut shown) = self.shown_peers.lock() else { return };
        for (iface, names) in shown.iter() {
            for peer in names.iter().filter(|p| !peers.contains(&(iface.clone(), (*p).clone()))) {
                self.peers.remove(iface, peer);
            }
        }
        for (iface, names) in shown.iter_mut() {
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
