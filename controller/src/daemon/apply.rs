//! The actuators: what a plan (`control::plan`) changes outside the core. The egress DSCP map, the knob
//! board, the NCCL env file (with the policy's `[env]`), TCP buffer sysctls and the policy's
//! `[host]` sysctls, and the RDMA ports' default RoCE traffic class.
//! Each fails alone: an error is logged and counted, the others still apply, and the failed one
//! is pending (the ledger, the board's `pending` bits) and retried every tick until it holds.

use std::{
    path::PathBuf,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::Context;
use linkpilot_common::{board::BoardLink, DscpRule, ANY_PEER};
use tracing::{info, warn};

use super::{ledger::Ledger, metrics::Metrics, RunOptions};
use crate::{
    actuate::envfile,
    actuate::roce_tc::RoceTc,
    actuate::sysctl::{self, Sysctls},
    board::{self, BoardWriter},
    control::{
        knobs::{bytes, kept},
        Plan,
    },
    kernel::iface::Iface,
    kernel::peers::PeerIds,
    kernel::probes::{monotonic_ns, Probes},
    rdma::{ports_of, RdmaPort},
};

pub struct Actuators {
    /// The watched interfaces, which DSCP rules name (fixed for the run: a reload may not
    /// change them).
    pub ifaces: Vec<Iface>,
    pub board: Option<BoardWriter>,
    pub env_file: PathBuf,
    /// The NCCL tuner plugin the env file names when it is installed there.
    pub nccl_tuner: PathBuf,
    pub sysctls: Option<Sysctls>,
    pub roce: Option<RoceTc>,
    /// The link slots last published, kept current between decisions (the RTT baseline).
    pub published: Vec<BoardLink>,
    /// What each actuator has in place; pending ones are retried every tick.
    pub ledger: Ledger,
    /// The peers' transport profiles, when the sock_ops program is attached.
    pub transport: Option<super::transport::Profiles>,
}

/// The sysctls and RoCE classes, opened (a killed run's originals restored) once the instance
/// lock is held and before anything is attached: a state file that cannot be trusted stops the
/// start with nothing changed.
pub fn open_restorable(o: &RunOptions) -> anyhow::Result<(Option<Sysctls>, Option<RoceTc>)> {
    if o.dry_run {
        return Ok((None, None));
    }
    Ok((
        Some(Sysctls::open(&o.sysctl_root, &o.sysctl_state)?),
        Some(RoceTc::open(&o.rdma_cm_root, &o.roce_tc_state)?),
    ))
}

pub(super) fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64()
}

/// Whether the board's RTT baseline is worth republishing: first measured, or off by over 10%.
/// Whether a measurement moved far enough from the board's value to republish it.
fn rtt_moved(on_board: u64, now: u64) -> bool {
    on_board != now && (on_board == 0 || now.abs_diff(on_board) as f64 > 0.1 * on_board as f64)
}

/// The DSCP rules a plan asks for: on each of a link's interfaces, its peers (or, for a link
/// that names none, everything) leave with the link's DSCP. A rule names its interface, so links
/// reaching the same peer over different interfaces keep their own class; rules for any peer go
/// last, so that on a shared interface they could not hide a named one.
pub fn dscp_rules(plan: &Plan, peers: &PeerIds, ifaces: &[Iface]) -> Vec<DscpRule> {
    let (mut named, mut any) = (Vec::new(), Vec::new());
    for link in &plan.links {
        // "keep": the link's packets leave with the DSCP they have.
        let Some(dscp) = link.knobs.dscp else { continue };
        // The policy's interfaces were resolved at start, and a reload may not change them.
        for iface in ifaces.iter().filter(|i| link.interfaces.contains(&i.name)) {
            let rule = |peer| DscpRule {
                enabled: 1,
                ifindex: iface.ifindex,
                peer,
                port_lo: 0,
                port_hi: u16::MAX,
                dscp,
                _pad: [0; 3],
            };
            if link.peers.is_empty() {
                any.push(rule(ANY_PEER));
            }
            named.extend(link.peers.iter().filter_map(|p| peers.id(p)).map(rule));
        }
    }
    named.extend(any);
    named
}

impl Actuators {
    /// With the board (unless a dry run or observing only) and the opened sysctls and RoCE
    /// classes.
    pub fn new(
        o: &RunOptions,
        tick: Duration,
        (sysctls, roce): (Option<Sysctls>, Option<RoceTc>),
        ifaces: Vec<Iface>,
        observe_only: bool,
    ) -> anyhow::Result<Self> {
        let board = if o.dry_run || observe_only {
            None
        } else {
            let beat = tick.max(Duration::from_millis(100));
            Some(BoardWriter::create(&o.board, beat, monotonic_ns())?)
        };
        Ok(Self {
            ifaces,
            board,
            env_file: o.env_file.clone(),
            nccl_tuner: o.nccl_tuner.clone(),
            sysctls,
            roce,
            published: Vec::new(),
            ledger: Ledger::default(),
            transport: None,
        })
    }

    /// A watched interface created again (a new index): its DSCP rules are written anew.
    pub fn interface_recreated(&mut self, new: &Iface) {
        if let Some(i) = self.ifaces.iter_mut().find(|i| i.name == new.name) {
            *i = new.clone();
        }
        self.ledger.mark_pending("dscp", unix_now());
    }

    fn record(&mut self, m: &Metrics, actuator: &str, wanted: String, r: anyhow::Result<()>) {
        if !self.ledger.record(actuator, wanted, r, unix_now()) {
            Metrics::count(&m.actuator_errors, "actuator", actuator);
        }
    }

    /// Tells readers the daemon is alive; republishes the links instead when a link's RTT
    /// baseline or delivered rate moved by more than a tenth (the training side's "auto"
    /// synchronization sizes its rounds from them).
    fn heartbeat(&mut self, plan: &Plan) {
        let Some(b) = &mut self.board else { return };
        let mut moved = false;
        for l in &mut self.published {
            let Some(p) = plan.link(&board::name(&l.name)) else { continue };
            let now = board::rtt_us(p.baseline_ms);
            if rtt_moved(u64::from(l.rtt_us), u64::from(now)) {
                l.rtt_us = now;
                moved = true;
            }
            let rate = board::bps(p.burst_bps);
            if rtt_moved(l.delivery_bps, rate) {
                l.delivery_bps = rate;
                moved = true;
            }
        }
        if moved {
            b.publish(&self.published, monotonic_ns());
        } else {
            b.heartbeat(monotonic_ns());
        }
    }

    /// Applies `plan`: all of it when it follows new decisions (`fresh`), else only what is
    /// pending, again. `ports` are the RDMA ports seen this tick. Order: DSCP, env file, sysctls,
    /// RoCE class, transport, then the board, whose `pending` bits name what of the plan is not
    /// in place; without decisions the board only beats.
    pub fn apply(
        &mut self,
        plan: &Plan,
        fresh: bool,
        peers: &PeerIds,
        probes: &mut Probes,
        ports: &[RdmaPort],
        metrics: &Metrics,
    ) {
        let due = |l: &Ledger, a: &str| fresh || l.is_pending(a);
        if due(&self.ledger, "dscp") {
            let r = probes.set_dscp_rules(&dscp_rules(plan, peers, &self.ifaces));
            let wanted: Vec<String> =
                plan.links.iter().map(|l| format!("{}={}", l.link, kept(l.knobs.dscp))).collect();
            self.record(metrics, "dscp", wanted.join(" "), r.map_err(Into::into));
        }
        if let Some(l) = plan.links.first().filter(|_| due(&self.ledger, "env_file")) {
            let tuner = envfile::installed_tuner(&self.nccl_tuner)
                .map(|plugin| envfile::Tuner { plugin, chunk_max: plan.chunk_max });
            let text = envfile::render(
                &l.link,
                &l.state,
                &l.knobs,
                plan.decision,
                tuner.as_ref(),
                &plan.env,
            );
            let r = envfile::write_atomic(&self.env_file, &text)
                .with_context(|| format!("writing {}", self.env_file.display()));
            self.record(
                metrics,
                "env_file",
                format!("{} {} #{}", l.link, l.state, plan.decision),
                r,
            );
        }
        if let Some(s) = self.sysctls.as_mut().filter(|_| due(&self.ledger, "sysctl")) {
            let max = plan.links.iter().map(|l| l.knobs.tcp_buffer_bytes).max().unwrap_or(0);
            let r = if max > 0 { s.apply(max).map(log_changes) } else { Ok(()) };
            let wanted = if max > 0 { bytes(max) } else { String::new() };
            self.record(metrics, "sysctl", wanted, r.map_err(Into::into));
        }
        if let Some(s) = self.sysctls.as_mut().filter(|_| due(&self.ledger, "host_sysctl")) {
            // The policy's [host] sysctls (those a reloaded policy dropped go back).
            let host = sysctl::host_values(&plan.host);
            let r = s.apply_host(&host).map(log_changes);
            let wanted: Vec<String> =
                host.iter().map(|(k, v)| format!("{}={v}", k.replace('/', "."))).collect();
            self.record(metrics, "host_sysctl", wanted.join(" "), r.map_err(Into::into));
        }
        if let Some(roce) = self.roce.as_mut().filter(|_| due(&self.ledger, "roce_tc")) {
            let (mut wanted, mut first) = (Vec::new(), None);
            for l in &plan.links {
                // "keep": the ports' classes are the administrator's.
                let Some(tc) = l.knobs.roce_traffic_class else { continue };
                for p in l.interfaces.iter().flat_map(|i| ports_of(ports, i)) {
                    wanted.push(format!("{}/{}={tc}", p.device, p.port));
                    match roce.set(&p.device, p.port, tc) {
                        Ok(Some(c)) => info!("roce {c}"),
                        Ok(None) => {}
                        // Every port is tried; the first failure is the one reported.
                        Err(e) => {
                            first.get_or_insert(e);
                        }
                    }
                }
            }
            self.record(
                metrics,
                "roce_tc",
                wanted.join(" "),
                first.map_or(Ok(()), |e| Err(e.into())),
            );
        }
        if let Some(p) = self.transport.as_mut().filter(|_| due(&self.ledger, "transport")) {
            let (wanted, r) = match p.apply(plan, peers, probes) {
                Ok(w) => (w, Ok(())),
                Err(e) => (String::new(), Err(e.into())),
            };
            self.record(metrics, "transport", wanted, r);
        }
        let Some(b) = &mut self.board else { return };
        b.set_pending(self.ledger.bits());
        if !fresh {
            return self.heartbeat(plan);
        }
        // The board last: what it shows is in place, but for what its pending bits name.
        let links: Vec<_> = plan.links.iter().map(|l| board::link_of(l, &plan.sync)).collect();
        b.publish(&links, monotonic_ns());
        self.published = links;
    }

    /// Puts back what was changed (sysctls, RoCE traffic classes).
    pub fn restore(&mut self) {
        if let Some(s) = &mut self.sysctls {
            if let Err(e) = s.restore() {
                warn!("restoring sysctls: {e}");
            }
        }
        if let Some(r) = &mut self.roce {
            if let Err(e) = r.restore() {
                warn!("restoring RoCE traffic classes: {e}");
            }
        }
    }
}

fn log_changes(changes: Vec<String>) {
    for change in changes {
        info!("sysctl {change}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        control::{policy::builder::PolicyToml, Core, Policy},
        sense::sensors::Snapshot,
    };

    /// "lan" names no peer, on eth0 and eth1; "wan" and "dr" both name "us" on their own
    /// interfaces.
    fn policy() -> String {
        PolicyToml::new()
            .link_on("lan", &["eth0", "eth1"], "1Gbit/s")
            .link_on("wan", &["eth2"], "1Gbit/s")
            .peer("us", "198.18.2.0/24")
            .link_on("dr", &["eth3", "eth4"], "1Gbit/s")
            .peer("us", "198.18.2.0/24")
            .peer("eu", "198.18.3.0/24")
            .healthy()
            .build()
    }

    #[test]
    fn dscp_rules_per_interface_and_peer_with_any_peer_last() {
        let policy = Policy::parse(&policy(), "p.toml").unwrap_or_else(|e| panic!("{e}"));
        let peers = crate::daemon::peer_table(&policy).unwrap();
        let ifaces: Vec<Iface> =
            (0..5).map(|i| Iface { name: format!("eth{i}"), ifindex: 10 + i, l2: 0 }).collect();
        let mut core = Core::new(policy);
        core.step(&Snapshot::default());
        let rules = dscp_rules(&core.plan(), &peers, &ifaces);
        let (us, eu) = (peers.id("us").unwrap(), peers.id("eu").unwrap());
        let got: Vec<_> = rules.iter().map(|r| (r.ifindex, r.peer)).collect();
        assert_eq!(
            got,
            [(12, us), (13, us), (13, eu), (14, us), (14, eu), (10, ANY_PEER), (11, ANY_PEER)]
        );
        // The first match of each packet: its own interface's rule, whichever link comes first.
        let first = |ifindex, peer| rules.iter().position(|r| r.matches(ifindex, peer, 1, 2));
        assert_eq!(first(12, us), Some(0), "the peerless link hides nothing");
        assert_eq!(first(14, eu), Some(4));
        assert_eq!(first(11, us), Some(6));
        assert_eq!(first(12, eu), None, "wan names only us");
    }

    #[test]
    fn a_kept_dscp_makes_no_rule() {
        let kept = policy().replace("dscp = 26", "dscp = \"keep\"");
        let policy = Policy::parse(&kept, "p.toml").unwrap_or_else(|e| panic!("{e}"));
        let peers = crate::daemon::peer_table(&policy).unwrap();
        let ifaces: Vec<Iface> =
            (0..5).map(|i| Iface { name: format!("eth{i}"), ifindex: 10 + i, l2: 0 }).collect();
        let mut core = Core::new(policy);
        core.step(&Snapshot::default());
        assert!(dscp_rules(&core.plan(), &peers, &ifaces).is_empty());
    }

    #[test]
    fn the_rtt_is_republished_when_first_measured_or_off_by_ten_percent() {
        assert!(rtt_moved(0, 180_000));
        assert!(!rtt_moved(180_000, 180_000));
        assert!(!rtt_moved(180_000, 197_000));
        assert!(rtt_moved(180_000, 199_000));
        assert!(rtt_moved(180_000, 160_000));
        assert!(rtt_moved(180_000, 0), "unmeasured again is news too");
    }
}
