//! RoCEv2 parsing on packets built by scapy's RoCE layer (`scapy.contrib.roce`), run through
//! the TC program with BPF_PROG_TEST_RUN: BTH classes, CNPs, ACK/NAK syndromes, repeated PSNs.

use linkpilot::{kernel::checks, kernel::iface::Iface, kernel::probes::Probes};
use linkpilot_tests::sh;

/// Builds the packets with Debian's scapy (the system interpreter, which has it) and returns
/// (name, bytes) in order.
fn scapy_packets() -> Vec<(String, Vec<u8>)> {
    let script = r#"
from scapy.all import Ether, IP, IPv6, UDP, Raw, raw
from scapy.contrib.roce import BTH, AETH, cnp, opcode
def ip(): return Ether()/IP(src='198.18.1.10', dst='198.18.2.10')/UDP(sport=49152, dport=4791)
send = opcode('RC', 'SEND_ONLY')[0]
ack = opcode('RC', 'ACKNOWLEDGE')[0]
pkts = [
    ('send psn 100', ip()/BTH(opcode=send, dqpn=0x11, psn=100)),
    ('send psn 101', ip()/BTH(opcode=send, dqpn=0x11, psn=101)),
    ('send psn 101 again', ip()/BTH(opcode=send, dqpn=0x11, psn=101)),
    ('send psn 100 again', ip()/BTH(opcode=send, dqpn=0x11, psn=100)),
    ('send other qp psn 100', ip()/BTH(opcode=send, dqpn=0x12, psn=100)),
    ('cnp', ip()/cnp(0x11)),
    ('ack', ip()/BTH(opcode=ack, dqpn=0x11, psn=101)/AETH(syndrome=0x00)),
    ('nak psn sequence error', ip()/BTH(opcode=ack, dqpn=0x11, psn=101)/AETH(syndrome=0x60)),
    ('rnr nak', ip()/BTH(opcode=ack, dqpn=0x11, psn=101)/AETH(syndrome=0x2e)),
    ('nak invalid request', ip()/BTH(opcode=ack, dqpn=0x11, psn=101)/AETH(syndrome=0x61)),
    ('ud send only', ip()/BTH(opcode=opcode('UD', 'SEND_ONLY')[0], dqpn=0x13, psn=5)),
    ('truncated bth', ip()/Raw(b'\x04\x00\xff')),
    ('ipv6 send', Ether()/IPv6(src='2001:db8:1::10', dst='2001:db8:2::10')/UDP(dport=4791)/BTH(opcode=send, dqpn=0x11, psn=100)),
]
for name, p in pkts:
    print(name + '|' + raw(p).hex())
"#;
    let out = sh(&["/usr/bin/python3", "-c", script]);
    out.lines()
        .map(|l| {
            let (name, hex) = l.split_once('|').expect("name|hex");
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                .collect();
            (name.to_owned(), bytes)
        })
        .collect()
}

#[test]
fn scapy_rocev2_packets_are_classified() {
    checks::check_privileges().expect("root");
    let packets = scapy_packets();
    assert_eq!(packets.len(), 13, "scapy built every packet");
    let (offsets, _) = checks::kernel_offsets(true);
    let mut probes = Probes::load(offsets).expect("load");
    let hk = ["198.18.1.0/24", "2001:db8:1::/48"].map(|p| (1, p.parse().unwrap()));
    probes.set_peers(&hk).expect("peers");
    probes.count_on(&Iface::resolve("lo").expect("lo")).expect("count on lo");
    for (name, bytes) in &packets {
        let (verdict, _) =
            probes.run_classifier(false, bytes, 1).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(verdict, -1, "{name}: passed on");
    }
    let r = probes.peer_stats(1, 1).expect("peer").rx_roce;
    eprintln!("{r:?}");
    assert_eq!(r.packets, 13);
    assert_eq!(r.truncated, 1);
    // RC: five sends, four ACK/NAKs, the IPv6 send; CNP class; UD.
    assert_eq!((r.by_class[0], r.by_class[3], r.by_class[4]), (10, 1, 1));
    assert_eq!(r.cnp, 1);
    assert_eq!((r.ack, r.nak_psn_seq, r.nak_rnr, r.nak_other), (1, 1, 1, 1));
    // PSN 101 and 100 seen again on QP 0x11; other QPs and the IPv6 peer address are separate.
    assert_eq!(r.retransmitted, 2);
    assert_eq!(probes.peer_stats(1, 1).expect("peer").tx_roce.packets, 0);
}
