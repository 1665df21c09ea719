//! What the core wants in place after a tick: one complete plan per link (its state, knobs,
//! the NCCL rule, the peers and interfaces they apply to, and the rates the training side sizes
//! its rounds by) and the host-wide parts. The daemon's actuators apply a plan and ask the core
//! nothing else; `linkpilot replay --plans` prints the plans a trace leads to, and the status
//! API shows the one in place.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{
    knobs::{Compression, Knobs},
    policy::{Bounds, Host, NcclRule},
};

/// One link's part of a plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkPlan {
    pub link: String,
    pub state: String,
    /// The state's place in the ladder (0: the healthiest).
    pub state_index: u32,
    /// The decision that set this link's state and knobs.
    pub decision: u64,
    pub knobs: Knobs,
    /// Where the DSCP rule, the RoCE class and the transport profile go: the link's interfaces,
    /// and the peers it names (none: every destination on them).
    pub interfaces: Vec<String>,
    pub peers: Vec<String>,
    /// What the tuner plugin asks NCCL for in this state, for collectives from `nccl_min_bytes`.
    pub nccl: NcclRule,
    pub nccl_min_bytes: u64,
    /// What "auto" sync sizes its rounds by: the RTT baseline (ms), the busiest tick's delivery
    /// rate and the configured capacity (bit/s; `None`: "auto").
    pub baseline_ms: Option<f64>,
    pub burst_bps: f64,
    pub capacity_bps: Option<f64>,
}

/// The bounds the training side's "auto" sync works within (published with every link).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SyncBounds {
    pub sync_min: u32,
    pub sync_max: u32,
    pub sync_margin: f64,
    pub max_drift: u32,
    pub codec_weakest: Compression,
}

impl SyncBounds {
    pub fn of(b: &Bounds) -> Self {
        Self {
            sync_min: b.sync_min,
            sync_max: b.sync_max,
            sync_margin: b.sync_margin,
            max_drift: b.max_drift,
            codec_weakest: b.codec_weakest,
        }
    }
}

/// Everything the actuators apply after one tick.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The snapshot it follows (ms since the start, as the snapshots count).
    pub at_ms: u64,
    /// The newest decision of any link (0: none yet).
    pub decision: u64,
    /// Every link that has decided, in the policy's order.
    pub links: Vec<LinkPlan>,
    /// The policy's `[host]` sysctls and `[env]` variables.
    pub host: Host,
    pub env: BTreeMap<String, String>,
    /// The largest chunk the tuner plugin may choose.
    pub chunk_max: u64,
    pub sync: SyncBounds,
}

impl Plan {
    pub fn link(&self, name: &str) -> Option<&LinkPlan> {
        self.links.iter().find(|l| l.link == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::{
        policy::{builder::PolicyToml, Policy},
        tests::snap,
        Core,
    };
    use crate::sense::sensors::Snapshot;

    /// "wan" on eth0 toward "us" and "dr" on eth1 toward no one; healthy, then congested on CE
    /// with int8, DSCP 26 and an NCCL rule per state.
    fn policy() -> Policy {
        let src = PolicyToml::new()
            .table("[host]\ntcp_ecn = 1\n[env]\nNCCL_DEBUG = \"WARN\"")
            .table("[nccl]\nmin_bytes = \"1MiB\"\n[nccl.state.congested]\nalgo = \"tree\"\nmax_channels = 2")
            .hysteresis("1s", "1s")
            .link("wan", "eth0", "1Gbit/s", Some(("us", "198.18.2.0/24")))
            .link("dr", "eth1", "", None)
            .healthy()
            .congested_on_ce(26, 106)
            .build();
        Policy::parse(&src, "t").unwrap_or_else(|e| panic!("{e}"))
    }

    /// A tick of both links at 180 ms; `ce` on wan's only.
    fn both(at_ms: u64, ce: f64) -> Snapshot {
        let mut s = snap(at_ms, 180.0, 181.0, ce, 0.0);
        let dr = crate::sense::sensors::PeerSnapshot {
            link: "eth1".into(),
            ce_fraction: 0.0,
            ..s.peers[0].clone()
        };
        s.peers.push(dr);
        s
    }

    /// (link, id) of each decision of `ticks` of `both(_, ce)` from `from`.
    fn decide(core: &mut Core, ticks: std::ops::Range<u64>, ce: f64) -> Vec<(String, u64)> {
        let mut ids = Vec::new();
        for t in ticks {
            ids.extend(core.step(&both(t * 100, ce)).iter().map(|d| (d.link.clone(), d.id)));
        }
        ids
    }

    fn last(ids: &[(String, u64)], link: &str) -> Option<u64> {
        ids.iter().filter(|(l, _)| l == link).map(|(_, id)| *id).max()
    }

    #[test]
    fn the_plan_is_each_links_own_decision_with_what_its_state_and_link_ask() {
        let p = policy();
        let mut core = Core::new(p.clone());
        assert_eq!(core.plan().links, [], "nothing decided yet");
        let calm = decide(&mut core, 0..10, 0.0);
        // CE on wan only: wan decides again, dr keeps its last calm decision.
        let marked = decide(&mut core, 10..40, 0.05);
        assert!(!marked.is_empty() && marked.iter().all(|(l, _)| l == "wan"), "{marked:?}");
        let plan = core.plan();
        let newest = marked.iter().map(|(_, id)| *id).max();
        assert_eq!((plan.at_ms, Some(plan.decision)), (3900, newest));
        let (wan, dr) = (plan.link("wan").expect("wan"), plan.link("dr").expect("dr"));
        assert_eq!((wan.state.as_str(), wan.state_index), ("congested", 1));
        assert_eq!((dr.state.as_str(), dr.state_index), ("healthy", 0));
        assert_eq!((Some(wan.decision), Some(dr.decision)), (newest, last(&calm, "dr")));
        assert!(dr.decision < wan.decision, "{plan:?}");
        assert_eq!((wan.knobs.compression, wan.knobs.dscp), (Compression::Int8, Some(26)));
        assert_eq!((wan.nccl, dr.nccl), (p.nccl.rule(1), p.nccl.rule(0)));
        assert_eq!((wan.nccl.max_channels, wan.nccl_min_bytes), (2, 1 << 20));
        assert_eq!((wan.peers.clone(), dr.peers.clone()), (vec!["us".to_owned()], vec![]));
        let ifaces = (wan.interfaces.clone(), dr.interfaces.clone());
        assert_eq!(ifaces, (vec!["eth0".to_owned()], vec!["eth1".to_owned()]));
        assert_eq!((wan.capacity_bps, dr.capacity_bps), (Some(1e9), None));
        assert_eq!(wan.baseline_ms, Some(180.0));
        assert!(wan.burst_bps > 0.0, "{wan:?}");
        let env = plan.env.get("NCCL_DEBUG").map(String::as_str);
        assert_eq!((plan.host.tcp_ecn, env), (Some(1), Some("WARN")));
        assert_eq!((plan.chunk_max, plan.sync), (p.bounds.chunk_max, SyncBounds::of(&p.bounds)));
    }

    #[test]
    fn a_reload_keeps_each_links_decision_until_it_decides_again() {
        let mut core = Core::new(policy());
        let calm = decide(&mut core, 0..10, 0.0);
        core.reload(policy());
        let ids = |c: &Core| c.plan().links.iter().map(|l| l.decision).collect::<Vec<_>>();
        let before = [last(&calm, "wan"), last(&calm, "dr")];
        assert_eq!(ids(&core).into_iter().map(Some).collect::<Vec<_>>(), before);
        // The reload's tick re-decides both links ("policy reloaded").
        let again = decide(&mut core, 10..11, 0.0);
        assert_eq!(again.len(), 2, "{again:?}");
        assert_eq!(ids(&core), again.iter().map(|(_, id)| *id).collect::<Vec<_>>());
    }
}
