//! `linkpilot run`: the loop that closes: probes -> sensors -> control core -> actuators (the
//! egress DSCP map, the knob board, the NCCL env file, TCP buffer sysctls), once per policy
//! tick, until SIGTERM/SIGINT, then everything is rolled back.

use std::{
    fs,
    io::Write,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::Context;
use linkpilot_common::{DscpRule, ANY_PEER, PEER_OTHER};
use tokio::signal::unix::{signal, SignalKind};
use tracing::{info, warn};

use crate::{
    board::{board_link, BoardWriter},
    control::{Core, Decision, Policy},
    envfile,
    iface::{self, Iface},
    kernel,
    peers::PeerIds,
    probes::{monotonic_ns, Probes},
    sensors::{Readings, Sensors},
    sysctl::Sysctls,
};

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
}

/// Peer ids across the policy's links (a name shared by links is one peer).
fn peer_table(policy: &Policy) -> anyhow::Result<PeerIds> {
    PeerIds::assign(policy.links.iter().flat_map(|l| {
        l.peers.iter().flat_map(|(name, nets)| nets.iter().map(move |n| (name.as_str(), *n)))
    }))
}

/// The DSCP rules the current decisions ask for: each link's peers (or, for a link that names
/// none, everything) leave with the link's DSCP.
fn dscp_rules(core: &Core, peers: &PeerIds) -> Vec<DscpRule> {
    let mut rules = Vec::new();
    for (link_name, _, knobs) in core.current() {
        let Some(link) = core.policy().links.iter().find(|l| l.name == link_name) else {
            continue;
        };
        let rule = |peer| DscpRule {
            enabled: 1,
            peer,
            port_lo: 0,
            port_hi: u16::MAX,
            dscp: knobs.dscp,
            _pad: [0; 3],
        };
        if link.peers.is_empty() {
            rules.push(rule(ANY_PEER));
        }
        for (peer, _) in &link.peers {
            if let Some(id) = peers.id(peer) {
                rules.push(rule(id));
            }
        }
    }
    rules
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

/// Runs the daemon until a signal (or `ticks`).
pub async fn run(o: RunOptions) -> anyhow::Result<()> {
    let policy = Policy::load(&o.policy)?;
    // Checks before side effects: interfaces, privileges, tracepoints.
    let mut names: Vec<String> = Vec::new();
    for l in &policy.links {
        for i in &l.interfaces {
            if !names.contains(i) {
                names.push(i.clone());
            }
        }
    }
    let ifaces = names.iter().map(|n| Iface::resolve(n)).collect::<Result<Vec<_>, _>>()?;
    let peers = peer_table(&policy)?;
    kernel::check_privileges()?;
    let has_err = kernel::check_retransmit_tracepoint()?;
    kernel::check_probe_tracepoint()?;
    kernel::check_sock_state_tracepoint()?;
    let (offsets, note) = kernel::kernel_offsets(has_err);
    if let Some(note) = note {
        warn!("{note}");
    }
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut decision_log = open_append(&o.decision_log)?;
    let mut record = open_append(&o.record)?;

    let mut probes = Probes::load(offsets)?;
    probes.set_peers(&peers.prefixes)?;
    probes.sync_local_addrs(&iface::local_addrs(&ifaces).context("listing addresses")?)?;
    for iface in &ifaces {
        probes.watch(iface)?;
    }
    probes.attach_tracepoints()?;

    let tick = Duration::from_nanos(policy.tick.0);
    let mut sysctls =
        if o.dry_run { None } else { Some(Sysctls::open(&o.sysctl_root, &o.sysctl_state)?) };
    let mut board = if o.dry_run {
        None
    } else {
        Some(BoardWriter::create(&o.board, tick.max(Duration::from_millis(100)), monotonic_ns())?)
    };
    let mut sensors = Sensors::new(Duration::from_nanos(policy.estimator.window.0));
    let mut core = Core::new(policy);
    info!(ifaces = ?names, dry_run = o.dry_run, "linkpilot running; SIGTERM or Ctrl-C to stop");

    let peer_rows: Vec<(u32, String)> = (1..=peers.names.len() as u32)
        .zip(peers.names.iter().cloned())
        .chain([(PEER_OTHER, "other".to_owned())])
        .collect();
    let started = Instant::now();
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut n = 0u64;
    let result: anyhow::Result<()> = async {
        loop {
            let stop = tokio::select! {
                _ = ticker.tick() => false,
                _ = sigterm.recv() => true,
                _ = sigint.recv() => true,
            };
            if stop {
                return Ok(());
            }
            let kernel_ns = monotonic_ns();
            let mut readings = Readings { kernel_ns, flows: probes.flows()?, ..Readings::default() };
            for iface in &ifaces {
                for (id, name) in &peer_rows {
                    let stats = probes.peer_stats(iface.ifindex, *id)?;
                    readings.peers.push((iface.name.clone(), name.clone(), *id, stats));
                }
            }
            let snap = sensors.tick(started.elapsed(), &readings);
            if record.is_some() {
                append_line(&mut record, &serde_json::to_string(&snap)?);
            }
            let decisions = core.step(&snap);
            for d in &decisions {
                info!(id = d.id, link = %d.link, state = %d.state, changes = ?d.changes, reason = %d.reason, "decision");
                append_line(&mut decision_log, &serde_json::to_string(d)?);
            }
            if !o.dry_run {
                if !decisions.is_empty() {
                    apply(&core, &decisions, &peers, &mut probes, &mut board, &o, &mut sysctls)?;
                } else if let Some(b) = &mut board {
                    b.heartbeat(monotonic_ns());
                }
            }
            n += 1;
            if o.ticks.is_some_and(|t| n >= t) {
                return Ok(());
            }
        }
    }
    .await;
    // Roll back whatever happened above.
    if let Some(s) = &mut sysctls {
        if let Err(e) = s.restore() {
            warn!("restoring sysctls: {e}");
        }
    }
    drop(probes);
    info!("detached; sysctls restored");
    result
}

/// Applies the current decisions: DSCP map, board, env file, sysctls.
fn apply(
    core: &Core,
    decisions: &[Decision],
    peers: &PeerIds,
    probes: &mut Probes,
    board: &mut Option<BoardWriter>,
    o: &RunOptions,
    sysctls: &mut Option<Sysctls>,
) -> anyhow::Result<()> {
    probes.set_dscp_rules(&dscp_rules(core, peers))?;
    let current = core.current();
    let latest = decisions.iter().map(|d| d.id).max().unwrap_or(0);
    let links: Vec<_> = current
        .iter()
        .map(|(link, state, k)| {
            let idx = core.policy().states.iter().position(|s| s.name == *state).unwrap_or(0);
            let id =
                decisions.iter().filter(|d| d.link == *link).map(|d| d.id).max().unwrap_or(latest);
            board_link(link, state, idx as u32, k, id)
        })
        .collect();
    if let Some(b) = board {
        b.publish(&links, monotonic_ns());
    }
    if let Some((link, state, k)) = current.first() {
        envfile::write_atomic(&o.env_file, &envfile::render(link, state, k, latest))
            .with_context(|| format!("writing {}", o.env_file.display()))?;
    }
    if let Some(s) = sysctls {
        let max = current.iter().map(|(_, _, k)| k.tcp_buffer_bytes).max().unwrap_or(0);
        if max > 0 {
            for change in s.apply(max)? {
                info!("sysctl {change}");
            }
        }
    }
    Ok(())
}
