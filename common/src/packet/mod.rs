//! Header parsing shared by the TC programs (reading through `bpf_skb_load_bytes`) and the unit
//! tests (reading from a slice). No loops, bounded work: it must pass the verifier unchanged.
//!
//! This file holds the byte access and the link-layer constants every parser here shares; the IP
//! and transport parser, the loss kinds of what it cannot parse, and the RoCEv2 transport header
//! each have their own file.

mod headers;
mod loss;
mod roce;

pub use headers::{parse, segment_header_len, wire_bytes, Headers, MAX_IPV6_EXT};
pub(crate) use headers::{IPPROTO_TCP, IPPROTO_UDP};
pub use loss::{unparsed_loss, Loss, LOSS_KINDS};
pub use roce::{parse_bth, psn_repeated, Bth, CNP_OPCODE, ROCEV2_PORT};

/// Random access to packet bytes starting at the first byte the TC program sees.
pub trait PacketBytes {
    /// The byte at `offset`, or `None` past the end of the packet.
    fn byte(&self, offset: usize) -> Option<u8>;

    /// The 16 bytes at `offset` (an IPv6 address). Implementations over a contiguous buffer
    /// override this with one bounds check and one copy.
    #[inline(always)]
    fn bytes16(&self, offset: usize) -> Option<[u8; 16]> {
        let mut a = [0u8; 16];
        let mut i = 0;
        while i < 16 {
            a[i] = self.byte(offset + i)?;
            i += 1;
        }
        Some(a)
    }
}

impl PacketBytes for [u8] {
    fn byte(&self, offset: usize) -> Option<u8> {
        self.get(offset).copied()
    }
}

const ETH_HLEN: usize = 14;
pub(crate) const ETH_P_IP: u16 = 0x0800;
pub(crate) const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;

#[inline(always)]
fn be16(p: &(impl PacketBytes + ?Sized), off: usize) -> Option<u16> {
    Some(u16::from_be_bytes([p.byte(off)?, p.byte(off + 1)?]))
}
