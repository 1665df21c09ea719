//! Peer names to the numeric ids the programs count by: the first name gets 1 (0 is "other"),
//! and several prefixes may share a name.

use ipnet::IpNet;
use linkpilot_common::MAX_PEERS;

/// Peer names in id order (index = id - 1) and the (id, prefix) list for the probes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PeerIds {
    pub names: Vec<String>,
    pub prefixes: Vec<(u32, IpNet)>,
}

impl PeerIds {
    /// Assigns ids in order of first appearance.
    pub fn assign<'a>(
        peers: impl IntoIterator<Item = (&'a str, IpNet)>,
    ) -> anyhow::Result<PeerIds> {
        let mut out = PeerIds::default();
        for (name, net) in peers {
            let id = match out.names.iter().position(|n| n == name) {
                Some(i) => i + 1,
                None => {
                    out.names.push(name.to_owned());
                    out.names.len()
                }
            };
            anyhow::ensure!(id <= MAX_PEERS as usize, "at most {MAX_PEERS} peers can be named");
            out.prefixes.push((id as u32, net));
        }
        Ok(out)
    }

    /// The id of peer `name`.
    pub fn id(&self, name: &str) -> Option<u32> {
        self.names.iter().position(|n| n == name).map(|i| i as u32 + 1)
    }

    /// (id, name) of every named peer, then (PEER_OTHER, "other"): the rows read per interface.
    pub fn rows(&self) -> Vec<(u32, String)> {
        (1..=self.names.len() as u32)
            .zip(self.names.iter().cloned())
            .chain([(linkpilot_common::PEER_OTHER, "other".to_owned())])
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_by_first_appearance_and_the_limit() {
        let n = |s: &str| s.parse::<IpNet>().unwrap();
        let p = PeerIds::assign([
            ("us", n("198.18.2.0/24")),
            ("eu", n("10.0.0.0/8")),
            ("us", n("2001:db8:2::/64")),
        ])
        .unwrap();
        assert_eq!(p.names, ["us", "eu"]);
        assert_eq!(p.prefixes.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [1, 2, 1]);
        assert_eq!((p.id("eu"), p.id("other")), (Some(2), None));
        let many: Vec<String> = (0..=MAX_PEERS).map(|i| format!("p{i}")).collect();
        assert!(PeerIds::assign(many.iter().map(|s| (s.as_str(), n("10.0.0.0/8")))).is_err());
    }
}
