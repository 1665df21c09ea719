//! `linkpilot run`: the loop that closes: probes -> sensors -> control core -> actuators (the
//! egress DSCP map, the knob board, the NCCL env file, TCP buffer sysctls, RoCE traffic class),
//! once per policy tick, until SIGTERM/SIGINT, then everything is rolled back. Around it:
//! policy reload (SIGHUP, file change), Prometheus metrics and the status socket.

mod apply;
mod flow_reads;
mod health;
mod ifaces;
pub mod jobs;
pub(crate) mod ledger;
mod linelog;
mod losses;
pub(crate) mod metrics;
mod options;
mod reload;
mod report;
pub mod restore;
mod serve;
pub mod status;
pub mod status_request;
pub mod transport;

use std::{
    fs,
    io::Write,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context;
use tokio::signal::unix::{signal, SignalKind};
use tracing::{error, info, warn};

use crate::{
    board::{
        job_reports,
        tuner_stats::{self, TunerProcess},
    },
    control::{policy::sha256_hex, Core, Policy},
    kernel::checks,
    kernel::iface::{self, Iface},
    kernel::peers::PeerIds,
    kernel::probes::{self, monotonic_ns, Probes},
    rdma,
    sense::sensors::{Readings, Sensors},
};
use apply::Actuators;
use health::SensingHealth;
use metrics::Metrics;
pub use options::{MetricsAddr, RunOptions};
pub use restore::RestoreOptions;

/// One daemon per host: the lock `linkpilot run` holds (and `linkpilot restore` waits for).
pub const DEFAULT_LOCK: &str = "/run/linkpilot/linkpilot.lock";
use reload::PolicyWatch;
use status::Status;
use transport::TransportPath;

/// Peer ids across the policy's links (a name shared by links is one peer).
fn peer_table(policy: &Policy) -> anyhow::Result<PeerIds> {
    PeerIds::assign(policy.links.iter().flat_map(|l| {
        l.peers.iter().flat_map(|(name, nets)| nets.iter().map(move |n| (name.as_str(), *n)))
    }))
}

/// Parses the policy file's `bytes` and resolves `@default-route` to this namespace's
/// default-route device.
fn load_policy(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<Policy> {
    let src = std::str::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("{}: not UTF-8 text: {e}", path.display()))?;
    let mut policy = Policy::parse(src, &path.display().to_string())?;
    for w in policy.lossless_queue_warnings() {
        warn!("{}: {w}", path.display());
    }
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

/// Holds the instance lock: a second daemon would fight over the same maps and sysctls.
fn lock(path: &PathBuf) -> anyhow::Result<nix::fcntl::Flock<fs::File>> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // Not through a symlink: the file is truncated once locked.
    let f = crate::actuate::files::open_nofollow(
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
    /// The running policy's digest (metrics and status: which version a node runs).
    policy_sha256: String,
    decision_log: Option<linelog::LineLog>,
    record: Option<linelog::LineLog>,
    started: Instant,
    /// (link, last decision id, its reason) for the status API.
    last: Vec<(String, u64, String)>,
    /// When the flow table was last read and what reading it cost.
    flows_read: Option<(Instant, Duration)>,
    /// When the jobs' connections were last looked up between the once-a-second reads of the
    /// reports, and what that cost.
    owners_read: Option<(Instant, Duration)>,
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
    /// The training jobs' reports, as of the latest read (with the tuner's, once a second).
    jobs: jobs::Jobs,
    job_status: Vec<jobs::JobStatus>,
    job_refused: Vec<String>,
    /// Each job's totals since it was first read (what the core judges and sizes codecs by).
    job_totals: std::collections::BTreeMap<String, report::JobTotals>,
    /// The latest judgment per link.
    verdicts: Vec<crate::control::outcome::Verdict>,
    /// The policy names no peers: decisions are logged and shown, nothing is applied.
    observe_only: bool,
    /// How `[state.transport]` profiles reach connections, chosen at start.
    transport_path: TransportPath,
    /// What the sock_ops program has done, as of the latest read (once a second).
    transport_status: transport::TransportStatus,
    health: SensingHealth,
    /// Watched interfaces that are gone now (ifaces.rs).
    missing: Vec<String>,
    losses: losses::LossReport,
    /// This process's network namespace (inode number; 0: unknown).
    own_netns: u32,
    /// The reporting jobs' own namespaces the programs act in (`job_namespaces`).
    job_namespaces: std::collections::BTreeSet<probes::JobNetns>,
}

/// Why a policy that names no peers changes nothing on the host.
pub const OBSERVE_ONLY: &str = "the policy names no [[link.peer]]: observing only, as with \
    --dry-run (decisions are logged and shown; no DSCP, sysctl, RoCE class, board or env file \
    changes), since its DSCP would apply to every destination on the interface; name the peers \
    the links reach, then restart";

/// Runs the daemon until a signal (or `ticks`).
pub async fn run(o: RunOptions) -> anyhow::Result<()> {
    let policy_bytes = fs::read(&o.policy)
        .with_context(|| format!("reading the policy {}", o.policy.display()))?;
    let policy = load_policy(&o.policy, &policy_bytes)?;
    transport::check_algorithms(&policy, &o.sysctl_root)?;
    if let Some(dir) = &o.cgroup {
        // Asked for by name: a wrong one is an error, not a quiet fall back to the sysctls.
        transport::find_cgroup(Some(dir)).map_err(anyhow::Error::msg)?;
    }
    let policy_sha256 = sha256_hex(&policy_bytes);
    // Checks before side effects: interfaces, privileges, tracepoints.
    let names = interfaces(&policy);
    let ifaces = names.iter().map(|n| Iface::resolve(n)).collect::<Result<Vec<_>, _>>()?;
    let peers = peer_table(&policy)?;
    let offsets = checks::preflight(!o.skip_capability_check)?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sighup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let instance_lock = if o.dry_run { None } else { Some(lock(&o.lock)?) };
    let observe_only = !o.dry_run && !policy.names_peers();
    if observe_only {
        warn!("{OBSERVE_ONLY}");
    }
    let metrics = Metrics::new(o.dry_run || observe_only);
    if let Some(w) = o.metrics_addr.exposure_warning() {
        warn!("{w}");
    }
    if let MetricsAddr::At(a) = o.metrics_addr {
        // Scrapes on a thread of their own: they never delay a tick (serve.rs).
        serve::spawn(serve::bind(a)?, metrics.clone())?;
    }
    let status_listener = status::bind(&o.status_socket)?;
    let status: status::Shared = Arc::new(Mutex::new(Status {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        pid: std::process::id(),
        policy: o.policy.display().to_string(),
        policy_sha256: policy_sha256.clone(),
        starting: true,
        dry_run: o.dry_run,
        interfaces: names.clone(),
        ..Status::default()
    }));
    // Served from here on: loading the programs takes seconds on a busy node.
    let status_server = tokio::spawn(status::serve(status_listener, status.clone()));
    let decision_log = linelog::open(&o.decision_log, "decision_log")?;
    let record = linelog::open(&o.record, "record")?;
    let restorable = apply::open_restorable(&o)?;

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
    if policy.job_namespaces && offsets.netns_inum == 0 {
        warn!(
            "job_namespaces is ignored: this kernel gives no way to read a socket's network \
             namespace (no BTF); the jobs' own namespaces are left alone and their flows are \
             not counted"
        );
    }
    let own_netns = offsets.netns_inum;
    let mut probes = Probes::load_for(offsets, ifaces.len() as u32)?;
    let _datapath_log = crate::kernel::datapath_log::forward_from(&mut probes)
        .context("reading the programs' log")?;
    if o.netlink_tc {
        probes.use_netlink_tc();
    }
    probes.set_peers(&peers.prefixes)?;
    probes.sync_local_addrs(&iface::local_addrs(&ifaces).context("listing addresses")?)?;
    for iface in &ifaces {
        probes.watch(iface)?;
    }
    probes.attach_tracepoints()?;
    // A failure costs only those connections' marks and RTT samples: said, not fatal.
    match probes.seed_open_connections() {
        Ok(0) => {}
        Ok(n) => info!("connections open before the start, written into the flow table: {n}"),
        Err(e) => warn!(
            "writing the connections open before the start into the flow table: {e}; the marks \
             on those that only receive count as others'"
        ),
    }
    // Only a run that acts may change connections.
    let transport_path = if instance_lock.is_some() && !observe_only {
        transport::start(&mut probes, &policy, o.cgroup.as_deref())
    } else {
        TransportPath::Unneeded
    };

    let tick = Duration::from_nanos(policy.tick.0);
    let mut act = Actuators::new(&o, tick, restorable, ifaces.clone(), observe_only)?;
    if matches!(transport_path, TransportPath::SockOps { .. }) {
        act.transport = Some(transport::Profiles::default());
    }
    if !o.dry_run {
        if let Err(e) = tuner_stats::create_dir(&o.tuner_stats) {
            warn!(
                "{}: {e}; training processes' tuner plugins keep no counters",
                o.tuner_stats.display()
            );
        }
        if let Err(e) = job_reports::create_dir(&o.job_reports) {
            warn!("{}: {e}; training jobs cannot report", o.job_reports.display());
        }
    }
    info!(ifaces = ?names, dry_run = o.dry_run, "linkpilot running; SIGTERM or Ctrl-C to stop, SIGHUP reloads");
    let o_give_up = o.sensing_give_up_s;
    let mut d = Daemon {
        rows: peers.rows(),
        sensors: Sensors::new(Duration::from_nanos(policy.estimator.window.0)),
        core: Core::new(policy),
        watch: PolicyWatch::new(&o.policy, policy_bytes),
        policy_sha256,
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
        owners_read: None,
        flows_seen: 0,
        addrs_synced: Instant::now(),
        ports: Vec::new(),
        ports_found: None,
        tuner: Vec::new(),
        tuner_read: None,
        jobs: jobs::Jobs::default(),
        job_status: Vec::new(),
        job_refused: Vec::new(),
        job_totals: Default::default(),
        verdicts: Vec::new(),
        observe_only,
        transport_path,
        transport_status: Default::default(),
        health: SensingHealth::new(Duration::from_secs(o_give_up)),
        missing: Vec::new(),
        losses: losses::LossReport::default(),
        own_netns,
        job_namespaces: Default::default(),
    };
    for i in &d.ifaces {
        d.metrics.interface_present(&i.name, 1);
    }
    d.metrics.policy(&d.policy_sha256);
    info!("policy {} sha256 {}", d.o.policy.display(), d.policy_sha256);

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
                    let bytes = d.watch.read_now();
                    if let Some(t) = d.reload(bytes) {
                        ticker = tokio::time::interval(t);
                        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                    }
                    continue;
                }
            }
            if let Some(bytes) = d.watch.changed() {
                info!("{} changed: reloading", d.o.policy.display());
                if let Some(t) = d.reload(Ok(bytes)) {
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
            self.follow_interfaces()?;
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
        let tick = Duration::from_nanos(self.core.policy().tick.0);
        let mut readings = Readings { kernel_ns, ..Readings::default() };
        // Counters first, at the tick's start, so that every rate covers one tick's interval:
        // read after a full flow table (up to 63 ms), they made the next interval that much
        // shorter, and a bursty sender's short interval could hold none of its bursts (0 bit/s).
        self.probes.read_rows(&self.ifaces, &self.rows, &self.ports, &mut readings)?;
        let read_at = self.started.elapsed();
        if flow_reads::due(self.flows_read, tick) {
            let t = Instant::now();
            readings.flows = self.probes.flows()?;
            self.flows_read = Some((t, t.elapsed()));
            self.flows_seen = readings.flows.len() as u64;
        } else {
            readings.flows_skipped = true;
        }
        let present = (!readings.flows_skipped).then_some(readings.flows.len());
        let skipped = self.probes.skipped_runs();
        self.losses.update(&self.probes.losses()?, present, skipped, &self.metrics.datapath_lost);
        let flows = self.flows_seen;
        // A job's new connection marked before the once-a-second look-up finds it would give
        // its marks to others: its owner is looked up at once, within the same share of a core
        // as the flow table's reads.
        if !readings.flows_skipped
            && self.sensors.unknown_owner(&readings.flows)
            && flow_reads::due(self.owners_read, tick)
        {
            let t = Instant::now();
            self.look_up_job_flows();
            self.owners_read = Some((t, t.elapsed()));
        }
        let jobs = self.read_training_side();
        let mut snap = self.sensors.tick(read_at, &readings);
        // Only readings with jobs: a reading without any tells the judgments nothing.
        snap.jobs = jobs.filter(|j| !j.is_empty());
        if self.record.is_some() {
            linelog::append(&mut self.record, &serde_json::to_string(&snap)?, &self.metrics);
        }
        let decisions = self.core.step(&snap);
        for d in &decisions {
            info!(id = d.id, link = %d.link, state = %d.state, changes = ?d.changes, reason = %d.reason, "decision");
            linelog::append(&mut self.decision_log, &linelog::decision_line(d)?, &self.metrics);
            self.metrics.decision(&d.link, &d.state);
            match self.last.iter_mut().find(|(l, _, _)| *l == d.link) {
                Some(e) => *e = (d.link.clone(), d.id, d.reason.clone()),
                None => self.last.push((d.link.clone(), d.id, d.reason.clone())),
            }
        }
        for c in self.core.take_codec_checks() {
            info!(link = %c.link, codec = %c.prediction.codec, verdict = %c.verdict, check = %c.describe(), "codec prediction");
            self.metrics.codec.judged(&c);
        }
        for v in self.core.take_verdicts() {
            info!(link = %v.link, from = %v.from, to = %v.to, verdict = %v.verdict, why = %v.why, "outcome");
            self.metrics.outcome.verdict(&v);
            self.verdicts.retain(|o| o.link != v.link);
            self.verdicts.push(v);
        }
        if !self.o.dry_run && !self.observe_only {
            // Without decisions: pending actuators retried, then the board's heartbeat.
            self.act.apply(
                &self.core,
                &decisions,
                &self.peers,
                &mut self.probes,
                &self.ports,
                &self.metrics,
            );
        }
        self.report(&snap, flows, !readings.flows_skipped, work.elapsed());
        Ok(())
    }

    /// Loads the policy file again. An invalid one (or one that changes the interfaces, which
    /// needs a restart to re-attach) is rejected: logged with its errors, counted, and the
    /// running policy stays. Returns the new tick if it changed.
    fn reload(&mut self, bytes: std::io::Result<Vec<u8>>) -> Option<Duration> {
        let rejected = |d: &mut Self, why: String| {
            error!("policy reload rejected, keeping the running policy:\n{why}");
            Metrics::count(&d.metrics.reloads, "result", "rejected");
            if let Ok(mut st) = d.status.lock() {
                st.last_reload_error = Some(why);
            }
            None
        };
        let loaded = bytes
            .with_context(|| format!("reading the policy {}", self.o.policy.display()))
            .and_then(|b| Ok((load_policy(&self.o.policy, &b)?, sha256_hex(&b))));
        let (policy, sha256) = match loaded {
            Ok(p) => p,
            Err(e) => return rejected(self, format!("{e:#}")),
        };
        if policy.names_peers() != self.core.policy().names_peers() && !self.o.dry_run {
            let now = if self.observe_only { "observing only" } else { "acting" };
            return rejected(
                self,
                format!(
                    "{}: the new policy {} peers and the running one {}; linkpilot is {now}: \
                     restart it to {}",
                    self.o.policy.display(),
                    if policy.names_peers() { "names" } else { "names no" },
                    if self.observe_only { "names none" } else { "names some" },
                    if policy.names_peers() { "act on them" } else { "observe only" }
                ),
            );
        }
        if let Err(e) = transport::check_algorithms(&policy, &self.o.sysctl_root) {
            return rejected(self, format!("{e:#}"));
        }
        if policy.has_transport()
            && !self.o.dry_run
            && !self.observe_only
            && self.transport_path == TransportPath::Unneeded
        {
            return rejected(
                self,
                format!(
                    "{}: the new policy has [state.transport] profiles and the running one has \
                     none, so the sock_ops program is not attached: restart linkpilot to apply \
                     them",
                    self.o.policy.display()
                ),
            );
        }
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
        self.metrics.policy(&sha256);
        info!("policy reloaded from {} (sha256 {sha256})", self.o.policy.display());
        self.policy_sha256 = sha256;
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
}
