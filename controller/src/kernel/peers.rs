//! Peer names to the numeric ids the programs count by: the first name gets 1 (0 is "other"),
//! and several prefixes may share a name.

use ipnet::IpNet;
use linkpilot_common::{MAX_PEERS, MAX_PEER_PREFIXES};

/// A key of the programs' LPM trie: prefix length, address.
pub type TrieKey = (u32, [u8; 16]);

/// A prefix as the programs' LPM trie holds it: IPv4 as IPv4-mapped IPv6, host bits cleared.
/// Two CIDRs with the same key are one entry (198.18.2.0/24 and ::ffff:198.18.2.0/120).
pub fn mapped(net: IpNet) -> TrieKey {
    match net {
        IpNet::V4(n) => (96 + u32::from(n.prefix_len()), n.network().to_ipv6_mapped().octets()),
        IpNet::V6(n) => (u32::from(n.prefix_len()), n.network().octets()),
    }
}

/// Peer names in id order (index = id - 1) and the (id, prefix) list for the probes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PeerIds {
    pub names: Vec<String>,
    pub prefixes: Vec<(u32, IpNet)>,
}

impl PeerIds {
    /// Assigns ids in order of first appearance. A prefix given twice for one peer is one
    /// entry; under two peers it is an error (the trie would keep the last), and so are more
    /// prefixes than the programs' trie holds.
    pub fn assign<'a>(
        peers: impl IntoIterator<Item = (&'a str, IpNet)>,
    ) -> anyhow::Result<PeerIds> {
        let mut out = PeerIds::default();
        let mut seen: Vec<(TrieKey, &str, IpNet)> = Vec::new();
        for (name, net) in peers {
            let key = mapped(net);
            if let Some((_, first, as_written)) = seen.iter().find(|(k, _, _)| *k == key) {
                anyhow::ensure!(
                    *first == name,
                    "prefix {net} of peer {name:?} is {as_written} of peer {first:?} already: a \
                     prefix belongs to one peer"
                );
                continue;
            }
            seen.push((key, name, net));
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
        anyhow::ensure!(
            out.prefixes.len() <= MAX_PEER_PREFIXES as usize,
            "{} peer prefixes (CIDRs of all peers together, IPv4 as IPv4-mapped IPv6); the \
             programs' peer table holds at most {MAX_PEER_PREFIXES}",
            out.prefixes.len()
        );
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
        let nets: Vec<IpNet> = (0..=MAX_PEERS).map(|i| n(&format!("10.{i}.0.0/16"))).collect();
        let e = PeerIds::assign(many.iter().map(String::as_str).zip(nets.iter().copied()));
        assert!(e.unwrap_err().to_string().contains("at most 64 peers"));
    }

    #[test]
    fn prefixes_are_counted_and_belong_to_one_peer() {
        let n = |s: &str| s.parse::<IpNet>().unwrap();
        let (len, addr) = mapped(n("198.18.1.0/24"));
        assert_eq!(len, 120);
        assert_eq!(&addr[10..], &[0xff, 0xff, 198, 18, 1, 0]);
        let (len, addr) = mapped(n("2001:db8:2::/48"));
        assert_eq!((len, addr[0], addr[1]), (48, 0x20, 0x01));
        // One peer naming a prefix twice (however spelt) is one entry.
        let p = PeerIds::assign([
            ("us", n("198.18.2.0/24")),
            ("us", n("::ffff:198.18.2.0/120")),
            ("us", n("198.18.2.9/24")),
        ])
        .unwrap();
        assert_eq!(p.prefixes.len(), 1);
        // Two peers: an error naming both.
        let e = PeerIds::assign([("us", n("198.18.2.0/24")), ("eu", n("::ffff:198.18.2.0/120"))])
            .unwrap_err()
            .to_string();
        assert!(e.contains("peer \"eu\"") && e.contains("of peer \"us\" already"), "{e}");
        // 257 prefixes of 3 peers: over the trie's 256.
        let nets: Vec<IpNet> =
            (0..257).map(|i| n(&format!("10.{}.{}.0/24", i / 256, i % 256))).collect();
        let e =
            PeerIds::assign(nets.iter().enumerate().map(|(i, net)| (["a", "b", "c"][i % 3], *net)))
                .unwrap_err()
                .to_string();
        assert!(e.contains("257 peer prefixes") && e.contains("at most 256"), "{e}");
    }
}
