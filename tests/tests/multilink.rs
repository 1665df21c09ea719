//! Two links on two interfaces of one node, both reaching the same peer address (198.18.2.10,
//! a US host of its own lab) over paths of different delay: each link must decide on its own
//! interface's RTT (against ping on that path) and mark its own interface's traffic with its own
//! DSCP (against tshark at each far host).
//!
//! ```text
//!            ┌ lpn1 198.19.1.1 ── lpx1 (lab ma?a: hk0, forwards) ── 10 ms each way ── us0
//!  node ns ──┤
//!            └ lpn2 198.19.2.1 ── lpx2 (lab ma?b: hk0, forwards) ── 30 ms each way ── us0
//! ```
//! The node picks the path by source address (policy routing); both US hosts are 198.18.2.10.
//! Each test's labs are ma<tag>a and ma<tag>b (tag: s or n).

use linkpilot_tests::policy::PolicyToml;
use std::{
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use linkpilot_lab::{
    lab::{Host, Lab},
    selftest,
};
use linkpilot_tests::{
    daemon::{iperf3_server, lab_with, status_json, wait_for, Daemon},
    netns::Netns,
    sh, Reaped,
};
use serde_json::Value;

/// Link "near" on lpn1, link "far" on lpn2; `near_peers` is the near link's `[[link.peer]]`
/// (empty: it names none and counts everything on lpn1). An RTT p99 of 40 ms or more (only the
/// far path's 60 ms) moves a link from DSCP 10 to DSCP 46.
fn policy(near_peers: &str) -> String {
    PolicyToml::new()
        .hysteresis("30s", "1s")
        .link("near", "lpn1", "100Mbit/s", None)
        .raw(near_peers)
        .link("far", "lpn2", "100Mbit/s", Some(("dc", "198.18.2.0/24")))
        .state("healthy", "", "", ("none", 10, 106))
        .state("slow", "rtt_p99 = \"40ms\"", "rtt_p99 = \"30ms\"", ("none", 46, 106))
        .build()
}

const SHARED_PEER: &str = "[[link.peer]]\nname = \"dc\"\ncidrs = [\"198.18.2.0/24\"]";

/// One path: the node's address on it, the lab behind it and its US host.
struct Route {
    node_addr: String,
    us: Host,
    _lab: Lab,
}

/// Joins `node` to the HK host of `lab` by a veth pair (`node_if`, 198.19.`n`.1 in the node;
/// lpx`n`, 198.19.`n`.2 in the HK host, which forwards), and routes the node's traffic from
/// 198.19.`n`.1 through it. The lab's router learns the way back to 198.19.`n`.0/24.
fn route(node: &Netns, n: u8, node_if: &str, lab: Lab) -> Route {
    let (hk, us) = lab.hk_us();
    let (lab_if, node_addr, hk_addr) =
        (format!("lpx{n}"), format!("198.19.{n}.1"), format!("198.19.{n}.2"));
    sh(&[
        "ip", "-n", &node.name, "link", "add", node_if, "type", "veth", "peer", "name", &lab_if,
        "netns", &hk.netns,
    ]);
    node.exec(&["ip", "addr", "add", &format!("{node_addr}/24"), "dev", node_if]);
    node.exec(&["ip", "link", "set", node_if, "up"]);
    let table = format!("20{n}");
    node.exec(&["ip", "rule", "add", "from", &node_addr, "lookup", &table]);
    node.exec(&["ip", "route", "add", "default", "via", &hk_addr, "dev", node_if, "table", &table]);
    hk.exec(&["ip", "addr", "add", &format!("{hk_addr}/24"), "dev", &lab_if]).expect("addr");
    hk.exec(&["ip", "link", "set", &lab_if, "up"]).expect("up");
    hk.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]).expect("forwarding");
    sh(&[
        "ip",
        "-n",
        lab.wan_netns(),
        "route",
        "add",
        &format!("198.19.{n}.0/24"),
        "via",
        &hk.ipv4.to_string(),
    ]);
    Route { node_addr, us, _lab: lab }
}

fn in_node(node: &Netns, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &node.name]).args(args);
    c
}

/// Average ping RTT from `p`'s node address to its US host, ms.
fn ping(node: &Netns, p: &Route) -> f64 {
    let out = node.exec(&[
        "ping",
        "-q",
        "-c",
        "10",
        "-i",
        "0.2",
        "-I",
        &p.node_addr,
        &p.us.ipv4.to_string(),
    ]);
    selftest::parse_ping_avg(&out).unwrap_or_else(|| panic!("no RTT in ping's output:\n{out}"))
}

fn link<'a>(st: &'a Value, name: &str) -> &'a Value {
    st["links"]
        .as_array()
        .and_then(|a| a.iter().find(|l| l["link"] == name))
        .unwrap_or_else(|| panic!("no link {name} in status: {st}"))
}

/// The status row of interface `iface` and peer `peer`.
fn peer_row<'a>(st: &'a Value, iface: &str, peer: &str) -> &'a Value {
    st["peers"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["interface"] == iface && p["peer"] == peer))
        .unwrap_or_else(|| panic!("no peer {peer} on {iface} in status: {st}"))
}

/// Each link's state, DSCP and RTT, and each (interface, peer) row's srtt, on one line.
fn summary(st: &Value) -> String {
    let mut out = Vec::new();
    for l in st["links"].as_array().into_iter().flatten() {
        let s = &l["signals"];
        out.push(format!(
            "{} {} dscp {} rtt {} p99 {}",
            l["link"], l["state"], l["knobs"]["dscp"], s["rtt_ms"], s["rtt_p99_ms"]
        ));
    }
    for p in st["peers"].as_array().into_iter().flatten() {
        out.push(format!("{}/{} srtt {}", p["interface"], p["peer"], p["srtt_ms"]));
    }
    out.join("; ")
}

fn two_links(tag: &str, near_peers: &str) {
    let node = Netns::new("node");
    let near = route(&node, 1, "lpn1", lab_with(&format!("ma{tag}a"), "delay = \"10ms\""));
    let far = route(&node, 2, "lpn2", lab_with(&format!("ma{tag}b"), "delay = \"30ms\""));
    let dir = linkpilot_tests::temp_dir(&format!("multilink-{tag}"));
    let mut d = Daemon::start(&node.name, &dir, &policy(near_peers));
    d.wait_up();
    wait_for("both links in status", Duration::from_secs(5), || {
        status_json(&dir)["links"].as_array().is_some_and(|l| l.len() == 2)
    });

    // What each US host receives from the node, judged by tshark.
    let pcaps: Vec<String> = ["near", "far"]
        .iter()
        .map(|l| dir.join(format!("{l}.pcap")).display().to_string())
        .collect();
    let dumps: Vec<Reaped> = [&near, &far]
        .iter()
        .zip(&pcaps)
        .map(|(p, pcap)| {
            let filter = format!("src host {} and tcp", p.node_addr);
            Reaped::new(selftest::start_capture(&p.us, &filter, pcap).expect("tcpdump"))
        })
        .collect();
    let servers: Vec<Reaped> =
        [&near, &far].iter().map(|p| Reaped::new(iperf3_server(&p.us))).collect();
    // Paced, light flows: RTT samples without a standing queue in the delay line.
    let clients: Vec<Reaped> = [&near, &far]
        .iter()
        .map(|p| {
            let c = in_node(&node, &["iperf3", "-c", &p.us.ipv4.to_string(), "-B", &p.node_addr])
                .args(["-b", "5M", "-l", "8K", "-t", "10"])
                .stdout(Stdio::null())
                .spawn()
                .expect("iperf3 -c");
            Reaped::new(c)
        })
        .collect();
    let onset = Instant::now();
    thread::sleep(Duration::from_secs(2));
    // ping on both paths at once, while the flows run: the RTT each link should report.
    let pings = thread::scope(|s| {
        let a = s.spawn(|| ping(&node, &near));
        let b = s.spawn(|| ping(&node, &far));
        (a.join().expect("ping near"), b.join().expect("ping far"))
    });
    // Until the far link is slow and both rows had a fresh sample this tick (a tick without a
    // flow-table reading has none); judged below, after the figures are printed.
    let ready = |st: &Value| {
        link(st, "far")["state"] == "slow"
            && ["lpn1", "lpn2"].iter().all(|i| peer_row(st, i, "dc")["srtt_ms"].is_f64())
    };
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut st = status_json(&dir);
    while !ready(&st) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
        st = status_json(&dir);
    }
    let took = onset.elapsed();
    for c in clients {
        let s = c.take().wait().expect("iperf3 client");
        assert!(s.success(), "iperf3 client: {s}\n{}", d.log());
    }
    for s in servers {
        s.take().wait().expect("iperf3 server");
    }
    thread::sleep(Duration::from_millis(300));
    let dropped: Vec<u64> = dumps
        .into_iter()
        .map(|c| selftest::stop_capture(c.take()).expect("stop tcpdump"))
        .collect();
    let dscp: Vec<Vec<u64>> = pcaps.iter().map(|p| linkpilot_tests::oracle::data_dscp(p)).collect();
    let count = |i: usize, v: u64| dscp[i].iter().filter(|&&x| x == v).count();
    eprintln!(
        "ping near {:.1} ms far {:.1} ms; status at {took:?}: {}\n\
         tshark DSCP of data segments: near 10x{} 46x{} of {}; far 10x{} 46x{} of {}",
        pings.0,
        pings.1,
        summary(&st),
        count(0, 10),
        count(0, 46),
        dscp[0].len(),
        count(1, 10),
        count(1, 46),
        dscp[1].len(),
    );
    // The lab itself: 20 ms and 60 ms round trips.
    assert!((pings.0 - 20.0).abs() < 5.0 && (pings.1 - 60.0).abs() < 5.0, "{pings:?}");

    // RTT: each link near its own path's ping (within 25%), so not the other's.
    for (name, iface, ping) in [("near", "lpn1", pings.0), ("far", "lpn2", pings.1)] {
        let l = link(&st, name);
        let rtt = l["signals"]["rtt_ms"].as_f64();
        let row = peer_row(&st, iface, "dc")["srtt_ms"].as_f64();
        for (what, v) in [("link RTT", rtt), ("dc on its interface", row)] {
            assert!(
                v.is_some_and(|v| (v - ping).abs() <= 0.25 * ping),
                "{name}: {what} {v:?} ms, ping on its path {ping:.1} ms\n{st}"
            );
        }
    }
    assert_eq!(link(&st, "near")["state"], "healthy", "{st}");
    assert_eq!(
        (link(&st, "near")["knobs"]["dscp"].as_u64(), link(&st, "far")["knobs"]["dscp"].as_u64()),
        (Some(10), Some(46)),
        "{st}"
    );

    // DSCP: each interface's traffic carries its own link's class.
    assert_eq!(dropped, [0, 0], "tcpdump dropped packets");
    assert!(count(0, 10) > 100 && count(0, 10) == dscp[0].len(), "near: only DSCP 10");
    assert!(count(1, 46) > 100, "far: DSCP 46 once slow");
    let first_46 = dscp[1].iter().position(|&x| x == 46).unwrap_or(0);
    assert!(
        dscp[1][..first_46].iter().all(|&x| x == 10)
            && dscp[1][first_46..].iter().all(|&x| x == 46),
        "far: DSCP 10 while healthy, then 46: {:?}",
        dscp[1]
    );
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Both links name the same peer ("dc", same prefix, same address behind each interface).
#[test]
fn two_links_sharing_a_peer_get_their_own_rtt_and_dscp() {
    two_links("s", SHARED_PEER);
}

/// The near link names no peer (everything on lpn1): its rule must not mark the far link's
/// traffic, nor hide the far link's rule.
#[test]
fn a_link_without_peers_hides_no_other_links_dscp() {
    two_links("n", "");
}
