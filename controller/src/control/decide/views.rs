//! What the core shows of itself without deciding anything: each link's state, knobs and
//! signals, the plan in force, and the judgments and codec checks made or waiting.

use super::Core;
use crate::control::{
    codec::Check,
    estimator::Signals,
    knobs::Knobs,
    outcome::{HeldChange, Verdict},
    plan::{LinkPlan, Plan, SyncBounds},
    policy::Policy,
};

impl Core {
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// (link, state, knobs) of every link that has decided.
    pub fn current(&self) -> Vec<(&str, &str, Knobs)> {
        self.links
            .iter()
            .filter_map(|l| {
                let k = l.knobs?;
                Some((
                    l.estimator.link().name.as_str(),
                    self.policy.states[l.state].name.as_str(),
                    k,
                ))
            })
            .collect()
    }

    /// What every link that has decided should have in place now, and the host-wide parts.
    pub fn plan(&self) -> Plan {
        let p = &self.policy;
        let links = self
            .links
            .iter()
            .filter_map(|lc| {
                let knobs = lc.knobs?;
                let link = lc.estimator.link();
                Some(LinkPlan {
                    link: link.name.clone(),
                    state: p.states[lc.state].name.clone(),
                    state_index: lc.state as u32,
                    decision: lc.decided,
                    knobs,
                    interfaces: link.interfaces.clone(),
                    peers: link.peers.iter().map(|(name, _)| name.clone()).collect(),
                    nccl: p.nccl.rule(lc.state),
                    nccl_min_bytes: p.nccl.min_bytes,
                    baseline_ms: lc.signals.baseline_ms,
                    burst_bps: lc.signals.burst_bps,
                    capacity_bps: link.capacity_bps,
                })
            })
            .collect();
        Plan {
            at_ms: self.now.as_millis() as u64,
            decision: self.next_id - 1,
            links,
            host: p.host,
            env: p.env.clone(),
            chunk_max: p.bounds.chunk_max,
            sync: SyncBounds::of(&p.bounds),
        }
    }

    /// (link, latest signals) of every link.
    pub fn signals(&self) -> Vec<(&str, Signals)> {
        self.links.iter().map(|l| (l.estimator.link().name.as_str(), l.signals)).collect()
    }

    /// The judgments of state changes since the last call.
    pub fn take_verdicts(&mut self) -> Vec<Verdict> {
        std::mem::take(&mut self.verdicts)
    }

    /// Codec predictions judged since the last call.
    pub fn take_codec_checks(&mut self) -> Vec<Check> {
        std::mem::take(&mut self.codec_checks)
    }

    /// Each link's latest codec prediction, pending or judged.
    pub fn codec_checks(&self) -> Vec<Check> {
        self.links.iter().filter_map(|l| l.codec_check.clone()).collect()
    }

    /// Changes held off after reverts, every link's.
    pub fn held(&self) -> Vec<HeldChange> {
        let names = |i: usize| self.policy.states.get(i).map_or("?", |s| s.name.as_str());
        self.links
            .iter()
            .flat_map(|lc| {
                lc.judge.holds(self.now).map(|h| HeldChange {
                    link: lc.estimator.link().name.clone(),
                    from: names(h.from).to_owned(),
                    to: names(h.to).to_owned(),
                    remaining_s: h.until.saturating_sub(self.now).as_secs_f64(),
                    reverts: h.reverts,
                })
            })
            .collect()
    }

    /// (link, from, to, judged at ms) of each change waiting for its judgment.
    pub fn pending_judgments(&self) -> Vec<(String, String, String, u64)> {
        let names = |i: usize| self.policy.states.get(i).map_or("?", |s| s.name.as_str());
        self.links
            .iter()
            .filter_map(|lc| {
                let (f, t, at) = lc.judge.pending(&self.policy.outcome)?;
                Some((
                    lc.estimator.link().name.clone(),
                    names(f).to_owned(),
                    names(t).to_owned(),
                    at.as_millis() as u64,
                ))
            })
            .collect()
    }
}
