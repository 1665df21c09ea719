//! Watched network interfaces: name -> ifindex, link-layer framing, local addresses.

use std::{collections::HashMap, net::IpAddr};

use linkpilot_common::{LocalAddr, AF_INET, AF_INET6, L2_ETHERNET, L2_RAW_IP};
use nix::{ifaddrs::getifaddrs, net::if_::if_nametoindex};

/// Why an interface cannot be watched.
#[derive(Debug, thiserror::Error)]
pub enum IfaceError {
    #[error("interface {name:?} does not exist in this network namespace (see `ip link`)")]
    NotFound { name: String },
    #[error("interface name {name:?} is invalid: {why}")]
    InvalidName { name: String, why: &'static str },
    #[error(
        "interface {name:?} has link type {arphrd}, which linkpilot does not parse \
         (supported: Ethernet, and raw IP such as tun)"
    )]
    UnsupportedLinkType { name: String, arphrd: u32 },
    #[error("listing interfaces: {0}")]
    List(#[source] std::io::Error),
    #[error(
        "the policy watches \"{DEFAULT_ROUTE}\", but this network namespace has no default route \
         (see `ip route`); name the interface in the policy instead"
    )]
    NoDefaultRoute,
}

/// An interface name a policy may use for "whichever device the default route leaves by", so
/// that one policy fits hosts whose WAN interface is named differently.
pub const DEFAULT_ROUTE: &str = "@default-route";

/// The device of the IPv4 default route, else of the IPv6 one, in this network namespace.
pub fn default_route_device() -> Result<String, IfaceError> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    default_v4(&read(crate::paths::PROC_NET_ROUTE))
        .or_else(|| default_v6(&read(crate::paths::PROC_NET_IPV6_ROUTE)))
        .ok_or(IfaceError::NoDefaultRoute)
}

/// `/proc/net/route`: Iface Destination Gateway Flags RefCnt Use Metric Mask...; the default
/// route has destination and mask 0 (the lowest metric wins, as in the kernel).
fn default_v4(table: &str) -> Option<String> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let up = u32::from_str_radix(f.get(3)?, 16).ok()? & 1 == 1;
            (up && f.get(1)? == &"00000000" && f.get(7)? == &"00000000")
                .then(|| Some((f.get(6)?.parse::<u32>().ok()?, f[0].to_owned())))?
        })
        .min()
        .map(|(_, dev)| dev)
}

/// `/proc/net/ipv6_route`: dest plen src plen nexthop metric refcnt use flags device; the
/// default route is ::/0 and is not the unreachable one on `lo`.
fn default_v6(table: &str) -> Option<String> {
    table
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let dev = *f.get(9)?;
            (f.first()?.bytes().all(|b| b == b'0') && f.get(1)? == &"00" && dev != "lo")
                .then(|| Some((u32::from_str_radix(f.get(5)?, 16).ok()?, dev.to_owned())))?
        })
        .min()
        .map(|(_, dev)| dev)
}

/// An interface to watch, resolved once at startup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Iface {
    pub name: String,
    pub ifindex: u32,
    /// `L2_ETHERNET` or `L2_RAW_IP`.
    pub l2: u32,
}

const ARPHRD_ETHER: u32 = 1;
const ARPHRD_NONE: u32 = 65534;
const ARPHRD_RAWIP: u32 = 519;
const ARPHRD_LOOPBACK: u32 = 772;

impl Iface {
    /// Resolves `name` in the current network namespace.
    pub fn resolve(name: &str) -> Result<Self, IfaceError> {
        validate_name(name)?;
        let ifindex =
            if_nametoindex(name).map_err(|_| IfaceError::NotFound { name: name.to_owned() })?;
        // From the AF_PACKET entry of getifaddrs rather than /sys/class/net, which shows the
        // namespace sysfs was mounted in, not necessarily ours.
        let arphrd = getifaddrs()
            .map_err(|e| IfaceError::List(e.into()))?
            .filter(|ifa| ifa.interface_name == name)
            .find_map(|ifa| ifa.address?.as_link_addr().map(|l| u32::from(l.hatype())))
            .ok_or_else(|| IfaceError::NotFound { name: name.to_owned() })?;
        let l2 = l2_of(arphrd)
            .ok_or_else(|| IfaceError::UnsupportedLinkType { name: name.to_owned(), arphrd })?;
        Ok(Self { name: name.to_owned(), ifindex, l2 })
    }
}

/// The kernel's IFNAMSIZ rules, checked before any syscall so the error can say what is wrong.
fn validate_name(name: &str) -> Result<(), IfaceError> {
    let why = if name.is_empty() {
        "it is empty"
    } else if name.len() > 15 {
        "it is longer than 15 bytes"
    } else if name.contains(['/', ' ', '\0']) || name == "." || name == ".." {
        "it contains '/', a space or NUL, or is '.' or '..'"
    } else {
        return Ok(());
    };
    Err(IfaceError::InvalidName { name: name.to_owned(), why })
}

fn l2_of(arphrd: u32) -> Option<u32> {
    match arphrd {
        // Loopback carries a zeroed Ethernet header at TC.
        ARPHRD_ETHER | ARPHRD_LOOPBACK => Some(L2_ETHERNET),
        ARPHRD_NONE | ARPHRD_RAWIP => Some(L2_RAW_IP),
        _ => None,
    }
}

/// The current addresses of the given interfaces, as keys of the local-address map.
pub fn local_addrs(ifaces: &[Iface]) -> std::io::Result<HashMap<LocalAddr, u32>> {
    let mut out = HashMap::new();
    for ifa in getifaddrs().map_err(std::io::Error::from)? {
        let Some(iface) = ifaces.iter().find(|i| i.name == ifa.interface_name) else { continue };
        let Some(addr) = ifa.address else { continue };
        let ip: Option<IpAddr> = if let Some(v4) = addr.as_sockaddr_in() {
            Some(IpAddr::V4(v4.ip()))
        } else {
            addr.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
        };
        if let Some(ip) = ip {
            out.insert(local_addr_key(ip), iface.ifindex);
        }
    }
    Ok(out)
}

/// The map key for `ip`.
pub fn local_addr_key(ip: IpAddr) -> LocalAddr {
    let mut key = LocalAddr { family: 0, _pad: 0, addr: [0; 16] };
    match ip {
        IpAddr::V4(v4) => {
            key.family = AF_INET;
            key.addr[..4].copy_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            key.family = AF_INET6;
            key.addr = v6.octets();
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_route_devices_from_proc_net() {
        let v4 =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                  eth1\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                  wan0\t00000000\t0101A8C0\t0003\t0\t0\t200\t00000000\t0\t0\t0\n\
                  eth0\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n";
        assert_eq!(default_v4(v4).as_deref(), Some("eth0"), "the lowest metric");
        assert_eq!(default_v4("Iface\tDestination\n"), None);
        let v6 = "00000000000000000000000000000000 00 00000000000000000000000000000000 00 \
                  fe800000000000000000000000000001 00000400 00000001 00000000 00000003 ens5\n\
                  00000000000000000000000000000000 00 00000000000000000000000000000000 00 \
                  00000000000000000000000000000000 ffffffff 00000001 00000000 00200200 lo\n";
        assert_eq!(default_v6(v6).as_deref(), Some("ens5"), "not the unreachable route on lo");
    }

    #[test]
    fn names_are_checked_before_lookup() {
        for bad in ["", "a-name-that-is-too-long", "a/b", "..", "a b"] {
            let err = Iface::resolve(bad).unwrap_err();
            assert!(matches!(err, IfaceError::InvalidName { .. }), "{bad:?}: {err}");
        }
    }

    #[test]
    fn missing_interface_is_named() {
        let err = Iface::resolve("lpnosuch0").unwrap_err();
        assert_eq!(
            err.to_string(),
            "interface \"lpnosuch0\" does not exist in this network namespace (see `ip link`)"
        );
    }

    #[test]
    fn loopback_resolves_as_ethernet_framing() {
        let lo = Iface::resolve("lo").unwrap();
        assert_eq!((lo.ifindex, lo.l2), (1, L2_ETHERNET));
    }

    #[test]
    fn address_keys() {
        let k = local_addr_key("198.18.0.1".parse().unwrap());
        assert_eq!((k.family, &k.addr[..5]), (AF_INET, &[198, 18, 0, 1, 0][..]));
        let k = local_addr_key("2001:db8::1".parse().unwrap());
        assert_eq!((k.family, k.addr[0], k.addr[15]), (AF_INET6, 0x20, 1));
    }
}
