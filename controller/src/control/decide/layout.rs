//! Which rows of a snapshot belong to which link, remembered by row position: the per-tick
//! pass over every row, kept apart from the decisions it feeds.

use std::collections::HashMap;

use super::Core;
use crate::{
    control::estimator::Aggregate,
    sense::sensors::{PeerSnapshot, Snapshot},
};

/// FNV-1a of a row's interface and peer names: comparing it with the last layout's costs far
/// less than comparing the strings (a collision could only misfile a row until the layout next
/// changes, at odds of 2^-64).
fn row_key(row: &PeerSnapshot) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in row.link.bytes().chain([0xff]).chain(row.peer.bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl Core {
    /// Each link's share of the snapshot, in one pass over its rows. Which link a row belongs
    /// to is remembered by row position and re-derived only when the layout changes (checking
    /// names for equality is far cheaper than hashing them: this is what keeps a tick of
    /// 64 links x 1,000 peers in budget).
    pub fn aggregate(&mut self, snap: &Snapshot) -> Vec<Aggregate> {
        let same = self.layout.len() == snap.peers.len()
            && self.layout.iter().zip(&snap.peers).all(|((h, _), row)| *h == row_key(row));
        if !same {
            let mut by_iface: HashMap<&str, usize> = HashMap::new();
            for (i, lc) in self.links.iter().enumerate() {
                for iface in &lc.estimator.link().interfaces {
                    by_iface.entry(iface.as_str()).or_insert(i);
                }
            }
            self.layout = snap
                .peers
                .iter()
                .map(|row| {
                    let link = by_iface
                        .get(row.link.as_str())
                        .copied()
                        .filter(|&i| self.links[i].estimator.counts_peer(&row.peer));
                    (row_key(row), link)
                })
                .collect();
        }
        let mut aggs = vec![Aggregate::default(); self.links.len()];
        for ((_, link), row) in self.layout.iter().zip(&snap.peers) {
            if let Some(i) = link {
                aggs[*i].add(row);
            }
        }
        for l in &snap.links {
            for (i, lc) in self.links.iter().enumerate() {
                if lc.estimator.link().interfaces.contains(&l.link) {
                    aggs[i].add_nic(l);
                }
            }
        }
        aggs
    }
}
