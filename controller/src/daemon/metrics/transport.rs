//! Per-peer transport (sock_ops), per link: connections carrying the link's current profile or
//! an older one, and the program's counts of connections profiled at establishment, brought up
//! to date, closed, and options the kernel refused. Series exist, at 0, for every link while
//! the program is attached.

use std::sync::{Arc, Mutex};

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::{family, labels, Labels};
use crate::daemon::transport::LinkTransport;

const EVENTS: [&str; 4] = ["profiled", "updated", "closed", "refused"];

/// Per link, the kernel's totals last exported, in [`EVENTS`] order.
type Exported = Arc<Mutex<Vec<(String, [u64; 4])>>>;

#[derive(Clone)]
pub struct TransportMetrics {
    connections: Family<Labels, Gauge>,
    events: Family<Labels, Counter>,
    /// What the counters showed last, per link and event (they are the kernel's totals).
    last: Exported,
}

impl TransportMetrics {
    pub fn register(r: &mut Registry) -> Self {
        Self {
            connections: family(
                r,
                "transport_connections",
                "TCP connections to the link's peers carrying a transport profile (sock_ops), \
                 by profile: the state's current one, or an older one not yet brought up to date",
            ),
            events: family(
                r,
                "transport_events",
                "The sock_ops program's work on the link's peers' connections: profiled when \
                 established, updated to a new profile, closed, options the kernel refused",
            ),
            last: Arc::default(),
        }
    }

    /// Every link's figures now (the links of the running policy, each read once a second).
    pub fn update(&self, links: &[LinkTransport]) {
        let Ok(mut last) = self.last.lock() else { return };
        last.retain(|(l, _)| {
            let keep = links.iter().any(|t| t.link == *l);
            if !keep {
                for p in ["current", "older"] {
                    self.connections.remove(&labels(&[("link", l), ("profile", p)]));
                }
                for e in EVENTS {
                    self.events.remove(&labels(&[("link", l), ("event", e)]));
                }
            }
            keep
        });
        for t in links {
            let l = t.link.as_str();
            let set = |p: &str, v: u64| {
                self.connections
                    .get_or_create(&labels(&[("link", l), ("profile", p)]))
                    .set(v as i64)
            };
            set("current", t.current);
            set("older", t.connections - t.current.min(t.connections));
            let now = [t.profiled, t.updated, t.closed, t.refused];
            let i = match last.iter().position(|(n, _)| n == l) {
                Some(i) => i,
                None => {
                    last.push((l.to_owned(), [0; 4]));
                    last.len() - 1
                }
            };
            for (k, e) in EVENTS.iter().enumerate() {
                // Kernel totals only grow while the program is attached (one per run).
                let delta = now[k].saturating_sub(last[i].1[k]);
                self.events.get_or_create(&labels(&[("link", l), ("event", e)])).inc_by(delta);
            }
            last[i].1 = now;
        }
    }
}
