//! Header parsing shared by the TC programs (reading through `bpf_skb_load_bytes`) and the unit
//! tests (reading from a slice). No loops, bounded work: it must pass the verifier unchanged.

use crate::{L2_ETHERNET, L2_RAW_IP};

/// Random access to packet bytes starting at the first byte the TC program sees.
pub trait PacketBytes {
    /// The byte at `offset`, or `None` past the end of the packet.
    fn byte(&self, offset: usize) -> Option<u8>;
}

impl PacketBytes for [u8] {
    fn byte(&self, offset: usize) -> Option<u8> {
        self.get(offset).copied()
    }
}

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;

fn be16(p: &(impl PacketBytes + ?Sized), off: usize) -> Option<u16> {
    Some(u16::from_be_bytes([p.byte(off)?, p.byte(off + 1)?]))
}

/// Length of the headers that every segment of a GSO packet repeats: L2 (`l2` is
/// [`L2_ETHERNET`] or [`L2_RAW_IP`]), one optional 802.1Q/802.1ad tag, IPv4 (with options) or
/// IPv6 (without extension headers), and TCP (with options) or UDP.
///
/// `None` when the packet is anything else or truncated: the caller then counts no per-segment
/// header overhead rather than guessing one.
pub fn segment_header_len(p: &(impl PacketBytes + ?Sized), l2: u32) -> Option<usize> {
    let (ethertype, l3) = match l2 {
        L2_ETHERNET => {
            let outer = be16(p, 12)?;
            if outer == ETH_P_8021Q || outer == ETH_P_8021AD {
                (be16(p, ETH_HLEN + 2)?, ETH_HLEN + 4)
            } else {
                (outer, ETH_HLEN)
            }
        }
        L2_RAW_IP => match p.byte(0)? >> 4 {
            4 => (ETH_P_IP, 0),
            6 => (ETH_P_IPV6, 0),
            _ => return None,
        },
        _ => return None,
    };
    let (proto, l4) = match ethertype {
        ETH_P_IP => {
            let vihl = p.byte(l3)?;
            let ihl = usize::from(vihl & 0x0f) * 4;
            if vihl >> 4 != 4 || ihl < 20 {
                return None;
            }
            (p.byte(l3 + 9)?, l3 + ihl)
        }
        ETH_P_IPV6 => {
            if p.byte(l3)? >> 4 != 6 {
                return None;
            }
            (p.byte(l3 + 6)?, l3 + 40)
        }
        _ => return None,
    };
    match proto {
        IPPROTO_TCP => {
            let doff = usize::from(p.byte(l4 + 12)? >> 4) * 4;
            if doff < 20 {
                return None;
            }
            Some(l4 + doff)
        }
        IPPROTO_UDP => {
            p.byte(l4 + 7)?;
            Some(l4 + 8)
        }
        _ => None,
    }
}

/// Wire bytes of an skb of `len` bytes that carries `segs` segments (GSO/GRO), each repeating the
/// headers of length `header_len`.
pub fn wire_bytes(len: u32, segs: u32, header_len: Option<usize>) -> u64 {
    let extra_segs = u64::from(segs.max(1) - 1);
    u64::from(len) + extra_segs * header_len.unwrap_or(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eth(ethertype: u16) -> [u8; 14] {
        let mut h = [0u8; 14];
        h[12..14].copy_from_slice(&ethertype.to_be_bytes());
        h
    }

    fn ipv4(ihl_words: u8, proto: u8) -> [u8; 24] {
        let mut h = [0u8; 24];
        h[0] = 0x40 | ihl_words;
        h[9] = proto;
        h
    }

    fn tcp(doff_words: u8) -> [u8; 32] {
        let mut h = [0u8; 32];
        h[12] = doff_words << 4;
        h
    }

    fn cat(parts: &[&[u8]]) -> [u8; 128] {
        let mut out = [0u8; 128];
        let mut n = 0;
        for p in parts {
            out[n..n + p.len()].copy_from_slice(p);
            n += p.len();
        }
        out
    }

    #[test]
    fn ethernet_ipv4_tcp_with_timestamps() {
        let pkt = cat(&[&eth(ETH_P_IP), &ipv4(5, IPPROTO_TCP)[..20], &tcp(8)]);
        assert_eq!(segment_header_len(&pkt[..66], L2_ETHERNET), Some(66));
    }

    #[test]
    fn ipv4_options_and_vlan_tag() {
        let mut vlan = [0u8; 18];
        vlan[12..14].copy_from_slice(&ETH_P_8021Q.to_be_bytes());
        vlan[16..18].copy_from_slice(&ETH_P_IP.to_be_bytes());
        let pkt = cat(&[&vlan, &ipv4(6, IPPROTO_TCP), &tcp(5)]);
        assert_eq!(segment_header_len(&pkt[..62], L2_ETHERNET), Some(18 + 24 + 20));
    }

    #[test]
    fn raw_ip_ipv6_udp() {
        let mut ip6 = [0u8; 40];
        ip6[0] = 0x60;
        ip6[6] = IPPROTO_UDP;
        let pkt = cat(&[&ip6, &[0u8; 8]]);
        assert_eq!(segment_header_len(&pkt[..48], L2_RAW_IP), Some(48));
    }

    #[test]
    fn truncated_or_unknown_is_none() {
        let pkt = cat(&[&eth(ETH_P_IP), &ipv4(5, IPPROTO_TCP)[..20], &tcp(8)]);
        for len in 0..46 {
            assert_eq!(segment_header_len(&pkt[..len], L2_ETHERNET), None, "len {len}");
        }
        assert_eq!(segment_header_len(&eth(0x0806)[..], L2_ETHERNET), None);
        let bad_ihl = cat(&[&eth(ETH_P_IP), &ipv4(4, IPPROTO_TCP)[..20], &tcp(5)]);
        assert_eq!(segment_header_len(&bad_ihl[..60], L2_ETHERNET), None);
        let bad_doff = cat(&[&eth(ETH_P_IP), &ipv4(5, IPPROTO_TCP)[..20], &tcp(4)]);
        assert_eq!(segment_header_len(&bad_doff[..60], L2_ETHERNET), None);
        assert_eq!(segment_header_len(&pkt[..66], 7), None);
    }

    #[test]
    fn wire_bytes_adds_repeated_headers() {
        assert_eq!(wire_bytes(1514, 1, Some(66)), 1514);
        assert_eq!(wire_bytes(66 + 3 * 1448, 3, Some(66)), 3 * (66 + 1448));
        assert_eq!(wire_bytes(100, 0, None), 100);
        assert_eq!(wire_bytes(1000, 4, None), 1000);
    }
}
