//! The TC programs' fast path: the common header layouts (untagged Ethernet or raw IP, IPv4
//! without options or IPv6 without extension headers, then TCP or UDP) read at fixed offsets in
//! place, each read checked once against the end of the linear data. Anything else (VLAN tags,
//! IP options, extension headers, fragments, headers outside the linear data) answers `false`
//! and goes to [`crate::packet::parse`], the slow path. Where this path answers, its headers
//! equal the slow path's: the unit tests and the `packet` fuzz target check that.

use crate::{
    packet::{Headers, ETH_P_IP, ETH_P_IPV6, IPPROTO_TCP, IPPROTO_UDP},
    v4_mapped, L2_ETHERNET, L2_RAW_IP,
};

/// Fixed-size reads from the packet's linear data.
pub trait Linear {
    /// The `N` bytes at `off`, or `None` if they do not all lie in the linear data.
    fn read<const N: usize>(&self, off: usize) -> Option<[u8; N]>;
    /// Length of the whole packet (`skb->len`), linear or not.
    fn packet_len(&self) -> usize;
}

impl Linear for [u8] {
    fn read<const N: usize>(&self, off: usize) -> Option<[u8; N]> {
        self.get(off..off.checked_add(N)?)?.try_into().ok()
    }

    fn packet_len(&self) -> usize {
        self.len()
    }
}

/// Parses the common layouts into `h` (which the caller passes zeroed). `false`: not one of
/// them, `h` partly written, use the slow path. A `bool` and an out-parameter rather than an
/// `Option`: see `ebpf/src/traffic.rs` on what LLVM does with an `Option` here.
#[inline(always)]
pub fn parse_fixed(p: &(impl Linear + ?Sized), l2: u32, h: &mut Headers) -> bool {
    match l2 {
        L2_ETHERNET => {
            let Some(eth) = p.read::<14>(0) else { return false };
            match u16::from_be_bytes([eth[12], eth[13]]) {
                ETH_P_IP => ipv4(p, 14, h),
                ETH_P_IPV6 => ipv6(p, 14, h),
                _ => false,
            }
        }
        L2_RAW_IP => {
            // 20 bytes (no IP header is shorter) rather than the one needed: a check of
            // `data + 1 > data_end` becomes `data >= data_end`, from which the verifier learns
            // no range.
            let Some(ip) = p.read::<20>(0) else { return false };
            match ip[0] >> 4 {
                4 => ipv4(p, 0, h),
                6 => ipv6(p, 0, h),
                _ => false,
            }
        }
        _ => false,
    }
}

#[inline(always)]
fn ipv4(p: &(impl Linear + ?Sized), l3: usize, h: &mut Headers) -> bool {
    let Some(ip) = p.read::<20>(l3) else { return false };
    // No options (IHL 5) and not a fragment other than the first.
    if ip[0] != 0x45 || u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff != 0 {
        return false;
    }
    h.version = 4;
    h.tos = ip[1];
    h.l3 = l3 as u16;
    h.src = v4_mapped([ip[12], ip[13], ip[14], ip[15]]);
    h.dst = v4_mapped([ip[16], ip[17], ip[18], ip[19]]);
    transport(p, l3 + 20, ip[9], h)
}

#[inline(always)]
fn ipv6(p: &(impl Linear + ?Sized), l3: usize, h: &mut Headers) -> bool {
    // One read at a time, each returning at once: with both evaluated before either is
    // tested, LLVM passes the failed one's undefined bytes along, which the verifier rejects.
    let Some(ip) = p.read::<8>(l3) else { return false };
    let Some(src) = p.read::<16>(l3 + 8) else { return false };
    let Some(dst) = p.read::<16>(l3 + 24) else { return false };
    if ip[0] >> 4 != 6 {
        return false;
    }
    h.version = 6;
    h.tos = (ip[0] << 4) | (ip[1] >> 4);
    h.l3 = l3 as u16;
    h.src = src;
    h.dst = dst;
    transport(p, l3 + 40, ip[6], h)
}

#[inline(always)]
fn transport(p: &(impl Linear + ?Sized), l4: usize, proto: u8, h: &mut Headers) -> bool {
    let ports = match proto {
        IPPROTO_TCP => {
            let Some(t) = p.read::<14>(l4) else { return false };
            let doff = usize::from(t[12] >> 4) * 4;
            // The slow path calls a header shorter than 20 bytes or longer than the packet
            // unparsed: leave those to it.
            if doff < 20 || l4 + doff > p.packet_len() {
                return false;
            }
            h.tcp_flags = t[13];
            h.header_len = (l4 + doff) as u16;
            [t[0], t[1], t[2], t[3]]
        }
        IPPROTO_UDP => {
            let Some(u) = p.read::<8>(l4) else { return false };
            h.header_len = (l4 + 8) as u16;
            [u[0], u[1], u[2], u[3]]
        }
        _ => return false,
    };
    h.proto = proto;
    h.l4 = l4 as u16;
    h.sport = u16::from_be_bytes([ports[0], ports[1]]);
    h.dport = u16::from_be_bytes([ports[2], ports[3]]);
    true
}

#[cfg(test)]
mod tests;
