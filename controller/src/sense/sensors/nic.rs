//! NIC counter rates per link, from the RDMA ports' hardware counters: a baseline of their own,
//! kept by (link, device, port, counter) apart from the per-peer counters of the programs, since
//! ports and counters come and go with drivers rather than with peers.

use std::collections::HashMap;

use super::{delta, LinkSnapshot};
use crate::rdma::RdmaPort;

const NIC_RETRANS_EVENTS: [&str; 4] =
    ["local_ack_timeout_err", "packet_seq_err", "implied_nak_seq_err", "roce_adp_retrans"];

/// NIC counters at the previous tick, by (link, device, port, counter).
#[derive(Default)]
pub(super) struct NicRates {
    prev: HashMap<(String, String, u32, String), u64>,
}

impl NicRates {
    /// NIC counter rates per link; a port or counter seen for the first time starts at zero.
    pub(super) fn rates(
        &mut self,
        nic: &[(String, Vec<RdmaPort>)],
        per_s: &dyn Fn(u64) -> f64,
    ) -> Vec<LinkSnapshot> {
        let mut seen = HashMap::new();
        let mut out = Vec::new();
        for (link, ports) in nic.iter().filter(|(_, p)| !p.is_empty()) {
            let mut snap = LinkSnapshot { link: link.clone(), ..LinkSnapshot::default() };
            for p in ports {
                snap.rdma_ports.push(format!("{}/{} {}", p.device, p.port, p.state));
                for (name, &now) in &p.signals {
                    let key = (link.clone(), p.device.clone(), p.port, name.clone());
                    let prev = self.prev.get(&key).copied().unwrap_or(now);
                    *snap.counters_per_s.entry(name.clone()).or_default() +=
                        per_s(delta(prev, now));
                    seen.insert(key, now);
                }
            }
            let rate = |name: &str| snap.counters_per_s.get(name).copied().unwrap_or(0.0);
            snap.cnp_handled_per_s = rate("rp_cnp_handled");
            snap.cnp_sent_per_s = rate("np_cnp_sent");
            snap.ecn_marked_per_s = rate("np_ecn_marked_roce_packets");
            snap.retrans_events_per_s = NIC_RETRANS_EVENTS.iter().map(|n| rate(n)).sum();
            out.push(snap);
        }
        // Ports that went away are forgotten with them.
        self.prev = seen;
        out
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, time::Duration};

    use super::super::{Readings, Sensors};
    use crate::rdma::RdmaPort;

    const S: Duration = Duration::from_secs(1);

    fn port(cnp_handled: u64, timeouts: u64) -> RdmaPort {
        let signals = BTreeMap::from([
            ("rp_cnp_handled".to_owned(), cnp_handled),
            ("local_ack_timeout_err".to_owned(), timeouts),
        ]);
        RdmaPort {
            device: "mlx5_0".into(),
            port: 1,
            state: "ACTIVE".into(),
            signals,
            ..RdmaPort::default()
        }
    }

    #[test]
    fn nic_counter_rates_per_link() {
        let mut s = Sensors::new(Duration::from_secs(10));
        let at = |cnp, to| Readings {
            nic: vec![("eth2".into(), vec![port(cnp, to)])],
            ..Readings::default()
        };
        let first = s.tick(Duration::ZERO, &at(5000, 10));
        assert_eq!(first.links[0].cnp_handled_per_s, 0.0, "the first reading is the baseline");
        let snap = s.tick(2 * S, &at(5400, 14));
        let l = &snap.links[0];
        assert_eq!(
            (l.link.as_str(), l.rdma_ports.clone()),
            ("eth2", vec!["mlx5_0/1 ACTIVE".to_owned()])
        );
        assert_eq!((l.cnp_handled_per_s, l.retrans_events_per_s), (200.0, 2.0));
        // The driver was reloaded: counters restart from zero.
        let snap = s.tick(3 * S, &at(30, 0));
        assert_eq!(snap.links[0].cnp_handled_per_s, 30.0);
        // Links without RDMA ports carry no NIC section.
        let none = Readings { nic: vec![("eth0".into(), vec![])], ..Readings::default() };
        assert!(s.tick(4 * S, &none).links.is_empty());
    }
}
