//! The actuators: what a decision changes outside the core. The egress DSCP map, the knob
//! board, the NCCL env file, TCP buffer sysctls and the RDMA ports' default RoCE traffic class.
//! Each fails alone: an error is logged and counted, and the others still apply.

use std::path::PathBuf;

use anyhow::Context;
use linkpilot_common::{DscpRule, ANY_PEER};
use tracing::{info, warn};

use super::metrics::Metrics;
use crate::{
    board::{board_link, BoardWriter},
    control::{Core, Decision},
    envfile,
    peers::PeerIds,
    probes::{monotonic_ns, Probes},
    rdma::{ports_of, RdmaPort},
    roce_tc::RoceTc,
    sysctl::Sysctls,
};

pub struct Actuators {
    pub board: Option<BoardWriter>,
    pub env_file: PathBuf,
    pub sysctls: Option<Sysctls>,
    pub roce: Option<RoceTc>,
}

/// The DSCP rules the current decisions ask for: each link's peers (or, for a link that names
/// none, everything) leave with the link's DSCP.
pub fn dscp_rules(core: &Core, peers: &PeerIds) -> Vec<DscpRule> {
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

fn report(metrics: &Metrics, actuator: &str, r: anyhow::Result<()>) {
    if let Err(e) = r {
        warn!(actuator, "{e:#}");
        Metrics::count(&metrics.actuator_errors, "actuator", actuator);
    }
}

impl Actuators {
    pub fn heartbeat(&mut self) {
        if let Some(b) = &mut self.board {
            b.heartbeat(monotonic_ns());
        }
    }

    /// Applies the core's current knobs after `decisions`. `ports` are the RDMA ports seen
    /// this tick. Order: DSCP, env file, sysctls, RoCE class, then the board.
    pub fn apply(
        &mut self,
        core: &Core,
        decisions: &[Decision],
        peers: &PeerIds,
        probes: &mut Probes,
        ports: &[RdmaPort],
        metrics: &Metrics,
    ) {
        report(
            metrics,
            "dscp",
            probes.set_dscp_rules(&dscp_rules(core, peers)).map_err(Into::into),
        );
        let current = core.current();
        let latest = decisions.iter().map(|d| d.id).max().unwrap_or(0);
        if let Some((link, state, k)) = current.first() {
            let r = envfile::write_atomic(&self.env_file, &envfile::render(link, state, k, latest))
                .with_context(|| format!("writing {}", self.env_file.display()));
            report(metrics, "env_file", r);
        }
        if let Some(s) = &mut self.sysctls {
            let max = current.iter().map(|(_, _, k)| k.tcp_buffer_bytes).max().unwrap_or(0);
            if max > 0 {
                let r = s.apply(max).map(|changes| {
                    for change in changes {
                        info!("sysctl {change}");
                    }
                });
                report(metrics, "sysctl", r.map_err(Into::into));
            }
        }
        if let Some(roce) = &mut self.roce {
            for (link, _, k) in &current {
                let Some(l) = core.policy().links.iter().find(|l| l.name == *link) else {
                    continue;
                };
                for iface in &l.interfaces {
                    for p in ports_of(ports, iface) {
                        let r = roce.set(&p.device, p.port, k.roce_traffic_class).map(|c| {
                            if let Some(c) = c {
                                info!("roce {c}");
                            }
                        });
                        report(metrics, "roce_tc", r.map_err(Into::into));
                    }
                }
            }
        }
        // The board last: when it shows a decision, everything else of it is in place.
        if let Some(b) = &mut self.board {
            let links: Vec<_> = current
                .iter()
                .map(|(link, state, k)| {
                    let idx = core.policy().states.iter().position(|s| s.name == *state);
                    let id = decisions
                        .iter()
                        .filter(|d| d.link == *link)
                        .map(|d| d.id)
                        .max()
                        .unwrap_or(latest);
                    board_link(link, state, idx.unwrap_or(0) as u32, k, id)
                })
                .collect();
            b.publish(&links, monotonic_ns());
        }
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
