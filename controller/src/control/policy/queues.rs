//! Whether a policy's TCP DSCP would put TCP in a lossless (PFC) queue: `policy check` warns.
//!
//! RoCE fabrics give RoCE a lossless priority, where a full queue pauses the sender (PFC)
//! instead of dropping. TCP in that queue is paused with RoCE and stops reacting to loss, and
//! its bursts can pause the RoCE traffic of the whole port. Switches map DSCP to priority by
//! DSCP / 8 unless configured otherwise, and NVIDIA's RoCE configuration (and the reference
//! recipe's NCCL_IB_TC = 106, DSCP 26) makes priority 3 the lossless one.

use std::collections::BTreeSet;

use super::Policy;

/// The priority NVIDIA's RoCE configuration makes lossless (DSCP 24-31 under DSCP / 8).
const COMMON_LOSSLESS_PRIORITY: u8 = 3;

/// The priority a DSCP maps to under the switches' default trust-DSCP map.
fn priority(dscp: u8) -> u8 {
    dscp >> 3
}

impl Policy {
    /// One warning per TCP DSCP the ladder sets that equals the DSCP of a RoCE class it sets,
    /// shares its priority, or falls in the common lossless priority.
    pub fn lossless_queue_warnings(&self) -> Vec<String> {
        let dscps: BTreeSet<u8> = self.states.iter().filter_map(|s| s.knobs.dscp).collect();
        let roce: BTreeSet<u8> = self
            .states
            .iter()
            .filter_map(|s| s.knobs.roce_traffic_class)
            .map(|tc| tc >> 2)
            .collect();
        let mut out = Vec::new();
        for d in dscps {
            let why = if roce.contains(&d) {
                format!("is the DSCP of the policy's roce_traffic_class (traffic class / 4 = {d})")
            } else if let Some(r) = roce.iter().find(|&&r| priority(r) == priority(d)) {
                format!(
                    "maps to the priority of the policy's RoCE DSCP {r} (priority {} under the \
                     default DSCP / 8 map)",
                    priority(d)
                )
            } else if priority(d) == COMMON_LOSSLESS_PRIORITY {
                format!(
                    "maps to priority {COMMON_LOSSLESS_PRIORITY} under the default DSCP / 8 map, \
                     the priority NVIDIA's RoCE configuration makes lossless"
                )
            } else {
                continue;
            };
            out.push(format!(
                "dscp = {d} on TCP {why}: TCP there shares RoCE's lossless (PFC-paused) queue; \
                 use a DSCP of another priority, or \"keep\" (docs/policy.md, DSCP and RoCE)"
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::{init, Policy, SHIPPED};

    fn with(dscp: &str, tc: &str) -> Policy {
        let text = format!(
            "[[link]]\nname = \"wan\"\ninterfaces = [\"eth0\"]\ncapacity = \"10Gbit/s\"\n\
             [[state]]\nname = \"healthy\"\n[state.knobs]\ndscp = {dscp}\n\
             roce_traffic_class = {tc}\n"
        );
        Policy::parse(&text, "t").unwrap()
    }

    #[test]
    fn tcp_in_the_roce_class_or_its_priority_or_priority_3_is_warned_of() {
        let w = with("26", "106").lossless_queue_warnings();
        assert!(w.len() == 1 && w[0].contains("dscp = 26") && w[0].contains("= 26)"), "{w:?}");
        // 28 shares priority 3 with RoCE's 26.
        let w = with("28", "106").lossless_queue_warnings();
        assert!(w.len() == 1 && w[0].contains("RoCE DSCP 26"), "{w:?}");
        // No RoCE class set: priority 3 is still the common lossless one.
        let w = with("24", "\"keep\"").lossless_queue_warnings();
        assert!(w.len() == 1 && w[0].contains("priority 3"), "{w:?}");
        // A RoCE class on priority 5 (DSCP 40): TCP's 42 shares it.
        assert_eq!(with("42", "160").lossless_queue_warnings().len(), 1);
        for (dscp, tc) in [("10", "106"), ("46", "106"), ("\"keep\"", "106"), ("0", "\"keep\"")] {
            assert_eq!(with(dscp, tc).lossless_queue_warnings(), Vec::<String>::new(), "{dscp}");
        }
    }

    #[test]
    fn policy_inits_output_draws_no_warning_and_the_recipes_dscp_does() {
        let a = init::InitAnswers {
            link: "wan".into(),
            interface: "eth2".into(),
            peers: vec![],
            capacity: "40Gbit/s".parse().unwrap(),
            rtt: "180ms".parse().unwrap(),
            dscp: None,
            roce_traffic_class: Some(106),
            transport: true,
            tcp_buffers: false,
        };
        let p = Policy::parse(&init::render(&a).unwrap(), "init").unwrap();
        assert!(p.lossless_queue_warnings().is_empty());
        // The shipped policies keep TCP's DSCP; with the RoCE class's 26 on TCP, hk-us.toml
        // would draw one warning.
        for (name, text) in SHIPPED {
            let p = Policy::parse(text, name).unwrap();
            assert!(p.lossless_queue_warnings().is_empty(), "{name}");
        }
        let hk_us = SHIPPED.iter().find(|(n, _)| *n == "hk-us").unwrap().1;
        let marked = hk_us.replace("dscp = \"keep\"", "dscp = 26");
        assert_eq!(Policy::parse(&marked, "hk-us").unwrap().lossless_queue_warnings().len(), 1);
    }
}
