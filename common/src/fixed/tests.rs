extern crate std;

use std::{vec, vec::Vec};

use super::*;
use crate::packet::{parse, unparsed_loss, Loss};

fn eth(ethertype: u16) -> Vec<u8> {
    let mut v = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
    v.extend_from_slice(&ethertype.to_be_bytes());
    v
}

fn ipv4(proto: u8) -> Vec<u8> {
    let mut h = vec![0x45, 0xb9, 0, 60, 0, 1, 0x40, 0, 64, proto, 0, 0];
    h.extend_from_slice(&[198, 18, 1, 10, 198, 18, 2, 10]);
    h
}

fn ipv6(next: u8) -> Vec<u8> {
    let mut h = vec![0x6b, 0x80, 0, 0, 0, 20, next, 64];
    h.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10]);
    h.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x20]);
    h
}

const TCP: [u8; 24] =
    [0x13, 0x88, 0, 80, 0, 0, 0, 1, 0, 0, 0, 0, 0x60, 0xc2, 0xff, 0xff, 0, 0, 0, 0, 2, 4, 5, 0xb4];
const UDP: [u8; 8] = [0xc3, 0x50, 0x12, 0xb7, 0, 28, 0, 0];

fn templates() -> Vec<(u32, Vec<u8>)> {
    let mut v = Vec::new();
    for (l3, proto) in [(ipv4(6), &TCP[..]), (ipv4(17), &UDP[..])] {
        v.push((L2_ETHERNET, [eth(ETH_P_IP), l3.clone(), proto.to_vec(), vec![0; 12]].concat()));
        v.push((L2_RAW_IP, [l3, proto.to_vec(), vec![0; 12]].concat()));
    }
    for (l3, proto) in [(ipv6(6), &TCP[..]), (ipv6(17), &UDP[..])] {
        v.push((L2_ETHERNET, [eth(ETH_P_IPV6), l3.clone(), proto.to_vec(), vec![0; 12]].concat()));
        v.push((L2_RAW_IP, [l3, proto.to_vec(), vec![0; 12]].concat()));
    }
    v
}

/// Where the fast path answers, the slow path agrees; checked for every template with every
/// header byte set to values that change the layout, and at every length.
#[test]
fn the_fast_path_agrees_with_the_slow_path_wherever_it_answers() {
    let values =
        [0u8, 1, 4, 5, 6, 0x11, 0x20, 0x40, 0x45, 0x46, 0x50, 0x60, 0x81, 0x86, 0xdd, 0xff];
    let (mut answered, mut checked) = (0, 0);
    for (l2, t) in templates() {
        for len in 0..=t.len() {
            for at in 0..len.min(80) {
                for &v in &values {
                    let mut p = t[..len].to_vec();
                    p[at] = v;
                    let mut h = Headers::default();
                    checked += 1;
                    if parse_fixed(&p[..], l2, &mut h) {
                        answered += 1;
                        assert_eq!(Some(h), parse(&p[..], l2), "{p:02x?} on link {l2}");
                    }
                }
            }
        }
    }
    assert!(answered > checked / 10, "the fast path answered {answered} of {checked}");
}

#[test]
fn the_common_layouts_take_the_fast_path() {
    for (l2, t) in templates() {
        let mut h = Headers::default();
        assert!(parse_fixed(&t[..], l2, &mut h), "{t:02x?}");
        assert!(h.l4 != 0 && h.header_len != 0 && !h.truncated);
    }
    // A pure ACK: 54 bytes, nothing after the TCP header.
    let ack = [eth(ETH_P_IP), ipv4(6), TCP[..20].to_vec()].concat();
    let mut ack = ack;
    ack[14 + 20 + 12] = 0x50;
    let mut h = Headers::default();
    assert!(parse_fixed(&ack[..], L2_ETHERNET, &mut h));
    assert_eq!((h.header_len, h.sport, h.dport, h.tcp_flags), (54, 5000, 80, 0xc2));
}

#[test]
fn other_layouts_are_left_to_the_slow_path() {
    let tcp4 = [eth(ETH_P_IP), ipv4(6), TCP.to_vec()].concat();
    let mut vlan = eth(0x8100);
    vlan.extend_from_slice(&[0, 5, 0x08, 0x00]);
    let tagged = [vlan, ipv4(6), TCP.to_vec()].concat();
    let mut options = tcp4.clone();
    options[14] = 0x46;
    let mut later_fragment = tcp4.clone();
    later_fragment[14 + 7] = 1;
    let ext = [eth(ETH_P_IPV6), ipv6(0), vec![6, 0, 0, 0, 0, 0, 0, 0], TCP.to_vec()].concat();
    let icmp = [eth(ETH_P_IP), ipv4(1), vec![8, 0, 0, 0, 0, 0, 0, 0]].concat();
    let mut long_doff = tcp4.clone();
    long_doff[14 + 20 + 12] = 0xf0; // 60 bytes of TCP header in a 58-byte segment
    for (name, p) in [
        ("vlan", tagged),
        ("ip options", options),
        ("later fragment", later_fragment),
        ("extension header", ext),
        ("icmp", icmp),
        ("tcp header past the end", long_doff),
        ("arp", eth(0x0806)),
    ] {
        let mut h = Headers::default();
        assert!(!parse_fixed(&p[..], L2_ETHERNET, &mut h), "{name}");
    }
}

#[test]
fn losses_are_named_by_kind() {
    let tcp4 = [eth(ETH_P_IP), ipv4(6), TCP.to_vec()].concat();
    assert_eq!(unparsed_loss(&tcp4[..30], L2_ETHERNET), Some(Loss::TruncatedHeader));
    assert_eq!(unparsed_loss(&tcp4[..10], L2_ETHERNET), Some(Loss::TruncatedHeader));
    assert_eq!(unparsed_loss(&eth(0x0806)[..], L2_ETHERNET), None);
    let mut qinq = eth(0x88a8);
    qinq.extend_from_slice(&[0, 5, 0x81, 0x00, 0, 6, 0x08, 0x00]);
    assert_eq!(unparsed_loss(&qinq[..], L2_ETHERNET), Some(Loss::UnknownLinkType));
    assert_eq!(unparsed_loss(&tcp4[..], 7), Some(Loss::UnknownLinkType));
    assert_eq!(unparsed_loss(&[0x00u8; 20][..], L2_RAW_IP), Some(Loss::TruncatedHeader));
    // A cut TCP header is parsed as far as IP and flagged.
    let h = parse(&tcp4[..14 + 20 + 10], L2_ETHERNET).unwrap();
    assert!(h.truncated && h.l4 == 0 && h.version == 4);
    assert!(!parse(&tcp4[..], L2_ETHERNET).unwrap().truncated);
}
