//! A policy reload that keeps what the core has learnt (estimators, states, pacing, judgments)
//! wherever the new policy still means the same link, estimator and ladder.

use std::time::Duration;

use super::{Core, LinkControl};
use crate::control::policy::Policy;

impl Core {
    /// Switches to `policy` without forgetting what has been learnt: a link of the same name
    /// and definition keeps its estimator (baseline, windows) when the estimator settings are
    /// unchanged, and its state when the new ladder has one of that name; its knobs are
    /// re-derived on the next tick, which decides and says "policy reloaded". Ids continue.
    pub fn reload(&mut self, policy: Policy) {
        let same_estimator = policy.estimator == self.policy.estimator;
        let mut old: Vec<Option<LinkControl>> = self.links.drain(..).map(Some).collect();
        let old_states: Vec<String> = self.policy.states.iter().map(|s| s.name.clone()).collect();
        self.links = policy
            .links
            .iter()
            .map(|l| {
                let mut lc = LinkControl::new(&policy, l);
                let prev = old
                    .iter_mut()
                    .find(|o| o.as_ref().is_some_and(|o| o.estimator.link().name == l.name))
                    .and_then(Option::take);
                if let Some(prev) = prev {
                    if same_estimator && prev.estimator.link() == l {
                        lc.estimator = prev.estimator;
                        lc.signals = prev.signals;
                    }
                    let name = &old_states[prev.state];
                    if let Some(j) = policy.states.iter().position(|s| &s.name == name) {
                        lc.state = j;
                        lc.last_change = prev.last_change;
                    }
                    lc.knobs = prev.knobs;
                    lc.knob_changed = prev.knob_changed;
                    lc.decided = prev.decided;
                    // Holds name states by position: kept only for the same ladder.
                    let same_ladder = policy.states.iter().map(|s| &s.name).eq(old_states.iter());
                    if same_ladder {
                        lc.judge = prev.judge;
                        lc.judge.changed(0, 0, Duration::ZERO, false);
                    }
                }
                lc.reloaded = true;
                lc
            })
            .collect();
        self.policy = policy;
        self.layout.clear();
    }
}
