//! The deciding owner: the control core with the running policy, the plan in place, and what
//! the decisions leave for the log, the metrics and the status API.

use tracing::info;

use super::{linelog, metrics::Metrics, reload::PolicyWatch};
use crate::{
    control::{outcome::Verdict, Core, Plan, Policy},
    sense::sensors::Snapshot,
};

pub(super) struct Decider {
    pub core: Core,
    /// What the actuators apply: the core's plan after the latest tick.
    pub plan: Plan,
    /// (link, last decision id, its reason) for the status API.
    pub last: Vec<(String, u64, String)>,
    /// The latest judgment per link.
    pub verdicts: Vec<Verdict>,
    decision_log: Option<linelog::LineLog>,
    /// The policy file, watched for changes.
    pub watch: PolicyWatch,
    /// The running policy's digest (metrics and status: which version a node runs).
    pub policy_sha256: String,
}

impl Decider {
    pub fn new(
        policy: Policy,
        watch: PolicyWatch,
        policy_sha256: String,
        decision_log: Option<linelog::LineLog>,
    ) -> Self {
        let core = Core::new(policy);
        Self {
            plan: core.plan(),
            core,
            last: Vec::new(),
            verdicts: Vec::new(),
            decision_log,
            watch,
            policy_sha256,
        }
    }

    pub fn policy(&self) -> &Policy {
        self.core.policy()
    }

    /// Folds in the tick's snapshot: decisions logged and counted, the codec predictions and
    /// judgments said, and the plan renewed. Returns whether anything was decided (the
    /// actuators then apply the whole plan, else only what is pending).
    pub fn decide(&mut self, snap: &Snapshot, metrics: &Metrics) -> anyhow::Result<bool> {
        let decisions = self.core.step(snap);
        for d in &decisions {
            info!(id = d.id, link = %d.link, state = %d.state, changes = ?d.changes, reason = %d.reason, "decision");
            linelog::append(&mut self.decision_log, &linelog::decision_line(d)?, metrics);
            metrics.decision(&d.link, &d.state);
            match self.last.iter_mut().find(|(l, _, _)| *l == d.link) {
                Some(e) => *e = (d.link.clone(), d.id, d.reason.clone()),
                None => self.last.push((d.link.clone(), d.id, d.reason.clone())),
            }
        }
        for c in self.core.take_codec_checks() {
            info!(link = %c.link, codec = %c.prediction.codec, verdict = %c.verdict, check = %c.describe(), "codec prediction");
            metrics.codec.judged(&c);
        }
        for v in self.core.take_verdicts() {
            info!(link = %v.link, from = %v.from, to = %v.to, verdict = %v.verdict, why = %v.why, "outcome");
            metrics.outcome.verdict(&v);
            self.verdicts.retain(|o| o.link != v.link);
            self.verdicts.push(v);
        }
        self.plan = self.core.plan();
        Ok(!decisions.is_empty())
    }

    /// Switches to a reloaded policy (the core keeps what it learnt, see `Core::reload`).
    pub fn reload(&mut self, policy: Policy, sha256: String) {
        self.core.reload(policy);
        self.plan = self.core.plan();
        self.policy_sha256 = sha256;
    }
}
