//! RoCEv2: the Base Transport Header fields (and AETH syndrome) that congestion sensing reads
//! after a UDP 4791 header, and the 24-bit PSN order that spots resent packets.

use super::PacketBytes;

/// UDP destination port of RoCEv2.
pub const ROCEV2_PORT: u16 = 4791;
/// BTH opcode of a Congestion Notification Packet.
pub const CNP_OPCODE: u8 = 0x81;

/// The fields of a RoCEv2 Base Transport Header that congestion sensing needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bth {
    pub opcode: u8,
    pub dest_qp: u32,
    pub psn: u32,
    /// The AETH syndrome byte, for the opcodes that carry an AETH (ACK, atomic ACK, RDMA READ
    /// response first/last/only of RC and XRC); 0xff otherwise.
    pub syndrome: u8,
}

impl Bth {
    /// Transport class: opcode >> 5 (0 RC, 1 UC, 2 RD, 3 UD, 4 CNP, 5 XRC).
    pub fn class(&self) -> usize {
        usize::from(self.opcode >> 5)
    }

    /// A pure acknowledgement (ACK or atomic ACK), whose PSN repeats by design.
    pub fn is_ack(&self) -> bool {
        matches!(self.opcode & 0x1f, 0x11 | 0x12) && matches!(self.class(), 0 | 5)
    }
}

/// Parses the BTH (and AETH syndrome) at `at`, the first byte after the UDP header. `None` if
/// truncated.
#[inline(always)]
pub fn parse_bth(p: &(impl PacketBytes + ?Sized), at: usize) -> Option<Bth> {
    let opcode = p.byte(at)?;
    let dest_qp = u32::from_be_bytes([0, p.byte(at + 5)?, p.byte(at + 6)?, p.byte(at + 7)?]);
    let psn = u32::from_be_bytes([0, p.byte(at + 9)?, p.byte(at + 10)?, p.byte(at + 11)?]);
    let has_aeth =
        matches!(opcode >> 5, 0 | 5) && matches!(opcode & 0x1f, 0x0d | 0x0f | 0x10 | 0x11 | 0x12);
    let syndrome = if has_aeth { p.byte(at + 12)? } else { 0xff };
    Some(Bth { opcode, dest_qp, psn, syndrome })
}

/// Whether 24-bit PSN `psn` is not after `last` (equal, or up to half the space behind): a
/// resent packet.
#[inline(always)]
pub fn psn_repeated(last: u32, psn: u32) -> bool {
    let ahead = psn.wrapping_sub(last) & 0x00ff_ffff;
    ahead == 0 || ahead >= 0x0080_0000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bth_fields_and_aeth() {
        // RC ACK, dest QP 0x000123, PSN 7, AETH syndrome 0x60 (NAK, PSN sequence error).
        let bth = [0x11, 0, 0xff, 0xff, 0, 0, 0x01, 0x23, 0, 0, 0, 7, 0x60, 0, 0, 1];
        let b = parse_bth(&bth[..], 0).unwrap();
        assert_eq!((b.opcode, b.dest_qp, b.psn, b.syndrome, b.class()), (0x11, 0x123, 7, 0x60, 0));
        assert!(b.is_ack());
        // RC SEND ONLY carries no AETH.
        let mut send = bth;
        send[0] = 0x04;
        assert_eq!(parse_bth(&send[..12], 0).unwrap().syndrome, 0xff);
        // An ACK cut before its AETH is truncated.
        assert_eq!(parse_bth(&bth[..12], 0), None);
        assert_eq!(parse_bth(&bth[..11], 0), None);
    }

    #[test]
    fn psn_order_wraps_at_24_bits() {
        assert!(psn_repeated(5, 5));
        assert!(psn_repeated(5, 4));
        assert!(!psn_repeated(5, 6));
        assert!(!psn_repeated(0x00ff_ffff, 0));
        assert!(psn_repeated(0, 0x00ff_ffff));
    }
}
