//! The TC programs on crafted packets through BPF_PROG_TEST_RUN: malformed and truncated
//! packets are counted and never misparsed, and the programs never drop anything.

use linkpilot::{kernel::checks, kernel::iface::Iface, kernel::probes::Probes};
use linkpilot_common::{IfaceStats, PeerStats};

const TC_ACT_UNSPEC: i32 = -1;
const PEER: u32 = 1;

fn eth(ethertype: u16) -> Vec<u8> {
    let mut v = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
    v.extend_from_slice(&ethertype.to_be_bytes());
    v
}

/// IPv4 header from 198.18.1.10 (the peer) to 198.18.2.10, `ihl` words, `tos`, `proto`.
fn ipv4(ihl: u8, tos: u8, proto: u8, frag: u16) -> Vec<u8> {
    let mut h = vec![0x40 | ihl, tos, 0, 0, 0, 1];
    h.extend_from_slice(&frag.to_be_bytes());
    h.extend_from_slice(&[64, proto, 0, 0, 198, 18, 1, 10, 198, 18, 2, 10]);
    h.resize(usize::from(ihl.max(5)) * 4, 0);
    h
}

/// IPv6 header from 2001:db8:1::10 (the peer) to 2001:db8:2::10.
fn ipv6(tc: u8, next: u8) -> Vec<u8> {
    let mut h = vec![0x60 | (tc >> 4), tc << 4, 0, 0, 0, 0, next, 64];
    h.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10]);
    h.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10]);
    h
}

fn tcp(doff: u8, flags: u8) -> Vec<u8> {
    let mut t = vec![
        0x13,
        0x88,
        0x00,
        0x50,
        0,
        0,
        0,
        1,
        0,
        0,
        0,
        0,
        doff << 4,
        flags,
        0xff,
        0xff,
        0,
        0,
        0,
        0,
    ];
    t.resize(usize::from(doff.max(5)) * 4, 0);
    t
}

fn udp() -> Vec<u8> {
    vec![0x13, 0x88, 0x12, 0xb7, 0, 8, 0, 0]
}

fn cat(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut v: Vec<u8> = parts.concat();
    if v.len() < 14 {
        v.resize(14, 0);
    }
    v
}

/// What one packet must change: (unknown, peer packets, peer unparsed, peer CE, peer ECE).
type Expect = (u64, u64, u64, u64, u64);

/// Packets shorter than their fixed IP header are refused by the kernel's test harness itself
/// (EINVAL), so they are covered by the parser's unit tests (every truncation of a valid packet)
/// rather than here.
fn fixtures() -> Vec<(&'static str, Vec<u8>, Expect)> {
    let tcp_ok = cat(&[eth(0x0800), ipv4(5, 0xb8 | 3, 6, 0), tcp(8, 0x50)]);
    let mut vlan = eth(0x8100);
    vlan.extend_from_slice(&[0, 5, 0x08, 0x00]);
    let mut qinq = eth(0x88a8);
    qinq.extend_from_slice(&[0, 5, 0x81, 0x00, 0, 6, 0x08, 0x00]);
    let mut five_dstopts = Vec::new();
    for i in 0..5 {
        five_dstopts.extend_from_slice(&[if i == 4 { 17 } else { 60 }, 0, 0, 0, 0, 0, 0, 0]);
    }
    let hbh = vec![17, 0, 0, 0, 0, 0, 0, 0];
    let later_fragment = vec![17, 0, 0x05, 0xc8, 0, 0, 0, 1];
    vec![
        ("IPv4 TCP, CE, ECE", tcp_ok.clone(), (0, 1, 0, 1, 1)),
        (
            "IPv4 header length 16",
            cat(&[eth(0x0800), ipv4(4, 0, 6, 0), tcp(5, 0)]),
            (1, 0, 0, 0, 0),
        ),
        (
            "IPv4 options past the end",
            cat(&[eth(0x0800), ipv4(15, 0, 6, 0)])[..14 + 40].to_vec(),
            (1, 0, 0, 0, 0),
        ),
        ("TCP data offset 4", cat(&[eth(0x0800), ipv4(5, 0, 6, 0), tcp(4, 0x40)]), (0, 1, 1, 0, 0)),
        ("TCP header truncated", tcp_ok[..14 + 20 + 10].to_vec(), (0, 1, 1, 1, 0)),
        ("TCP options truncated", tcp_ok[..14 + 20 + 24].to_vec(), (0, 1, 1, 1, 0)),
        (
            "IPv4 later fragment",
            cat(&[eth(0x0800), ipv4(5, 0, 17, 0x00b9), udp()]),
            (0, 1, 1, 0, 0),
        ),
        ("802.1Q IPv4 UDP, CE", cat(&[vlan.clone(), ipv4(5, 3, 17, 0), udp()]), (0, 1, 0, 1, 0)),
        ("802.1Q truncated inside", vlan.clone(), (1, 0, 0, 0, 0)),
        ("QinQ (two tags, not parsed)", cat(&[qinq, ipv4(5, 3, 17, 0), udp()]), (1, 0, 0, 0, 0)),
        ("ARP", cat(&[eth(0x0806), vec![0; 28]]), (1, 0, 0, 0, 0)),
        (
            "IPv4 version 6 in IPv4 ethertype",
            cat(&[eth(0x0800), ipv6(0, 17), udp()]),
            (1, 0, 0, 0, 0),
        ),
        ("IPv6 UDP, CE", cat(&[eth(0x86dd), ipv6(3, 17), udp()]), (0, 1, 0, 1, 0)),
        ("IPv6 hop-by-hop then UDP", cat(&[eth(0x86dd), ipv6(0, 0), hbh, udp()]), (0, 1, 0, 0, 0)),
        (
            "IPv6 five extension headers",
            cat(&[eth(0x86dd), ipv6(0, 60), five_dstopts, udp()]),
            (0, 1, 1, 0, 0),
        ),
        (
            "IPv6 later fragment",
            cat(&[eth(0x86dd), ipv6(0, 44), later_fragment, udp()]),
            (0, 1, 1, 0, 0),
        ),
        (
            "IPv6 extension header truncated",
            cat(&[eth(0x86dd), ipv6(0, 0), vec![17]]),
            (0, 1, 1, 0, 0),
        ),
    ]
}

fn snapshot(p: &Probes) -> (IfaceStats, PeerStats) {
    (p.stats(1).expect("lo stats"), p.peer_stats(1, PEER).expect("peer stats"))
}

/// Our programs loaded (as root), attached to nothing.
fn loaded() -> Probes {
    checks::check_privileges().expect("root");
    let (offsets, _) = checks::kernel_offsets(true);
    Probes::load(offsets).expect("load")
}

/// Our programs loaded and counting on `lo`, with one peer: `id` for `cidr`.
fn loaded_on_lo(id: u32, cidr: &str) -> Probes {
    let mut probes = loaded();
    probes.set_peers(&[(id, cidr.parse().unwrap())]).expect("peers");
    probes.count_on(&Iface::resolve("lo").expect("lo")).expect("count on lo");
    probes
}

#[test]
fn malformed_and_truncated_packets_are_counted_never_misparsed_never_dropped() {
    let mut probes = loaded();
    // Both ends of the fixtures belong to the peer, so ingress (source) and egress (destination)
    // attribute alike.
    let prefixes = ["198.18.1.0/24", "198.18.2.0/24", "2001:db8:1::/48", "2001:db8:2::/48"];
    let prefixes: Vec<_> = prefixes.iter().map(|p| (PEER, p.parse().unwrap())).collect();
    probes.set_peers(&prefixes).expect("peers");
    probes.count_on(&Iface::resolve("lo").expect("lo")).expect("count on lo");
    for (name, packet, (unknown, packets, unparsed, ce, ece)) in fixtures() {
        for egress in [false, true] {
            let (before, pb) = snapshot(&probes);
            let (verdict, _) =
                probes.run_classifier(egress, &packet, 1).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(verdict, TC_ACT_UNSPEC, "{name}: the verdict must let the packet through");
            let (after, pa) = snapshot(&probes);
            let (d, db) = if egress { (&pa.tx, &pb.tx) } else { (&pa.rx, &pb.rx) };
            let got_unknown = if egress {
                after.tx_unknown - before.tx_unknown
            } else {
                after.rx_unknown - before.rx_unknown
            };
            let got = (
                got_unknown,
                d.packets - db.packets,
                d.unparsed - db.unparsed,
                d.ecn[3] - db.ecn[3],
                d.tcp_ece - db.tcp_ece,
            );
            assert_eq!(
                got,
                (unknown, packets, unparsed, ce, ece),
                "{name} ({})",
                if egress { "egress" } else { "ingress" }
            );
            let seen = if egress {
                after.tx_packets - before.tx_packets
            } else {
                after.rx_packets - before.rx_packets
            };
            assert_eq!(seen, 1, "{name}: every packet counts on the interface");
        }
    }
}

/// Each fixture of the table above loses what its kind says, on both paths, and nothing else.
#[test]
fn what_the_programs_lose_is_counted_by_kind() {
    use linkpilot_common::packet::Loss;
    let mut probes = loaded_on_lo(PEER, "198.18.1.0/24");
    let truncated = Some(Loss::TruncatedHeader);
    let expected = [
        ("IPv4 TCP, CE, ECE", None),
        ("IPv4 header length 16", truncated),
        ("IPv4 options past the end", truncated),
        ("TCP data offset 4", truncated),
        ("TCP header truncated", truncated),
        ("TCP options truncated", truncated),
        ("IPv4 later fragment", None),
        ("802.1Q IPv4 UDP, CE", None),
        ("802.1Q truncated inside", truncated),
        ("QinQ (two tags, not parsed)", Some(Loss::UnknownLinkType)),
        ("ARP", None),
        ("IPv4 version 6 in IPv4 ethertype", truncated),
        ("IPv6 UDP, CE", None),
        ("IPv6 hop-by-hop then UDP", None),
        ("IPv6 five extension headers", None),
        ("IPv6 later fragment", None),
        ("IPv6 extension header truncated", truncated),
    ];
    let fixtures = fixtures();
    assert_eq!(fixtures.len(), expected.len(), "a kind for every fixture");
    for ((name, packet, _), (want_name, kind)) in fixtures.iter().zip(expected) {
        assert_eq!(*name, want_name);
        for egress in [false, true] {
            let before = probes.losses().expect("losses");
            probes.run_classifier(egress, packet, 1).unwrap_or_else(|e| panic!("{name}: {e}"));
            let after = probes.losses().expect("losses");
            let mut want = before.by_kind;
            if let Some(k) = kind {
                want[k as usize] += 1;
            }
            assert_eq!(
                after.by_kind,
                want,
                "{name} ({})",
                if egress { "egress" } else { "ingress" }
            );
        }
    }
}

#[test]
fn egress_dscp_histogram_and_ipv4_mapped_peers() {
    // Egress: the peer is the destination, 198.18.2.10.
    let mut probes = loaded_on_lo(2, "198.18.2.0/24");
    let pkt = cat(&[eth(0x0800), ipv4(5, (26 << 2) | 2, 6, 0), tcp(5, 0x10)]);
    for _ in 0..3 {
        probes.run_classifier(true, &pkt, 1).expect("run");
    }
    let s = probes.peer_stats(1, 2).expect("peer 2");
    assert_eq!(s.tx.packets, 3);
    assert_eq!(s.tx_dscp[26], 3, "DSCP 26 (AF31)");
    assert_eq!(s.tx.ecn[2], 3, "ECT(0)");
    assert_eq!(probes.peer_stats(1, 0).expect("other").tx.packets, 0);
}

#[test]
fn batched_flow_table_read_equals_aya_iteration() {
    use linkpilot_common::{FlowKey, FlowState};
    let mut probes = loaded();
    // More than one batch (4096), with distinct keys and values.
    let flows: Vec<(FlowKey, FlowState)> = (0..10_000u32)
        .map(|i| {
            let mut k = FlowKey {
                family: 10,
                local_port: i as u16,
                remote_port: 5201,
                ..FlowKey::default()
            };
            k.remote[12..].copy_from_slice(&i.to_be_bytes());
            (k, FlowState { srtt_us: i, rtt_samples: u64::from(i) * 3, ..FlowState::default() })
        })
        .collect();
    probes.insert_flows(&flows).expect("insert");
    let sorted = |mut v: Vec<(FlowKey, FlowState)>| {
        v.sort_by_key(|(k, _)| (k.remote, k.local_port));
        v
    };
    let batched = sorted(probes.flows().expect("batched read"));
    assert_eq!(batched.len(), flows.len());
    assert_eq!(batched, sorted(probes.flows_iterated().expect("iterated read")));
    assert_eq!(batched, sorted(flows));
}

#[test]
fn peer_changes_invalidate_the_address_cache() {
    let mut probes = loaded_on_lo(1, "198.18.7.0/24");
    // To 198.18.2.10. Repeated runs hit the cache: still "other", as the trie says.
    let pkt = cat(&[eth(0x0800), ipv4(5, 2, 6, 0), tcp(5, 0x10)]);
    for _ in 0..3 {
        probes.run_classifier(true, &pkt, 1).expect("run");
    }
    assert_eq!(probes.peer_stats(1, 0).expect("other").tx.packets, 3);
    // A new prefix covers the cached address: the next packet must see it.
    probes.set_peers(&[(2, "198.18.2.0/24".parse().unwrap())]).expect("peers");
    probes.run_classifier(true, &pkt, 1).expect("run");
    assert_eq!(probes.peer_stats(1, 2).expect("peer 2").tx.packets, 1, "a stale cache answer");
    assert_eq!(probes.peer_stats(1, 0).expect("other").tx.packets, 3);
    // A prefix left out of the next set leaves the trie (a reloaded policy dropped the peer).
    probes.set_peers(&[(1, "198.18.7.0/24".parse().unwrap())]).expect("peers");
    probes.run_classifier(true, &pkt, 1).expect("run");
    assert_eq!(
        probes.peer_stats(1, 0).expect("other").tx.packets,
        4,
        "a dropped prefix still matched"
    );
    assert_eq!(probes.peer_stats(1, 2).expect("peer 2").tx.packets, 1);
}
