//! What the datapath loses, it says: frames whose IP header is cut short and frames with more
//! VLAN tags than the kernel and the parser take off, sent by scapy onto the watched veth, are
//! counted per kind in the daemon's metrics (as many as scapy sent and the kernel's interface
//! counter received) and warned about through aya-log in the daemon's log, once per kind however
//! many arrive (the programs rate-limit). Its per-CPU counters are sized for the interfaces it
//! watches.

use std::time::Duration;

use linkpilot_tests::{
    daemon::{sample, scrape, wait_for, Daemon},
    faults::{self, policy},
    netns::{Netns, Pair},
    oracle::map_named,
    sh,
};

/// The kernel's count of frames received on `iface` in `ns`.
fn rx_packets(ns: &Netns, iface: &str) -> u64 {
    let path = format!("/sys/class/net/{iface}/statistics/rx_packets");
    ns.exec(&["cat", &path]).trim().parse().expect("rx_packets")
}

/// Sends `count` copies of the frame `hex` (from the Ethernet type on) from `ns` out of
/// `iface` to `dst_mac` with scapy; returns how many scapy says it sent.
fn send_frames(ns: &Netns, iface: &str, dst_mac: &str, hex: &str, count: u32) -> u64 {
    let script = format!(
        "from scapy.all import Ether, Raw, sendp\n\
         frame = Ether(dst='{dst_mac}', type=int('{}', 16)) / Raw(bytes.fromhex('{}'))\n\
         sent = sendp(frame, iface='{iface}', count={count}, verbose=False, return_packets=True)\n\
         print(len(sent))\n",
        &hex[..4],
        &hex[4..]
    );
    ns.exec(&["/usr/bin/python3", "-c", &script]).trim().parse().expect("scapy's count")
}

fn lost(netns: &str, kind: &str) -> f64 {
    let series = format!("linkpilot_datapath_lost_total{{kind=\"{kind}\"}}");
    sample(&scrape(netns), &series).unwrap_or(-1.0)
}

#[test]
fn truncated_headers_and_stacked_vlans_are_counted_by_kind_and_warned_once() {
    let pair = Pair::new("198.18.147.1", "198.18.147.2");
    let dir = faults::temp_dir("losses");
    let mut d = Daemon::start(&pair.a.name, &dir, &policy(pair.a_if, pair.b_addr, "calm", 10));
    d.wait_up();
    // Its counters are sized for its one interface: 65 peer rows (64 peers and "other") per CPU,
    // not 64 interfaces' worth (bpftool).
    let peers = map_named(&faults::maps_of(d.child.id()), "LP_PEER_STATS").expect("LP_PEER_STATS");
    let show = sh(&["bpftool", "map", "show", "id", &peers.to_string(), "--json"]);
    let show: serde_json::Value = serde_json::from_str(&show).expect("bpftool JSON");
    assert_eq!(show["max_entries"], 65, "{show}");
    let metrics = &pair.a.name;
    assert_eq!(lost(metrics, "truncated_header"), 0.0, "nothing lost yet");
    let mac = pair.a.exec(&["cat", &format!("/sys/class/net/{}/address", pair.a_if)]);
    let mac = mac.trim();

    // IPv4 whose header says 60 bytes (IHL 15) in a 20-byte packet.
    let cut = "0800 4f000014000140004006 0000 c6129302 c6129301".replace(' ', "");
    let rx = rx_packets(&pair.a, pair.a_if);
    let sent = send_frames(&pair.b, pair.b_if, mac, &cut, 40);
    assert_eq!(sent, 40, "scapy sent them all");
    wait_for("the truncated headers in the metrics", Duration::from_secs(5), || {
        lost(metrics, "truncated_header") == sent as f64
    });
    assert!(rx_packets(&pair.a, pair.a_if) - rx >= sent, "the kernel received them");

    // Three VLAN tags: the kernel takes the outer one off before TC, and the parser takes one
    // more, not two.
    let qinq = "88a8 0005 8100 0006 8100 0007 0800 45000014000140004011 0000 c6129302 c6129301";
    let sent = send_frames(&pair.b, pair.b_if, mac, &qinq.replace(' ', ""), 25);
    wait_for("the stacked tags in the metrics", Duration::from_secs(5), || {
        lost(metrics, "unknown_link_type") == sent as f64
    });
    assert_eq!(lost(metrics, "map_insert_failed"), 0.0);
    assert_eq!(lost(metrics, "flow_evicted"), 0.0);

    // One warning per kind for all of them, forwarded from the programs' log.
    wait_for("the warnings in the log", Duration::from_secs(5), || {
        d.log().contains("stacked VLAN tags")
    });
    let log = d.log();
    let warnings =
        |what: &str| log.lines().filter(|l| l.contains("WARN") && l.contains(what)).count();
    assert_eq!(warnings("datapath loss: truncated or malformed header"), 1, "{log}");
    assert_eq!(warnings("datapath loss: unknown link-layer type or stacked VLAN tags"), 1, "{log}");
    assert!(d.child.try_wait().expect("wait").is_none(), "the daemon runs on: {log}");
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}
