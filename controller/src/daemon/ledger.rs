//! What each actuator has in place and what the current decisions want of it. An actuator whose
//! write failed is pending: retried every tick until it holds, shown by the board's `pending`
//! bits, `linkpilot status` and the `linkpilot_actuator_pending` metric.

use linkpilot_common::board::pending;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

/// One actuator's standing, as status shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ActuatorStatus {
    /// A name of [`pending::NAMES`].
    pub actuator: String,
    /// What the current decisions ask of it ("" for nothing).
    pub wanted: String,
    /// What its last successful write put in place (`None`: nothing yet).
    pub applied: Option<String>,
    /// `wanted` is not in place: the last write failed; retried every tick.
    pub pending: bool,
    /// Unix time (s) of the first failure since it last held.
    pub pending_since: Option<f64>,
    /// The latest failure, kept after it holds again.
    pub last_error: Option<String>,
    /// Failed writes, retries included.
    pub errors: u64,
}

/// Every actuator's standing, in [`pending::NAMES`] order.
#[derive(Default)]
pub struct Ledger {
    entries: Vec<ActuatorStatus>,
}

impl Ledger {
    fn entry(&mut self, actuator: &str) -> &mut ActuatorStatus {
        let at = match self.entries.iter().position(|e| e.actuator == actuator) {
            Some(i) => i,
            None => {
                let rank = |a: &str| pending::NAMES.iter().position(|n| *n == a);
                let i = self.entries.partition_point(|e| rank(&e.actuator) < rank(actuator));
                let e = ActuatorStatus { actuator: actuator.to_owned(), ..Default::default() };
                self.entries.insert(i, e);
                i
            }
        };
        &mut self.entries[at]
    }

    /// Records an attempt to put `wanted` in place at Unix time `now`; true if it held. Logs
    /// when an actuator falls behind or catches up (or its error changes), not every retry.
    pub fn record(
        &mut self,
        actuator: &str,
        wanted: String,
        r: anyhow::Result<()>,
        now: f64,
    ) -> bool {
        let e = self.entry(actuator);
        e.wanted = wanted;
        match r {
            Ok(()) => {
                if let Some(since) = e.pending_since.take() {
                    info!(actuator, wanted = %e.wanted, after_s = now - since, "in place again");
                }
                e.applied = Some(e.wanted.clone());
                e.pending = false;
                true
            }
            Err(err) => {
                let msg = format!("{err:#}");
                if !e.pending || e.last_error.as_deref() != Some(msg.as_str()) {
                    warn!(actuator, wanted = %e.wanted, "not in place, retried every tick: {msg}");
                }
                e.pending = true;
                e.pending_since.get_or_insert(now);
                e.last_error = Some(msg);
                e.errors += 1;
                false
            }
        }
    }

    /// What `actuator` put in place no longer holds (its interface was created again): it is
    /// pending until the next write.
    pub fn mark_pending(&mut self, actuator: &str, now: f64) {
        let e = self.entry(actuator);
        e.pending = true;
        e.pending_since.get_or_insert(now);
    }

    pub fn is_pending(&self, actuator: &str) -> bool {
        self.entries.iter().any(|e| e.actuator == actuator && e.pending)
    }

    /// The board's [`pending`] bits.
    pub fn bits(&self) -> u32 {
        pending::NAMES
            .iter()
            .enumerate()
            .filter(|(_, n)| self.is_pending(n))
            .fold(0, |bits, (i, _)| bits | 1 << i)
    }

    pub fn entries(&self) -> &[ActuatorStatus] {
        &self.entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_from_the_first_failure_until_it_holds() {
        let mut l = Ledger::default();
        assert!(l.record("roce_tc", "mlx5_0/1=106".into(), Ok(()), 1.0));
        assert!(!l.record("env_file", "decision 1".into(), Err(anyhow::anyhow!("EROFS")), 2.0));
        assert!(!l.record("env_file", "decision 2".into(), Err(anyhow::anyhow!("EROFS")), 3.0));
        assert_eq!(l.bits(), pending::ENV_FILE);
        let e = &l.entries()[0];
        assert_eq!((e.actuator.as_str(), e.applied.as_deref()), ("env_file", None), "in order");
        assert_eq!((e.wanted.as_str(), e.pending_since, e.errors), ("decision 2", Some(2.0), 2));
        assert!(l.record("env_file", "decision 2".into(), Ok(()), 4.0));
        let e = &l.entries()[0];
        assert_eq!(
            (e.pending, e.pending_since, e.applied.as_deref()),
            (false, None, Some("decision 2"))
        );
        assert_eq!(e.last_error.as_deref(), Some("EROFS"), "kept for the operator");
        assert_eq!(l.bits(), 0);
        l.record("sysctl", "64MiB".into(), Err(anyhow::anyhow!("x")), 5.0);
        l.record("roce_tc", "mlx5_0/1=42".into(), Err(anyhow::anyhow!("x")), 5.0);
        assert_eq!(l.bits(), pending::SYSCTL | pending::ROCE_TC);
        assert_eq!(l.entries()[2].applied.as_deref(), Some("mlx5_0/1=106"), "the old value holds");
    }

    #[test]
    fn metrics_say_which_actuators_are_pending_and_what_was_released() {
        let m = super::super::metrics::Metrics::new(false);
        let text = m.render();
        for a in pending::NAMES {
            let line = format!("linkpilot_actuator_pending{{actuator=\"{a}\"}} 0");
            assert!(text.lines().any(|l| l == line), "{line} from the start:\n{text}");
        }
        let mut l = Ledger::default();
        l.record("env_file", "wan healthy #1".into(), Err(anyhow::anyhow!("EROFS")), 1.0);
        l.record("dscp", "wan=26".into(), Ok(()), 1.0);
        m.actuators(l.entries(), &[("sysctl", 1), ("roce_tc", 0)]);
        let text = m.render();
        for line in [
            "linkpilot_actuator_pending{actuator=\"env_file\"} 1",
            "linkpilot_actuator_pending{actuator=\"dscp\"} 0",
            "linkpilot_actuator_released{actuator=\"sysctl\"} 1",
            "linkpilot_actuator_released{actuator=\"roce_tc\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
        }
    }
}
