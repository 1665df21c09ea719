//! The judgments of state changes by the jobs' progress (`control::outcome`): per link, how
//! many came out kept, reverted or unjudged, and how many changes are held off after reverts
//! now (status says which, and for how long). Every link's series exist from the start, at 0,
//! and go with the link.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
};

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::{family, labels, Labels};
use crate::control::decide::{HeldChange, Verdict};

const VERDICTS: [&str; 3] = ["kept", "reverted", "unjudged"];

#[derive(Clone)]
pub struct OutcomeMetrics {
    verdicts: Family<Labels, Counter>,
    held: Family<Labels, Gauge>,
    links: Arc<Mutex<BTreeSet<String>>>,
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

    /// Every link of the running policy with its holds now; links gone lose their series.
    pub fn update(&self, links: &[String], held: &[HeldChange]) {
        let Ok(mut shown) = self.links.lock() else { return };
        for gone in shown.iter().filter(|l| !links.contains(l)) {
            self.held.remove(&labels(&[("link", gone)]));
            for v in VERDICTS {
                self.verdicts.remove(&labels(&[("link", gone), ("verdict", v)]));
            }
        }
        for link in links {
            let n = held.iter().filter(|h| &h.link == link).count();
            self.held.get_or_create(&labels(&[("link", link)])).set(n as i64);
            for v in VERDICTS {
                let _ = self.verdicts.get_or_create(&labels(&[("link", link), ("verdict", v)]));
            }
        }
        *shown = links.iter().cloned().collect();
    }
}
