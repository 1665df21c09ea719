//! The address forms map keys share: kernel address family numbers, and IPv4 as IPv4-mapped
//! IPv6 so that one key type (and one LPM trie) serves both families.

/// Address family numbers as the kernel uses them in tracepoints.
pub const AF_INET: u16 = 2;
/// IPv6 address family.
pub const AF_INET6: u16 = 10;

/// An IPv4 address as IPv4-mapped IPv6, the form peers and flows are keyed by.
#[inline(always)]
pub fn v4_mapped(a: [u8; 4]) -> [u8; 16] {
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a[0], a[1], a[2], a[3]]
}
