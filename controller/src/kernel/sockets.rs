//! The established TCP connections of the daemon's network namespace, with their owners, as
//! `/proc/net/tcp{,6}` lists them (parsed by procfs-core): the jobs' flows by owner, and the
//! connections that were already open when the daemon started (the tracepoints saw them open
//! before it ran).

use std::net::{IpAddr, SocketAddr};

use linkpilot_common::{v4_mapped, FlowKey, AF_INET, AF_INET6};
use procfs_core::{
    net::{TcpNetEntries, TcpState},
    ExplicitSystemInfo, FromReadSI,
};

/// (owner uid, flow key) of each established connection of this network namespace, IPv4 and
/// IPv6. A table that cannot be read (no IPv6) gives none of its family.
pub fn established() -> Vec<(u32, FlowKey)> {
    let mut out = Vec::new();
    for (file, family) in [("/proc/net/tcp", AF_INET), ("/proc/net/tcp6", AF_INET6)] {
        if let Ok(text) = std::fs::read_to_string(file) {
            out.extend(parse_proc_net_tcp(&text, family));
        }
    }
    out
}

/// (owner uid, flow key) of each established connection in `/proc/net/tcp` (`family`
/// AF_INET) or `/proc/net/tcp6` (AF_INET6) text; none if any line is not the kernel's format.
fn parse_proc_net_tcp(text: &str, family: u16) -> Vec<(u32, FlowKey)> {
    // Of the system, the parser reads only the byte order the kernel printed the addresses in.
    let here = ExplicitSystemInfo {
        boot_time_secs: 0,
        ticks_per_second: 0,
        page_size: 0,
        is_little_endian: cfg!(target_endian = "little"),
    };
    let Ok(TcpNetEntries(entries)) = TcpNetEntries::from_read(text.as_bytes(), &here) else {
        return Vec::new();
    };
    entries
        .into_iter()
        .filter(|e| e.state == TcpState::Established)
        .map(|e| {
            let (local, local_port) = endpoint(e.local_address);
            let (remote, remote_port) = endpoint(e.remote_address);
            (e.uid, FlowKey { family, local_port, remote_port, _pad: 0, local, remote })
        })
        .collect()
}

/// The address as the flow table keys it (IPv4 mapped into IPv6), and the port.
fn endpoint(a: SocketAddr) -> ([u8; 16], u16) {
    let bytes = match a.ip() {
        IpAddr::V4(v4) => v4_mapped(v4.octets()),
        IpAddr::V6(v6) => v6.octets(),
    };
    (bytes, a.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_tcp_rows_become_flow_keys() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100000A:1451 0200000A:D431 01 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0000000000000000 20 4 30 10 -1\n   1: 0100000A:1451 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4243 1\n";
        let rows = parse_proc_net_tcp(v4, AF_INET);
        assert_eq!(rows.len(), 1, "the listener is not a flow");
        let (uid, k) = rows[0];
        assert_eq!(uid, 1000);
        assert_eq!(k.local, v4_mapped([10, 0, 0, 1]));
        assert_eq!(k.remote, v4_mapped([10, 0, 0, 2]));
        assert_eq!((k.local_port, k.remote_port, k.family), (5201, 54321, AF_INET));
        // A dual-stack socket's IPv4 peer, as tcp6 prints it.
        let v6 = "  sl  local_address                         remote_address                        st\n   0: 0000000000000000FFFF00000100000A:1451 0000000000000000FFFF00000200000A:D431 01 00000000:00000000 00:00000000 00000000     0        0 77 1\n";
        let rows = parse_proc_net_tcp(v6, AF_INET6);
        assert_eq!(rows[0].1.local, v4_mapped([10, 0, 0, 1]), "{:?}", rows[0].1.local);
        assert_eq!(rows[0].1.family, AF_INET6);
        for bad in [
            "header\n 0: zz:1 00:00 01 a b c d e f\n",
            "header\n 0: 0100000A:1451 0200000A:D431 01 a b c x\n",
        ] {
            assert!(parse_proc_net_tcp(bad, AF_INET).is_empty(), "{bad}");
        }
    }

    #[test]
    fn this_namespaces_connections_are_listed() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, _) = l.accept().unwrap();
        let port = c.local_addr().unwrap().port();
        let conns = established();
        let mine: Vec<_> = conns.iter().filter(|(_, k)| k.local_port == port).collect();
        assert_eq!(mine.len(), 1, "{port} in {conns:?}");
        assert_eq!(mine[0].1.remote_port, l.local_addr().unwrap().port());
    }
}
