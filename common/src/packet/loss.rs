//! What the counters lose of a packet: the loss kinds the programs count and warn about, and
//! which of them a packet the parser rejected stands for.

use super::{be16, PacketBytes, ETH_HLEN, ETH_P_8021AD, ETH_P_8021Q, ETH_P_IP, ETH_P_IPV6};
use crate::{L2_ETHERNET, L2_RAW_IP};

/// What the counters lose of a packet, by kind: each kind has a counter and a rate-limited
/// warning (`linkpilot_datapath_lost_total{kind}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Loss {
    /// An IP header, or the TCP/UDP/extension header after it, cut short or malformed.
    TruncatedHeader = 0,
    /// A link layer the parser does not know: an interface type other than Ethernet or raw
    /// IP, or stacked VLAN tags.
    UnknownLinkType = 1,
    /// A map insert that failed (a full table).
    MapInsertFailed = 2,
    /// A map remove of a present key that failed (the kernel could not take the bucket's
    /// lock): a closed flow stays in the table until the LRU evicts it.
    MapRemoveFailed = 3,
}

/// Number of [`Loss`] kinds.
pub const LOSS_KINDS: usize = 4;

/// Why `parse` found no IP header in `p` (it returned `None`), if that loses an IP packet:
/// ARP, LLDP and the like lose nothing.
pub fn unparsed_loss(p: &(impl PacketBytes + ?Sized), l2: u32) -> Option<Loss> {
    let ethertype = match l2 {
        L2_ETHERNET => {
            let Some(outer) = be16(p, 12) else { return Some(Loss::TruncatedHeader) };
            if outer != ETH_P_8021Q && outer != ETH_P_8021AD {
                outer
            } else {
                match be16(p, ETH_HLEN + 2) {
                    None => return Some(Loss::TruncatedHeader),
                    Some(ETH_P_8021Q | ETH_P_8021AD) => return Some(Loss::UnknownLinkType),
                    Some(inner) => inner,
                }
            }
        }
        // Everything on a raw IP link is meant to be IP.
        L2_RAW_IP => return Some(Loss::TruncatedHeader),
        _ => return Some(Loss::UnknownLinkType),
    };
    (ethertype == ETH_P_IP || ethertype == ETH_P_IPV6).then_some(Loss::TruncatedHeader)
}
