//! `linkpilot run`: the loop that closes: probes -> sensors -> control core -> actuators (the
//! egress DSCP map, the knob board, the NCCL env file, TCP buffer sysctls, RoCE traffic class),
//! once per policy tick, until SIGTERM/SIGINT, then everything is rolled back. Around it:
//! policy reload (SIGHUP, file change), Prometheus metrics and the status socket.

mod apply;
mod decide;
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
mod sensing;
mod serve;
pub mod status;
pub mod status_request;
mod training;
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
use tracing::{info, warn};

use crate::{
    board::{job_reports, tuner_stats},
    control::{policy::sha256_hex, Policy},
    kernel::checks,
    kernel::iface::{self, Iface},
    kernel::peers::PeerIds,
    kernel::probes::{self, Probes},
    sense::sensors::Snapshot,
};
use apply::Actuators;
use decide::Decider;
use metrics::Metrics;
pub use options::{MetricsAddr, RunOptions};
pub use restore::RestoreOptions;
use sensing::Sensing;
use training::TrainingSide;

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

/// What the loop owns between ticks: an owner per step of a tick (sense, decide, apply,
/// report), each with its own state.
struct Daemon {
    o: RunOptions,
    /// The programs, interfaces, peers and sensors.
    sense: Sensing,
    /// The tuner plugins' counters and the jobs' reports.
    training: TrainingSide,
    /// The core, the running policy and the plan in place.
    decider: Decider,
    act: Actuators,
    /// The metrics, the status API and the start.
    report: Reporting,
    /// The policy names no peers: decisions are logged and shown, nothing is applied.
    observe_only: bool,
    /// How `[state.transport]` profiles reach connections, chosen at start.
    transport_path: TransportPath,
}

/// The reporting owner.
struct Reporting {
    metrics: Metrics,
    status: status::Shared,
    started: Instant,
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
    // Served from here on, on a thread of its own: loading the programs takes seconds on a
    // busy node, and a tick blocks this runtime while it works.
    let status_server = status::spawn(status_listener, status.clone())?;
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
    let sense = Sensing::new(
        ifaces,
        peers,
        probes,
        &policy,
        Duration::from_secs(o.sensing_give_up_s),
        own_netns,
        record,
    );
    let decider = Decider::new(
        policy,
        PolicyWatch::new(&o.policy, policy_bytes),
        policy_sha256,
        decision_log,
    );
    let mut d = Daemon {
        o,
        sense,
        training: TrainingSide::default(),
        decider,
        act,
        report: Reporting { metrics, status, started: Instant::now() },
        observe_only,
        transport_path,
    };
    for i in &d.sense.ifaces {
        d.report.metrics.interface_present(&i.name, 1);
    }
    d.report.metrics.policy(&d.decider.policy_sha256);
    info!("policy {} sha256 {}", d.o.policy.display(), d.decider.policy_sha256);

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
                    let bytes = d.decider.watch.read_now();
                    if let Some(t) = d.reload(bytes) {
                        ticker = tokio::time::interval(t);
                        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                    }
                    continue;
                }
            }
            if let Some(bytes) = d.decider.watch.changed() {
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
                    if let Some((ticks, lasted)) = d.sense.health.ok(Instant::now()) {
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
    status_server.stop();
    let _ = fs::remove_file(&d.o.status_socket);
    // Roll back whatever happened above.
    d.act.restore();
    drop(d.sense);
    info!("detached; sysctls restored");
    result
}

impl Daemon {
    /// Counts and shows a failed tick; Err when the failure has lasted too long.
    fn sensing_failed(&mut self, e: anyhow::Error) -> anyhow::Result<()> {
        let health = &mut self.sense.health;
        let verdict = health.failed(&e, Instant::now());
        // The first failure of a streak, then ever more rarely: no log flood at 10 ticks/s.
        if health.failing_ticks().is_power_of_two() {
            warn!(failing_ticks = health.failing_ticks(), "sensing failed, tick skipped: {e:#}");
        }
        self.report.metrics.sensing_errors.inc();
        if let Ok(mut st) = self.report.status.lock() {
            st.sensing_errors = health.total;
            st.sensing_failing_ticks = health.failing_ticks();
            st.last_sensing_error.clone_from(&health.last_error);
        }
        verdict
    }

    /// One tick: sense, decide, apply, report.
    fn tick(&mut self) -> anyhow::Result<()> {
        let work = Instant::now();
        let (snap, flows_read) = self.sense()?;
        let fresh = self.decider.decide(&snap, &self.report.metrics)?;
        if !self.o.dry_run && !self.observe_only {
            // Without decisions: pending actuators retried, then the board's heartbeat.
            let s = &mut self.sense;
            let (plan, m) = (&self.decider.plan, &self.report.metrics);
            self.act.apply(plan, fresh, &s.peers, &mut s.probes, &s.ports, m);
        }
        self.report(&snap, flows_read, work.elapsed());
        Ok(())
    }

    /// The tick's snapshot (the programs' counters, and the training side's reports when due),
    /// and whether it read the flow table.
    fn sense(&mut self) -> anyhow::Result<(Snapshot, bool)> {
        let tick = Duration::from_nanos(self.decider.policy().tick.0);
        let (o, m) = (&self.o, &self.report.metrics);
        let counted = self.sense.count(tick, self.report.started, o, m);
        for new in self.sense.take_recreated() {
            self.act.interface_recreated(&new);
        }
        let counted = counted?;
        let policy = self.decider.core.policy();
        if self.sense.owners_due(&counted, tick) {
            let t = Instant::now();
            self.training.look_up_job_flows(o, policy, &mut self.sense, m);
            self.sense.owners_looked_up(t.elapsed());
        }
        let plan = &self.decider.plan;
        let jobs = self.training.read(o, policy, plan, &self.transport_path, &mut self.sense, m);
        Ok((self.sense.snapshot(&counted, jobs, m)?, counted.read_flows()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_is_never_taken_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let (target, path) = crate::actuate::files::planted_symlink(dir.path(), "linkpilot.lock");
        let e = format!("{:#}", lock(&path).unwrap_err());
        assert!(e.contains("is a symbolic link; refusing to follow it"), "{e}");
        assert_eq!(fs::read_to_string(&target).unwrap(), "precious", "not truncated");
    }
}
