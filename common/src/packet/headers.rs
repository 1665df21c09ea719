//! The IP header parser: link layer, IPv4 or IPv6 (with extension headers) and TCP/UDP ports,
//! into the [`Headers`] the TC programs count by; and the wire bytes of a GSO packet, which
//! depend on the header length it finds.

use super::{be16, PacketBytes, ETH_HLEN, ETH_P_8021AD, ETH_P_8021Q, ETH_P_IP, ETH_P_IPV6};
use crate::{L2_ETHERNET, L2_RAW_IP};

pub(crate) const IPPROTO_TCP: u8 = 6;
pub(crate) const IPPROTO_UDP: u8 = 17;

/// What the TC programs need from a packet's headers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Headers {
    /// 4 or 6.
    pub version: u8,
    /// The IPv4 TOS / IPv6 traffic class byte: DSCP in the high six bits, ECN in the low two.
    pub tos: u8,
    /// Transport protocol (6 TCP, 17 UDP, ...) once extension headers are skipped; see `l4`.
    pub proto: u8,
    /// TCP flags byte (CWR 0x80, ECE 0x40, ...), zero for other protocols.
    pub tcp_flags: u8,
    /// Offset of the IP header.
    pub l3: u16,
    /// Offset of the transport header; zero when it could not be reached (IPv6 extension headers
    /// beyond what we skip, ESP, a non-first fragment, or a truncated TCP/UDP header): the packet
    /// is "unparsed" above IP and nothing is read from it.
    pub l4: u16,
    /// Length of the headers each GSO segment repeats (through TCP/UDP); zero if unknown.
    pub header_len: u16,
    pub sport: u16,
    pub dport: u16,
    /// Addresses, IPv4 as IPv4-mapped IPv6 (`::ffff:a.b.c.d`) so one LPM trie serves both.
    pub src: [u8; 16],
    pub dst: [u8; 16],
    /// An extension, TCP or UDP header ends before it should: past the end of the packet, or
    /// past the bytes the programs read of it. The packet is unparsed above IP.
    pub truncated: bool,
}

const IPPROTO_HOPOPTS: u8 = 0;
const IPPROTO_ROUTING: u8 = 43;
const IPPROTO_FRAGMENT: u8 = 44;
const IPPROTO_AH: u8 = 51;
const IPPROTO_DSTOPTS: u8 = 60;
/// IPv6 extension headers skipped at most; a longer chain is unparsed above IP.
pub const MAX_IPV6_EXT: usize = 4;

#[inline(always)]
fn addr4_mapped(p: &(impl PacketBytes + ?Sized), off: usize) -> Option<[u8; 16]> {
    let mut a = [0u8; 16];
    a[10] = 0xff;
    a[11] = 0xff;
    a[12] = p.byte(off)?;
    a[13] = p.byte(off + 1)?;
    a[14] = p.byte(off + 2)?;
    a[15] = p.byte(off + 3)?;
    Some(a)
}

/// Parses L2 (`l2` is [`L2_ETHERNET`], which may carry one 802.1Q/802.1ad tag, or
/// [`L2_RAW_IP`]), IPv4 (with options) or IPv6 (skipping up to [`MAX_IPV6_EXT`] extension
/// headers), and the TCP/UDP ports and TCP flags. `None` when the packet is not IP or its IP
/// header is truncated or malformed.
#[inline(always)]
pub fn parse(p: &(impl PacketBytes + ?Sized), l2: u32) -> Option<Headers> {
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
    let mut h = Headers { l3: l3 as u16, ..Headers::default() };
    let (mut proto, mut l4) = match ethertype {
        ETH_P_IP => {
            let vihl = p.byte(l3)?;
            let ihl = usize::from(vihl & 0x0f) * 4;
            if vihl >> 4 != 4 || ihl < 20 {
                return None;
            }
            p.byte(l3 + ihl - 1)?;
            h.version = 4;
            h.tos = p.byte(l3 + 1)?;
            h.src = addr4_mapped(p, l3 + 12)?;
            h.dst = addr4_mapped(p, l3 + 16)?;
            // A non-first fragment carries no transport header.
            let frag = be16(p, l3 + 6)? & 0x1fff;
            (p.byte(l3 + 9)?, if frag == 0 { l3 + ihl } else { 0 })
        }
        ETH_P_IPV6 => {
            let b0 = p.byte(l3)?;
            if b0 >> 4 != 6 {
                return None;
            }
            h.version = 6;
            h.tos = (b0 << 4) | (p.byte(l3 + 1)? >> 4);
            h.src = p.bytes16(l3 + 8)?;
            h.dst = p.bytes16(l3 + 24)?;
            (p.byte(l3 + 6)?, l3 + 40)
        }
        _ => return None,
    };
    if h.version == 6 {
        let mut n = 0;
        while n < MAX_IPV6_EXT && l4 != 0 {
            let is_ext = matches!(
                proto,
                IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS | IPPROTO_AH | IPPROTO_FRAGMENT
            );
            if !is_ext {
                break;
            }
            let (Some(next), Some(hlen)) = (p.byte(l4), p.byte(l4 + 1)) else {
                l4 = 0;
                h.truncated = true;
                break;
            };
            let len = match proto {
                IPPROTO_AH => (usize::from(hlen) + 2) * 4,
                IPPROTO_FRAGMENT => {
                    if be16(p, l4 + 2).is_none_or(|f| f & 0xfff8 != 0) {
                        // Not the first fragment (or truncated): no transport header here.
                        proto = next;
                        l4 = 0;
                        break;
                    }
                    8
                }
                _ => (usize::from(hlen) + 1) * 8,
            };
            proto = next;
            l4 += len;
            n += 1;
        }
        if n == MAX_IPV6_EXT
            && matches!(
                proto,
                IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS | IPPROTO_AH | IPPROTO_FRAGMENT
            )
        {
            l4 = 0;
        }
    }
    h.proto = proto;
    if l4 == 0 {
        return Some(h);
    }
    match proto {
        IPPROTO_TCP => {
            let doff = usize::from(p.byte(l4 + 12).unwrap_or(0) >> 4) * 4;
            let flags = p.byte(l4 + 13);
            if doff < 20 || flags.is_none() || p.byte(l4 + doff - 1).is_none() {
                h.truncated = true; // or malformed: unparsed above IP
                return Some(h);
            }
            h.tcp_flags = flags.unwrap_or(0);
            h.header_len = (l4 + doff) as u16;
        }
        IPPROTO_UDP => {
            if p.byte(l4 + 7).is_none() {
                h.truncated = true;
                return Some(h);
            }
            h.header_len = (l4 + 8) as u16;
        }
        _ => {
            // ICMP and the like: reached if its first byte is in the packet (extension
            // headers may claim more than there is), with no ports to read.
            if p.byte(l4).is_some() {
                h.l4 = l4 as u16;
            }
            return Some(h);
        }
    }
    h.sport = be16(p, l4).unwrap_or(0);
    h.dport = be16(p, l4 + 2).unwrap_or(0);
    h.l4 = l4 as u16;
    Some(h)
}

/// Length of the headers that every segment of a GSO packet repeats, through TCP or UDP.
pub fn segment_header_len(p: &(impl PacketBytes + ?Sized), l2: u32) -> Option<usize> {
    parse(p, l2).and_then(|h| (h.header_len != 0).then_some(usize::from(h.header_len)))
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

    /// Found by the `packet` fuzz target: an extension header longer than the packet, then a
    /// protocol without ports, gave a transport offset past the end instead of "unparsed".
    #[test]
    fn a_transport_header_past_the_end_is_unparsed() {
        let pkt = [
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x86, 0xdd, 0x6b, 0x80, 0, 0, 0, 0, 0, 0, 0x20,
            0x01, 0x0d, 0xb8, 0x0a, 0, 0, 0, 0xfa, 0, 0, 0, 0, 0, 0, 0, 0x12, 0xb7, 0, 0, 0, 0,
            0x0a, 0, 0, 0, 0, 0, 0, 0x12, 0, 0, 0x03, 0x45,
        ];
        let h = parse(&pkt[..], L2_ETHERNET).unwrap();
        assert_eq!((h.version, h.proto, h.l4, h.header_len), (6, 3, 0, 0));
        // The same chain with the packet long enough reaches the protocol's header.
        let mut long = [0u8; 700];
        long[..pkt.len()].copy_from_slice(&pkt);
        assert_eq!(parse(&long[..], L2_ETHERNET).unwrap().l4, 614);
    }

    fn ipv6_with(next: u8, ext: &[u8], l4: &[u8]) -> [u8; 128] {
        let mut ip6 = [0u8; 40];
        ip6[0] = 0x6b; // traffic class 0xb?
        ip6[1] = 0x80; // ... ECN bits (tc low 2 bits) = 0b10? tc = 0xb8 -> DSCP 46, ECT(0)
        ip6[6] = next;
        ip6[8] = 0x20;
        ip6[39] = 2;
        cat(&[&eth(ETH_P_IPV6), &ip6, ext, l4])
    }

    #[test]
    fn parses_ipv4_tcp_fields() {
        let mut ip = ipv4(5, IPPROTO_TCP);
        ip[1] = 0xb8 | 0b11; // DSCP 46, CE
        ip[12..16].copy_from_slice(&[198, 18, 1, 10]);
        ip[16..20].copy_from_slice(&[198, 18, 2, 10]);
        let mut t = tcp(8);
        t[0..4].copy_from_slice(&[0x13, 0x88, 0x00, 0x50]);
        t[13] = 0xc2; // CWR, ECE, SYN
        let pkt = cat(&[&eth(ETH_P_IP), &ip[..20], &t]);
        let h = parse(&pkt[..66], L2_ETHERNET).unwrap();
        assert_eq!((h.version, h.tos, h.proto, h.tcp_flags), (4, 0xbb, IPPROTO_TCP, 0xc2));
        assert_eq!((h.sport, h.dport, h.l3, h.l4, h.header_len), (5000, 80, 14, 34, 66));
        assert_eq!(&h.src[10..], &[0xff, 0xff, 198, 18, 1, 10]);
        assert_eq!(&h.dst[12..], &[198, 18, 2, 10]);
    }

    #[test]
    fn ipv6_extension_headers_are_skipped_or_unparsed() {
        let mut udp = [0u8; 8];
        udp[2..4].copy_from_slice(&4791u16.to_be_bytes());
        // Hop-by-hop (8 bytes) then UDP.
        let mut hbh = [0u8; 8];
        hbh[0] = IPPROTO_UDP;
        let pkt = ipv6_with(IPPROTO_HOPOPTS, &hbh, &udp);
        let h = parse(&pkt[..14 + 40 + 8 + 8], L2_ETHERNET).unwrap();
        assert_eq!((h.version, h.tos, h.proto, h.l4, h.dport), (6, 0xb8, IPPROTO_UDP, 62, 4791));
        // Five destination-options headers: more than we skip, so unparsed above IP.
        let mut chain = [0u8; 40];
        for i in 0..5 {
            chain[i * 8] = if i == 4 { IPPROTO_UDP } else { IPPROTO_DSTOPTS };
        }
        let pkt = ipv6_with(IPPROTO_DSTOPTS, &chain, &udp);
        let h = parse(&pkt[..], L2_ETHERNET).unwrap();
        assert_eq!((h.l4, h.dport, h.header_len), (0, 0, 0));
        // A non-first fragment: no transport header to read.
        let mut frag = [0u8; 8];
        frag[0] = IPPROTO_UDP;
        frag[2..4].copy_from_slice(&(185u16 << 3).to_be_bytes());
        let h = parse(&ipv6_with(IPPROTO_FRAGMENT, &frag, &udp)[..], L2_ETHERNET).unwrap();
        assert_eq!((h.proto, h.l4), (IPPROTO_UDP, 0));
        // ICMPv6 is reached (no ports).
        let h = parse(&ipv6_with(58, &[], &udp)[..], L2_ETHERNET).unwrap();
        assert_eq!((h.proto, h.l4, h.dport), (58, 54, 0));
    }

    #[test]
    fn ipv4_non_first_fragment_has_no_ports() {
        let mut ip = ipv4(5, IPPROTO_UDP);
        ip[6..8].copy_from_slice(&0x0010u16.to_be_bytes());
        let pkt = cat(&[&eth(ETH_P_IP), &ip[..20], &[0x11u8; 8]]);
        let h = parse(&pkt[..42], L2_ETHERNET).unwrap();
        assert_eq!((h.proto, h.l4, h.sport), (IPPROTO_UDP, 0, 0));
    }

    #[test]
    fn wire_bytes_adds_repeated_headers() {
        assert_eq!(wire_bytes(1514, 1, Some(66)), 1514);
        assert_eq!(wire_bytes(66 + 3 * 1448, 3, Some(66)), 3 * (66 + 1448));
        assert_eq!(wire_bytes(100, 0, None), 100);
        assert_eq!(wire_bytes(1000, 4, None), 1000);
    }
}
