//! `linkpilot run`: the loop that closes: probes -> sensors -> control core -> actuators (the
//! egress DSCP map, the knob board, the NCCL env file, TCP buffer sysctls, RoCE traffic class),
//! once per policy tick, until SIGTERM/SIGINT, then everything is rolled back. Around it:
//! policy reload (SIGHUP, file change), Prometheus metrics and the status socket.

mod actuate;
mod health;
pub mod ledger;
pub mod metrics;
mod reload;
mod serve;
pub mod status;

use std::{
    fs,
    io::Write,
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::Context;
use linkpilot_common::{MAX_FLOWS, MAX_PEERS};
use tokio::signal::unix::{signal, SignalKind};
use tracing::{error, info, warn};

use crate::{
    control::{Core, Policy},
    envfile,
    iface::{self, Iface},
    kernel,
    peers::PeerIds,
    probes::{self, monotonic_ns, Probes},
    rdma,
    sensors::{Readings, Sensors, Snapshot},
    tuner_stats::{self, TunerProcess},
};
use actuate::Actuators;
use health::SensingHealth;
use metrics::Metrics;
use reload::PolicyWatch;
use status::{LinkStatus, PeerStatus, Status};

/// Where everything goes; the defaults are the production paths. Also `linkpilot run`'s
/// command line.
#[derive(Clone, Debug, clap::Args)]
pub struct RunOptions {
    /// The policy file.
    #[arg(long, default_value = crate::control::policy::DEFAULT_PATH)]
    pub policy: PathBuf,
    /// Compute and log every decision; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[arg(long, default_value = crate::board::DEFAULT_PATH)]
    pub board: PathBuf,
    #[arg(long, default_value = envfile::DEFAULT_PATH)]
    pub env_file: PathBuf,
    /// The NCCL tuner plugin: while it is installed there, the env file names it
    /// (NCCL_TUNER_PLUGIN) and sets NCCL_BUFFSIZE to the policy's largest chunk; "off": never.
    #[arg(long, default_value = envfile::DEFAULT_TUNER)]
    pub nccl_tuner: PathBuf,
    /// Where training processes' tuner plugins keep their counters (created world-writable
    /// and sticky); status and metrics show them.
    #[arg(long, default_value = crate::tuner_stats::DEFAULT_DIR)]
    pub tuner_stats: PathBuf,
    #[arg(long, default_value = crate::sysctl::PROC_SYS, hide = true)]
    pub sysctl_root: PathBuf,
    #[arg(long, default_value = crate::sysctl::DEFAULT_STATE)]
    pub sysctl_state: PathBuf,
    /// Append every decision as a JSON line here.
    #[arg(long, value_name = "FILE")]
    pub decision_log: Option<PathBuf>,
    /// Append every snapshot as a JSON line here (the format `replay` reads).
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// Stop after this many ticks (tests, demos).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub ticks: Option<u64>,
    /// Prometheus metrics (HTTP, /metrics); "off" serves none.
    #[arg(long, default_value = metrics::DEFAULT_ADDR, value_parser = parse_metrics_addr)]
    pub metrics_addr: MetricsAddr,
    /// The status API's Unix socket (root-only).
    #[arg(long, default_value = status::DEFAULT_SOCKET)]
    pub status_socket: PathBuf,
    /// One daemon per host: held locked while running.
    #[arg(long, default_value = "/run/linkpilot/linkpilot.lock")]
    pub lock: PathBuf,
    /// RDMA devices' sysfs (their ports' netdevs and congestion counters).
    #[arg(long, default_value = crate::rdma::SYSFS_ROOT)]
    pub rdma_root: PathBuf,
    /// rdma_cm's configfs, where the ports' default RoCE traffic class is set.
    #[arg(long, default_value = crate::roce_tc::CONFIGFS_ROOT)]
    pub rdma_cm_root: PathBuf,
    /// Where the RoCE traffic classes' originals are kept while linkpilot manages them.
    #[arg(long, default_value = crate::roce_tc::DEFAULT_STATE)]
    pub roce_tc_state: PathBuf,
    /// Attach classifiers through the clsact qdisc (netlink) even where TCX exists, as on
    /// kernels before 6.6.
    #[arg(long, hide = true)]
    pub netlink_tc: bool,
    /// Stop once sensing has failed on every tick for this long (and at least 10 ticks).
    #[arg(long, value_name = "SECONDS", default_value_t = health::GIVE_UP_AFTER.as_secs(), hide = true)]
    pub sensing_give_up_s: u64,
}

#[derive(Clone, Copy, Debug)]
pub enum MetricsAddr {
    Off,
    At(SocketAddr),
}

fn parse_metrics_addr(s: &str) -> Result<MetricsAddr, String> {
    if s == "off" {
        return Ok(MetricsAddr::Off);
    }
    s.parse().map(MetricsAddr::At).map_err(|_| {
        format!("{s:?} is not an address: expected IP:PORT (e.g. 127.0.0.1:9464) or \"off\"")
    })
}

/// Peer ids across the policy's links (a name shared by links is one peer).
fn peer_table(policy: &Policy) -> anyhow::Result<PeerIds> {
    PeerIds::assign(policy.links.iter().flat_map(|l| {
        l.peers.iter().flat_map(|(name, nets)| nets.iter().map(move |n| (name.as_str(), *n)))
    }))
}

/// Loads the policy and resolves `@default-route` to this namespace's default-route device.
fn load_policy(path: &std::path::Path) -> anyhow::Result<Policy> {
    let mut policy = Policy::load(path)?;
    if policy.names_interface(iface::DEFAULT_ROUTE) {
        let dev = iface::default_route_device()?;
        anyhow::ensure!(
            !policy.names_interface(&dev),
            "{}: {} is {dev}, which another link names too: a link per interface",
            path.display(),
            iface::DEFAULT_ROUTE
        );
        info!("{}: {} is {dev}", path.display(), iface::DEFAULT_ROUTE);
        policy.rename_interface(iface::DEFAULT_ROUTE, &dev);
    }
    Ok(policy)
}

/// Every interface the policy's links name, once, in order.
fn interfaces(policy: &Policy) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for l in &policy.links {
        for i in &l.interfaces {
            if !names.contains(i) {
                names.push(i.clone());
            }
        }
    }
    names
}

fn append_line(file: &mut Option<fs::File>, line: &str) {
    if let Some(f) = file {
        if let Err(e) = writeln!(f, "{line}") {
            warn!("writing a log line: {e}");
        }
    }
}

fn open_append(path: &Option<PathBuf>) -> anyhow::Result<Option<fs::File>> {
    path.as_ref()
        .map(|p| {
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("opening {}", p.display()))
        })
        .transpose()
}

/// Holds the instance lock: a second daemon would fight over the same maps and sysctls.
fn lock(path: &PathBuf) -> anyhow::Result<nix::fcntl::Flock<fs::File>> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // Not through a symlink: the file is truncated once locked.
    let f = crate::files::open_nofollow(
        path,
        fs::OpenOptions::new().create(true).truncate(false).write(true),
    )
    .with_context(|| format!("opening {}", path.display()))?;
    let mut locked = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| {
            let other = fs::read_to_string(path).unwrap_or_default();
            anyhow::anyhow!(
                "{}: {e}: another linkpilot is running (pid {})",
                path.display(),
                other.trim()
            )
        })?;
    locked.set_len(0)?;
    write!(locked, "{}", std::process::id())?;
    Ok(locked)
}

/// What the loop owns between ticks.
struct Daemon {
    o: RunOptions,
    ifaces: Vec<Iface>,
    peers: PeerIds,
    rows: Vec<(u32, String)>,
    probes: Probes,
    sensors: Sensors,
    core: Core,
    act: Actuators,
    metrics: Metrics,
    status: status::Shared,
    watch: PolicyWatch,
    decision_log: Option<fs::File>,
    record: Option<fs::File>,
    started: Instant,
    /// (link, last decision id, its reason) for the status API.
    last: Vec<(String, u64, String)>,
    /// When the flow table was last read and what reading it cost.
    flows_read: Option<(Instant, Duration)>,
    flows_seen: u64,
    /// When the interfaces' addresses were last synced to the programs (retransmissions are
    /// attributed by local address, and addresses change: DHCP, failover).
    addrs_synced: Instant,
    /// RDMA ports on the watched interfaces, and when they were last discovered.
    ports: Vec<rdma::RdmaPort>,
    ports_found: Option<Instant>,
    /// The tuner plugin's counters of each training process, and when they were last read.
    tuner: Vec<TunerProcess>,
    tuner_read: Option<Instant>,
    health: SensingHealth,
}

/// Reading the flow table costs ~0.5 us per flow: a big table is read less often than the
/// counters, keeping that cost near 1% of a core, but at least every 2 s (or every tick, if
/// ticks are longer) so RTT stays fresh.
fn flow_read_interval(cost: Duration, tick: Duration) -> Duration {
    (cost * 100).min(Duration::from_secs(2)).max(tick)
}

fn flow_read_due(last: Option<(Instant, Duration)>, tick: Duration) -> bool {
    last.is_none_or(|(at, cost)| at.elapsed() >= flow_read_interval(cost, tick))
}

/// Runs the daemon until a signal (or `ticks`).
pub async fn run(o: RunOptions) -> anyhow::Result<()> {
    let policy = load_policy(&o.policy)?;
    // Checks before side effects: interfaces, privileges, tracepoints.
    let names = interfaces(&policy);
    let ifaces = names.iter().map(|n| Iface::resolve(n)).collect::<Result<Vec<_>, _>>()?;
    let peers = peer_table(&policy)?;
    let offsets = kernel::preflight()?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sighup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let instance_lock = if o.dry_run { None } else { Some(lock(&o.lock)?) };
    let metrics = Metrics::new(o.dry_run);
    if let MetricsAddr::At(a) = o.metrics_addr {
        // Scrapes on a thread of their own: they never delay a tick (serve.rs).
        serve::spawn(serve::bind(a)?, metrics.clone())?;
    }
    let status_listener = status::bind(&o.status_socket)?;
    let decision_log = open_append(&o.decision_log)?;
    let record = open_append(&o.record)?;
    let restorable = actuate::open_restorable(&o)?;

    // Only with the lock held: a dry run must not touch what a running daemon attached.
    for iface in ifaces.iter().filter(|_| instance_lock.is_some()) {
        let (removed, foreign) = probes::remove_stale(&iface.name);
        for r in removed {
            warn!("removed a stale attachment of a killed run: {r}");
        }
        for f in foreign {
            warn!("{f} is attached and held by something else (a pinned link?); left alone");
        }
    }
    let mut probes = Probes::load(offsets)?;
    if o.netlink_tc {
        probes.use_netlink_tc();
    }
    probes.set_peers(&peers.prefixes)?;
    probes.sync_local_addrs(&iface::local_addrs(&ifaces).context("listing addresses")?)?;
    for iface in &ifaces {
        probes.watch(iface)?;
    }
    probes.attach_tracepoints()?;

    let tick = Duration::from_nanos(policy.tick.0);
    let act = Actuators::new(&o, tick, restorable, ifaces.clone())?;
    if !o.dry_run {
        if let Err(e) = tuner_stats::create_dir(&o.tuner_stats) {
            warn!(
                "{}: {e}; training processes' tuner plugins keep no counters",
                o.tuner_stats.display()
            );
        }
    }
    let status: status::Shared = Arc::new(Mutex::new(Status::default()));
    let status_server = tokio::spawn(status::serve(status_listener, status.clone()));
    info!(ifaces = ?names, dry_run = o.dry_run, "linkpilot running; SIGTERM or Ctrl-C to stop, SIGHUP reloads");
    let o_give_up = o.sensing_give_up_s;
    let mut d = Daemon {
        rows: peers.rows(),
        sensors: Sensors::new(Duration::from_nanos(policy.estimator.window.0)),
        core: Core::new(policy),
        watch: PolicyWatch::new(&o.policy),
        o,
        ifaces,
        peers,
        probes,
        act,
        metrics,
        status,
        decision_log,
        record,
        started: Instant::now(),
        last: Vec::new(),
        flows_read: None,
        flows_seen: 0,
        addrs_synced: Instant::now(),
        ports: Vec::new(),
        ports_found: None,
        tuner: Vec::new(),
        tuner_read: None,
        health: SensingHealth::new(Duration::from_secs(o_give_up)),
    };

    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut n = 0u64;
    let result: anyhow::Result<()> = async {
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = sigterm.recv() => return Ok(()),
                _ = sigint.recv() => return Ok(()),
                _ = sighup.recv() => {
                    info!("SIGHUP: reloading {}", d.o.policy.display());
                    d.watch.mark_seen();
                    if let Some(t) = d.reload() {
                        ticker = tokio::time::interval(t);
                        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                    }
                    continue;
                }
            }
            if d.watch.changed() {
                info!("{} changed: reloading", d.o.policy.display());
                if let Some(t) = d.reload() {
                    ticker = tokio::time::interval(t);
                    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                }
            }
            // A failed read skips this tick (no decision, no heartbeat); only a lasting
            // failure stops the daemon (health.rs).
            match d.tick() {
                Ok(()) => {
                    if let Some((ticks, lasted)) = d.health.ok(Instant::now()) {
                        info!("sensing recovered after {ticks} failed tick(s) in {lasted:.1?}");
                    }
                }
                Err(e) => d.sensing_failed(e)?,
            }
            n += 1;
            if d.o.ticks.is_some_and(|t| n >= t) {
                return Ok(());
            }
        }
    }
    .await;
    status_server.abort();
    let _ = fs::remove_file(&d.o.status_socket);
    // Roll back whatever happened above.
    d.act.restore();
    drop(d.probes);
    info!("detached; sysctls restored");
    result
}

impl Daemon {
    /// Counts and shows a failed tick; Err when the failure has lasted too long.
    fn sensing_failed(&mut self, e: anyhow::Error) -> anyhow::Result<()> {
        let verdict = self.health.failed(&e, Instant::now());
        // The first failure of a streak, then ever more rarely: no log flood at 10 ticks/s.
        if self.health.failing_ticks().is_power_of_two() {
            warn!(
                failing_ticks = self.health.failing_ticks(),
                "sensing failed, tick skipped: {e:#}"
            );
        }
        self.metrics.sensing_errors.inc();
        if let Ok(mut st) = self.status.lock() {
            st.sensing_errors = self.health.total;
            st.sensing_failing_ticks = self.health.failing_ticks();
            st.last_sensing_error.clone_from(&self.health.last_error);
        }
        verdict
    }

    /// One tick: read, decide, apply, report.
    fn tick(&mut self) -> anyhow::Result<()> {
        let work = Instant::now();
        if self.addrs_synced.elapsed() >= Duration::from_secs(1) {
            self.addrs_synced = Instant::now();
            let addrs = iface::local_addrs(&self.ifaces).context("listing addresses")?;
            self.probes.sync_local_addrs(&addrs)?;
        }
        let kernel_ns = monotonic_ns();
        // The RDMA ports on the watched interfaces: found every 10 s (devices come and go),
        // their state and signal counters re-read every tick.
        if self.ports_found.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            // Only ports bound to a netdev of this namespace (rdma.rs: names alone mislead).
            let all = rdma::discover_here(&self.o.rdma_root).unwrap_or_else(|e| {
                warn!("{e}");
                Vec::new()
            });
            self.ports = all
                .into_iter()
                .filter(|p| self.ifaces.iter().any(|i| p.netdevs.contains(&i.name)))
                .map(|p| rdma::RdmaPort { other: Default::default(), ..p })
                .collect();
            self.ports_found = Some(Instant::now());
        } else {
            rdma::refresh(&self.o.rdma_root, &mut self.ports);
        }
        let ports = &self.ports;
        let tick = Duration::from_nanos(self.core.policy().tick.0);
        let mut readings = Readings { kernel_ns, ..Readings::default() };
        if flow_read_due(self.flows_read, tick) {
            let t = Instant::now();
            readings.flows = self.probes.flows()?;
            self.flows_read = Some((t, t.elapsed()));
            self.flows_seen = readings.flows.len() as u64;
        } else {
            readings.flows_skipped = true;
        }
        self.probes.read_rows(&self.ifaces, &self.rows, ports, &mut readings)?;
        let flows = self.flows_seen;
        let snap = self.sensors.tick(self.started.elapsed(), &readings);
        if self.record.is_some() {
            append_line(&mut self.record, &serde_json::to_string(&snap)?);
        }
        let decisions = self.core.step(&snap);
        for d in &decisions {
            info!(id = d.id, link = %d.link, state = %d.state, changes = ?d.changes, reason = %d.reason, "decision");
            append_line(&mut self.decision_log, &serde_json::to_string(d)?);
            self.metrics.decision(&d.link, &d.state);
            match self.last.iter_mut().find(|(l, _, _)| *l == d.link) {
                Some(e) => *e = (d.link.clone(), d.id, d.reason.clone()),
                None => self.last.push((d.link.clone(), d.id, d.reason.clone())),
            }
        }
        if !self.o.dry_run {
            // Without decisions: pending actuators retried, then the board's heartbeat.
            self.act.apply(
                &self.core,
                &decisions,
                &self.peers,
                &mut self.probes,
                ports,
                &self.metrics,
            );
        }
        self.report(&snap, flows, work.elapsed());
        Ok(())
    }

    /// Metrics and the status API after a tick.
    fn report(&mut self, snap: &Snapshot, flows: u64, work: Duration) {
        let m = &self.metrics;
        let states: Vec<String> =
            self.core.policy().states.iter().map(|s| s.name.clone()).collect();
        let signals = self.core.signals();
        let mut links = Vec::new();
        for (link, state, k) in self.core.current() {
            let s = signals.iter().find(|(l, _)| *l == link).map(|(_, s)| *s).unwrap_or_default();
            m.link(link, &states, state, &k, &s);
            let (id, reason) = self
                .last
                .iter()
                .find(|(l, _, _)| l == link)
                .map(|(_, id, r)| (*id, r.clone()))
                .unwrap_or_default();
            links.push(LinkStatus {
                link: link.to_owned(),
                state: state.to_owned(),
                knobs: k,
                signals: s,
                decision_id: id,
                reason,
            });
        }
        m.snapshot(snap);
        // Training processes' tuner counters: a directory listing and a read per process, at
        // most once a second.
        if self.tuner_read.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            self.tuner_read = Some(Instant::now());
            self.tuner = tuner_stats::scan(&self.o.tuner_stats, !self.o.dry_run);
            m.tuner(&self.tuner);
        }
        let (sysctls, roce) = (self.act.sysctls.as_ref(), self.act.roce.as_ref());
        let released = [
            ("sysctl", sysctls.map_or(0, |s| s.released().len())),
            ("roce_tc", roce.map_or(0, |r| r.released().len())),
        ];
        m.actuators(self.act.ledger.entries(), &released);
        m.map("flows", flows, u64::from(MAX_FLOWS));
        m.map("peers", self.peers.names.len() as u64, u64::from(MAX_PEERS));
        m.ticks.inc();
        m.tick_duration.observe(work.as_secs_f64());
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        m.last_tick.set(now.as_secs_f64());
        let reload = |r: &str| {
            m.reloads.get(&vec![("result".to_owned(), r.to_owned())]).map_or(0, |c| c.get())
        };
        let Ok(mut st) = self.status.lock() else { return };
        let last_reload_error = st.last_reload_error.take();
        *st = Status {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            pid: std::process::id(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            policy: self.o.policy.display().to_string(),
            dry_run: self.o.dry_run,
            interfaces: self.ifaces.iter().map(|i| i.name.clone()).collect(),
            tick_ms: self.core.policy().tick.0 as f64 / 1e6,
            ticks: m.ticks.get(),
            last_tick_work_ms: work.as_secs_f64() * 1e3,
            reloads_applied: reload("applied"),
            reloads_rejected: reload("rejected"),
            last_reload_error,
            sensing_errors: self.health.total,
            sensing_failing_ticks: 0,
            last_sensing_error: self.health.last_error.clone(),
            flows,
            flows_capacity: u64::from(MAX_FLOWS),
            sysctls_released: sysctls.map(|s| s.released().to_vec()).unwrap_or_default(),
            sysctls_unmanaged: sysctls.map(|s| s.unmanaged().to_vec()).unwrap_or_default(),
            roce_tc_released: roce.map(|r| r.released().to_vec()).unwrap_or_default(),
            actuators: self.act.ledger.entries().to_vec(),
            links,
            nccl_tuner: self.tuner.clone(),
            peers: snap
                .peers
                .iter()
                .map(|p| PeerStatus {
                    interface: p.link.clone(),
                    peer: p.peer.clone(),
                    srtt_ms: p.rtt.srtt_ms,
                    p99_ms: p.rtt.p99_ms,
                    rx_bps: p.rx_bps,
                    tx_bps: p.tx_bps,
                    ce_fraction: p.ce_fraction,
                    retrans_per_s: p.retrans_per_s,
                    flows: p.flows,
                })
                .collect(),
        };
    }

    /// Removes the metric series of links, states and peers the running policy no longer has.
    fn forget_series(&self) {
        let p = self.core.policy();
        let links: Vec<String> = p.links.iter().map(|l| l.name.clone()).collect();
        let states: Vec<String> = p.states.iter().map(|s| s.name.clone()).collect();
        let rows: Vec<(String, String)> = (self.ifaces.iter())
            .flat_map(|i| self.rows.iter().map(|(_, peer)| (i.name.clone(), peer.clone())))
            .collect();
        self.metrics.retain(&links, &states, &rows);
    }

    /// Loads the policy file again. An invalid one (or one that changes the interfaces, which
    /// needs a restart to re-attach) is rejected: logged with its errors, counted, and the
    /// running policy stays. Returns the new tick if it changed.
    fn reload(&mut self) -> Option<Duration> {
        let rejected = |d: &mut Self, why: String| {
            error!("policy reload rejected, keeping the running policy:\n{why}");
            Metrics::count(&d.metrics.reloads, "result", "rejected");
            if let Ok(mut st) = d.status.lock() {
                st.last_reload_error = Some(why);
            }
            None
        };
        let policy = match load_policy(&self.o.policy) {
            Ok(p) => p,
            Err(e) => return rejected(self, format!("{e:#}")),
        };
        let (old, new) = (interfaces(self.core.policy()), interfaces(&policy));
        if old != new {
            return rejected(
                self,
                format!(
                    "{}: interfaces {new:?} differ from the running {old:?}; restart linkpilot \
                     to watch other interfaces",
                    self.o.policy.display()
                ),
            );
        }
        let peers = match peer_table(&policy) {
            Ok(p) => p,
            Err(e) => return rejected(self, format!("{}: {e:#}", self.o.policy.display())),
        };
        let new_peers = peers.prefixes != self.peers.prefixes;
        if new_peers {
            if let Err(e) = self.probes.set_peers(&peers.prefixes) {
                // The trie may be half updated: put the running peers back.
                let back = self.probes.set_peers(&self.peers.prefixes);
                return rejected(self, format!("setting the peers: {e}; restoring them: {back:?}"));
            }
        }
        // Also when only names changed (same ids and prefixes): rows and rules go by name.
        self.rows = peers.rows();
        self.peers = peers;
        // Peer ids may now name other peers, or the window changed: rates and RTT windows
        // start again from the next reading.
        if new_peers || policy.estimator.window != self.core.policy().estimator.window {
            self.sensors = Sensors::new(Duration::from_nanos(policy.estimator.window.0));
        }
        let tick =
            (policy.tick != self.core.policy().tick).then(|| Duration::from_nanos(policy.tick.0));
        if let (Some(t), Some(b)) = (tick, &mut self.act.board) {
            // Readers judge staleness by the interval on the board.
            b.set_heartbeat_interval(t.max(Duration::from_millis(100)), monotonic_ns());
        }
        self.core.reload(policy);
        self.forget_series();
        Metrics::count(&self.metrics.reloads, "result", "applied");
        info!("policy reloaded from {}", self.o.policy.display());
        tick
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_is_never_taken_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        fs::write(&target, "precious").unwrap();
        let path = dir.path().join("linkpilot.lock");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let e = format!("{:#}", lock(&path).unwrap_err());
        assert!(e.contains("is a symbolic link; refusing to follow it"), "{e}");
        assert_eq!(fs::read_to_string(&target).unwrap(), "precious", "not truncated");
    }

    #[test]
    fn big_flow_tables_are_read_less_often_but_at_least_every_two_seconds_or_tick() {
        let ms = Duration::from_millis;
        assert_eq!(flow_read_interval(ms(0), ms(100)), ms(100), "small tables every tick");
        assert_eq!(flow_read_interval(ms(5), ms(100)), ms(500), "1% of a core");
        assert_eq!(flow_read_interval(ms(60), ms(100)), ms(2000), "at least every 2 s");
        assert_eq!(flow_read_interval(ms(60), ms(5000)), ms(5000), "never more than once a tick");
    }
}
