//! `linkpilot bench-programs`: nanoseconds per packet of each TC program through
//! BPF_PROG_TEST_RUN, next to an empty classifier measured the same way in the same run (the
//! harness's own cost), for TCP, RoCEv2 and IPv6 packets.

use std::time::Duration;

use crate::{
    kernel::checks,
    kernel::iface::Iface,
    kernel::probes::{ProbeError, Probes},
};

/// A packet to measure with.
pub struct Fixture {
    pub name: &'static str,
    pub bytes: Vec<u8>,
}

fn eth(ethertype: u16) -> Vec<u8> {
    let mut v = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
    v.extend_from_slice(&ethertype.to_be_bytes());
    v
}

fn ipv4(total: usize, proto: u8) -> Vec<u8> {
    let len = (total - 14) as u16;
    let mut h = vec![0x45, 0xb8 | 2, (len >> 8) as u8, len as u8, 0, 1, 0x40, 0, 64, proto, 0, 0];
    h.extend_from_slice(&[198, 18, 1, 10, 198, 18, 2, 10]);
    h
}

/// 1514-byte TCP/IPv4, 1086-byte RoCEv2 (UDP 4791, BTH RC SEND ONLY), 1514-byte TCP/IPv6, a
/// malformed 1514-byte IPv4 packet (header length 16 bytes): the slow path and a counted loss;
/// and the TCP/IPv4 packet CE-marked: on ingress, the flow-table lookup every marked segment
/// pays (a miss here: the bench opens no connection).
pub fn fixtures() -> Vec<Fixture> {
    let tcp = |mut p: Vec<u8>, total: usize| {
        p.extend_from_slice(&[
            0x13, 0x88, 0x00, 0x50, 0, 0, 0, 1, 0, 0, 0, 0, 0x80, 0x10, 0xff, 0xff,
        ]);
        p.resize(total, 0);
        p
    };
    let tcp4 = tcp([eth(0x0800), ipv4(1514, 6)].concat(), 1514);
    let mut roce = [eth(0x0800), ipv4(1086, 17)].concat();
    roce.extend_from_slice(&[0xc3, 0x50, 0x12, 0xb7, 0x04, 0x28, 0, 0]); // UDP to 4791
    roce.extend_from_slice(&[0x04, 0x40, 0xff, 0xff, 0, 0, 0x01, 0x23, 0x80, 0, 0x10, 0x00]); // BTH
    roce.resize(1086, 0);
    let mut ip6 = eth(0x86dd);
    ip6.extend_from_slice(&[0x6b, 0x80, 0, 0, 0x05, 0xb4, 6, 64]);
    ip6.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10]);
    ip6.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10]);
    let tcp6 = tcp(ip6, 1514);
    let mut malformed = tcp4.clone();
    malformed[14] = 0x44;
    let mut tcp4_ce = tcp4.clone();
    tcp4_ce[15] |= 3;
    vec![
        Fixture { name: "tcp4", bytes: tcp4 },
        Fixture { name: "rocev2", bytes: roce },
        Fixture { name: "tcp6", bytes: tcp6 },
        Fixture { name: "malformed", bytes: malformed },
        Fixture { name: "tcp4-ce", bytes: tcp4_ce },
    ]
}

/// (median, minimum) over `rounds` of the kernel's mean time per run. On a shared machine the
/// minimum is the steadier figure: interference only ever adds time.
fn median(
    mut f: impl FnMut() -> Result<Duration, ProbeError>,
    rounds: usize,
) -> Result<(f64, f64), ProbeError> {
    let mut v =
        (0..rounds).map(|_| f().map(|d| d.as_nanos() as f64)).collect::<Result<Vec<_>, _>>()?;
    v.sort_by(f64::total_cmp);
    Ok((v[v.len() / 2], v[0]))
}

/// Measures and prints the table.
pub fn run(repeat: u32, rounds: usize) -> anyhow::Result<()> {
    checks::check_privileges()?;
    let (offsets, _) = checks::kernel_offsets(true);
    let mut probes = Probes::load(offsets)?;
    // Peers and counters as in production, on loopback (the test skb's device).
    probes.set_peers(&[(1, "198.18.1.0/24".parse()?), (2, "2001:db8:1::/48".parse()?)])?;
    probes.count_on(&Iface::resolve("lo")?)?;
    println!("repeat {repeat}, {rounds} rounds, ns per packet: median (minimum)");
    println!(
        "{:<9} {:>12} {:>12} {:>12} {:>16} {:>16}",
        "packet", "empty", "ingress", "egress", "ingress-empty", "egress-empty"
    );
    let cell = |(med, min): (f64, f64)| format!("{med:.0} ({min:.0})");
    for fx in fixtures() {
        let empty = median(|| probes.run_noop(&fx.bytes, repeat).map(|r| r.1), rounds)?;
        let ingress =
            median(|| probes.run_classifier(false, &fx.bytes, repeat).map(|r| r.1), rounds)?;
        let egress =
            median(|| probes.run_classifier(true, &fx.bytes, repeat).map(|r| r.1), rounds)?;
        let above = |(m, n): (f64, f64)| (m - empty.0, n - empty.1);
        println!(
            "{:<9} {:>12} {:>12} {:>12} {:>16} {:>16}",
            fx.name,
            cell(empty),
            cell(ingress),
            cell(egress),
            cell(above(ingress)),
            cell(above(egress))
        );
    }
    Ok(())
}
