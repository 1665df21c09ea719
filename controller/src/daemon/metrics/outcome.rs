//! The judgments of state changes by the jobs' progress (`control::outcome`): per link, how
//! many came out kept, reverted or unjudged, and how many changes are held off after reverts
//! now (status says which, and for how long). Every link's series exist from the start, at 0,
//! and go with the link.

use std::sync::{Arc, Mutex};

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::{family, labels, Labels};
use crate::control::outcome::{HeldChange, Verdict};

const VERDICTS: [&str; 3] = ["kept", "reverted", "unjudged"];

#[derive(Clone)]
pub struct OutcomeMetrics {
    verdicts: Family<Labels, Counter>,
    held: Family<Labels, Gauge>,
    /// The links with series, in policy order.
    links: Arc<Mutex<Vec<String>>>,
}

impl OutcomeMetrics {
    pub fn register(r: &mut Registry) -> Self {
        Self {
            verdicts: family(
                r,
                "outcome_verdicts",
                "State changes judged by the jobs' progress: kept, reverted (the jobs slowed \
                 while the link did not worsen) or unjudged (too few steps, no job)",
            ),
            held: family(
                r,
                "outcome_held_changes",
                "State changes held off after reverts (which, and until when: linkpilot status)",
            ),
            links: Arc::default(),
        }
    }

    pub fn verdict(&self, v: &Verdict) {
        self.verdicts.get_or_create(&labels(&[("link", &v.link), ("verdict", &v.verdict)])).inc();
    }

    /// Every link of the running policy with its holds now. Series are made and removed only
    /// when the policy's links change (start, reload); a tick sets one gauge per link.
    pub fn update<'a>(&self, links: impl Iterator<Item = &'a str> + Clone, held: &[HeldChange]) {
        let Ok(mut shown) = self.links.lock() else { return };
        if !links.clone().eq(shown.iter().map(String::as_str)) {
            for gone in shown.iter().filter(|s| !links.clone().any(|l| l == s.as_str())) {
                self.held.remove(&labels(&[("link", gone)]));
                for v in VERDICTS {
                    self.verdicts.remove(&labels(&[("link", gone), ("verdict", v)]));
                }
            }
            *shown = links.clone().map(str::to_owned).collect();
            for link in shown.iter() {
                for v in VERDICTS {
                    let _ = self.verdicts.get_or_create(&labels(&[("link", link), ("verdict", v)]));
                }
            }
        }
        for link in links {
            let n = held.iter().filter(|h| h.link == link).count();
            self.held.get_or_create(&labels(&[("link", link)])).set(n as i64);
        }
    }
}
