//! Sensing on the WAN lab: what linkpilot counts per peer against what the lab did and what
//! tshark saw.

use std::{thread, time::Duration};

use linkpilot_lab::{
    lab::{Lab, LabConfig, Site},
    scenario::{Direction, Scenario},
};
use linkpilot_tests::watcher::Watcher;
use nix::sys::signal::Signal;

fn ecn_lab(name: &str) -> Lab {
    let toml = "name = \"ecn\"\n[[phase]]\nname = \"only\"\nduration = \"10min\"\n[phase.link]\n\
                delay = \"10ms\"\nrate = \"50Mbit/s\"\nqueue = \"2MiB\"\n\
                ecn = { mode = \"step\", threshold = \"5ms\" }\n";
    let scenario = Scenario::parse(toml, "<test>", None).expect("scenario");
    Lab::start(LabConfig { name: name.into(), ..LabConfig::default() }, scenario).expect("lab")
}

#[test]
fn ce_marks_per_peer_equal_the_labs_count() {
    let lab = ecn_lab("sce");
    let (hk, us) = (lab.host(Site::Hk, 0).clone(), lab.host(Site::Us, 0).clone());
    for h in [&hk, &us] {
        h.exec(&["sysctl", "-qw", "net.ipv4.tcp_ecn=1"]).expect("sysctl");
    }
    // Watch the receiving host's NIC, with the sending site as a named peer.
    let watcher = Watcher::start_in(&us.netns, &["eth0"], &["--peer", "hk=198.18.1.0/24"]);
    let mut server = us
        .command("iperf3")
        .args(["-s", "-1", "-B", &us.ipv4.to_string()])
        .spawn()
        .expect("iperf3 -s");
    thread::sleep(Duration::from_millis(300));
    hk.exec(&["iperf3", "-c", &us.ipv4.to_string(), "-t", "4"]).expect("iperf3 -c");
    server.wait().expect("iperf3 server");
    thread::sleep(Duration::from_millis(300));
    let lab_ce = lab.stats(Direction::HkToUs).ce_marked;
    let last = watcher.stop_with(Signal::SIGINT);
    let s = last.iter().find(|s| s.iface == "eth0").expect("eth0 sample");
    let hk_peer = s.peer("hk");
    eprintln!("lab CE {lab_ce}; linkpilot hk rx {:?} tx {:?}", hk_peer.rx, hk_peer.tx);
    assert!(lab_ce > 100, "the queue never reached the marking threshold: {lab_ce}");
    assert_eq!(hk_peer.rx.ce, lab_ce, "CE segments received from hk vs the lab's CE counter");
    // The receiver echoes congestion (ECE on its ACKs), the sender answers (CWR).
    assert!(hk_peer.tx.tcp_ece > 0, "{:?}", hk_peer.tx);
    assert!(hk_peer.rx.tcp_cwr > 0, "{:?}", hk_peer.rx);
    let r = hk_peer.rx;
    assert!(r.ect0 > 0, "data is sent ECT(0): {r:?}");
    assert_eq!(
        r.not_ect + r.ect1 + r.ect0 + r.ce,
        r.packets,
        "every segment has one codepoint: {r:?}"
    );
    assert_eq!(s.peer("other").rx.ce, 0, "only the HK site's traffic crossed the marking queue");
}
