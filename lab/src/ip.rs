//! Reading and setting the ECN field of raw IP packets as TUN delivers them.

use crate::model::EcnCodepoint;

/// The ECN codepoint of an IPv4 or IPv6 packet; `None` if it is neither or too short.
pub fn ecn(pkt: &[u8]) -> Option<EcnCodepoint> {
    match pkt.first()? >> 4 {
        4 if pkt.len() >= 20 => Some(EcnCodepoint::from_bits(pkt[1])),
        6 if pkt.len() >= 40 => Some(EcnCodepoint::from_bits(pkt[1] >> 4)),
        _ => None,
    }
}

/// Sets CE, keeping the DSCP; fixes the IPv4 header checksum (RFC 1624 incremental update).
/// Returns false, changing nothing, for a packet that is not IPv4/IPv6 or is truncated.
pub fn set_ce(pkt: &mut [u8]) -> bool {
    match pkt.first().map(|b| b >> 4) {
        Some(4) if pkt.len() >= 20 => {
            let old = u16::from_be_bytes([pkt[0], pkt[1]]);
            pkt[1] |= 0b11;
            let new = u16::from_be_bytes([pkt[0], pkt[1]]);
            let sum = u16::from_be_bytes([pkt[10], pkt[11]]);
            // HC' = ~(~HC + ~m + m')
            let mut acc = u32::from(!sum) + u32::from(!old) + u32::from(new);
            while acc > 0xffff {
                acc = (acc & 0xffff) + (acc >> 16);
            }
            pkt[10..12].copy_from_slice(&(!(acc as u16)).to_be_bytes());
            true
        }
        Some(6) if pkt.len() >= 40 => {
            pkt[1] |= 0b0011_0000;
            true
        }
        _ => false,
    }
}

/// The IPv4 header checksum computed from scratch (for tests and checks).
pub fn ipv4_header_checksum(header: &[u8]) -> u16 {
    let mut acc: u32 = 0;
    for (i, pair) in header.chunks(2).enumerate() {
        if i == 5 {
            continue;
        }
        acc += u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]));
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ipv4(tos: u8, id: u16) -> Vec<u8> {
        let mut h = vec![
            0x45,
            tos,
            0,
            60,
            (id >> 8) as u8,
            id as u8,
            0x40,
            0,
            64,
            6,
            0,
            0,
            198,
            18,
            0,
            1,
            198,
            18,
            1,
            1,
        ];
        let c = ipv4_header_checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        h.resize(60, 0);
        h
    }

    #[test]
    fn ipv4_ce_keeps_dscp_and_checksum_valid() {
        let mut p = ipv4(0xb8 | 0b10, 7); // DSCP 46 (EF), ECT(0)
        assert_eq!(ecn(&p), Some(EcnCodepoint::Ect0));
        assert!(set_ce(&mut p));
        assert_eq!(p[1], 0xb8 | 0b11);
        assert_eq!(ecn(&p), Some(EcnCodepoint::Ce));
        assert_eq!(u16::from_be_bytes([p[10], p[11]]), ipv4_header_checksum(&p[..20]));
    }

    #[test]
    fn ipv6_ce_keeps_traffic_class() {
        let mut p = vec![0u8; 40];
        p[0] = 0x6a; // version 6, traffic class high nibble 0xa
        p[1] = 0x20 | 0x0f; // traffic class low nibble: ECN bits 0b10 (ECT(0)) and DSCP bits
        assert_eq!(ecn(&p), Some(EcnCodepoint::Ect0));
        assert!(set_ce(&mut p));
        assert_eq!((p[0], p[1]), (0x6a, 0x3f));
    }

    #[test]
    fn short_or_foreign_packets_untouched() {
        for mut p in [vec![], vec![0x45; 10], vec![0x60; 39], vec![0x20; 60]] {
            let before = p.clone();
            assert!(!set_ce(&mut p));
            assert_eq!(p, before);
            assert_eq!(ecn(&p), None);
        }
    }

    proptest! {
        #[test]
        fn incremental_checksum_matches_full(tos in any::<u8>(), id in any::<u16>()) {
            let mut p = ipv4(tos, id);
            set_ce(&mut p);
            prop_assert_eq!(u16::from_be_bytes([p[10], p[11]]), ipv4_header_checksum(&p[..20]));
            prop_assert_eq!(p[1] >> 2, tos >> 2);
        }
    }
}
