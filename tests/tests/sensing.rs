//! Sensing on the WAN lab: what linkpilot counts per peer against what the lab did and what
//! tshark saw.

use std::{process::Stdio, thread, time::Duration};

use linkpilot_lab::{
    lab::{Host, Lab, Site},
    scenario::Direction,
    selftest,
};
use linkpilot_tests::daemon::{ecn_lab, iperf3_client, iperf3_server, lab_with};
use linkpilot_tests::watcher::{peer, Watcher};
use nix::sys::signal::Signal;

#[test]
fn ce_marks_per_peer_equal_the_labs_count() {
    let (lab, hk, us) = ecn_lab("sce", "10ms");
    // Watch the receiving host's NIC, with the sending site as a named peer.
    let watcher = Watcher::start_in(&us.netns, &["eth0"], &["--peer", "hk=198.18.1.0/24"]);
    let mut server = iperf3_server(&us);
    hk.exec(&["iperf3", "-c", &us.ipv4.to_string(), "-t", "4"]).expect("iperf3 -c");
    server.wait().expect("iperf3 server");
    thread::sleep(Duration::from_millis(300));
    let lab_ce = lab.stats(Direction::HkToUs).ce_marked;
    let last = watcher.stop_with(Signal::SIGINT);
    let s = last.iter().find(|s| s.iface == "eth0").expect("eth0 sample");
    let hk_peer = peer(s, "hk");
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
    assert_eq!(peer(s, "other").rx.ce, 0, "only the HK site's traffic crossed the marking queue");
}

#[test]
fn dscp_rewrite_seen_by_tshark_with_ecn_intact_and_valid_checksums() {
    let (lab, hk, us) = ecn_lab("sdscp", "10ms");
    // Rewrite everything the HK host sends to the US site to DSCP 46 (EF).
    let watcher =
        Watcher::start_in(&hk.netns, &["eth0"], &["--peer", "us=198.18.2.0/24", "--dscp", "us=46"]);
    let pcap = std::env::temp_dir().join(format!("lp-dscp-{}.pcap", std::process::id()));
    let pcap_s = pcap.display().to_string();
    let dump = selftest::start_capture(&us, &format!("src host {} and tcp", hk.ipv4), &pcap_s)
        .expect("tcpdump");
    // The sender's own capture, after the rewrite: it sees every transmission, so it tells new
    // data from retransmissions exactly.
    let sent_pcap = format!("{pcap_s}.sent");
    let sent_dump =
        selftest::start_capture(&hk, &format!("dst host {} and tcp", us.ipv4), &sent_pcap)
            .expect("tcpdump");
    let mut server = iperf3_server(&us);
    hk.exec(&["iperf3", "-c", &us.ipv4.to_string(), "-t", "3"]).expect("iperf3 -c");
    server.wait().expect("iperf3 server");
    thread::sleep(Duration::from_millis(300));
    let dropped = selftest::stop_capture(dump).expect("stop tcpdump")
        + selftest::stop_capture(sent_dump).expect("stop tcpdump");
    let lab_ce = lab.stats(Direction::HkToUs).ce_marked;
    let last = watcher.stop_with(Signal::SIGINT);
    let segments = linkpilot_tests::oracle::segments(&pcap_s);
    let sent = linkpilot_tests::oracle::segments(&sent_pcap);
    let _ = std::fs::remove_file(&pcap);
    let _ = std::fs::remove_file(&sent_pcap);
    assert_eq!(dropped, 0, "tcpdump dropped packets");
    assert!(segments.len() > 1000, "too few packets captured: {}", segments.len());
    let not_46: Vec<_> = segments.iter().filter(|s| s.dscp != 46).collect();
    assert!(
        not_46.is_empty(),
        "{} of {} packets left without DSCP 46: {:?}",
        not_46.len(),
        segments.len(),
        &not_46[..not_46.len().min(5)]
    );
    assert!(segments.iter().all(|s| s.checksum_good), "a bad or unverified IPv4 checksum");
    // ECN kept by the rewrite: new data leaves ECT(0) (and arrives ECT(0) or, where the lab
    // marked it, CE: the count below).
    linkpilot_tests::oracle::new_data_is_ect0(&sent).unwrap();
    assert!(sent.iter().all(|s| s.dscp == 46 && s.checksum_good), "the sender's view differs");
    assert_eq!(
        segments.iter().filter(|s| s.ecn == 3).count() as u64,
        lab_ce,
        "CE marks made by the lab, seen by tshark"
    );
    let s = last.iter().find(|s| s.iface == "eth0").expect("sample");
    assert_eq!(
        peer(s, "us").tx_dscp.keys().copied().collect::<Vec<_>>(),
        vec![46],
        "{:?}",
        peer(s, "us").tx_dscp
    );
    assert!(s.totals.tx_dscp_rewritten > 0);
}

/// `rtt:180.5/0.3` of the connection to `dst`:5201 carrying data, from `ss -tin`.
fn ss_rtt_ms(netns: &str, dst: &str) -> f64 {
    let out = linkpilot_tests::sh(&[
        "ip",
        "netns",
        "exec",
        netns,
        "ss",
        "-tin",
        "dst",
        &format!("{dst}:5201"),
    ]);
    out.split_whitespace()
        .filter_map(|w| w.strip_prefix("rtt:"))
        .filter_map(|v| v.split('/').next()?.parse::<f64>().ok())
        .fold(0.0, f64::max)
}

/// A lab of 180 ms RTT without jitter at 200 Mbit/s (a 10 Mbit/s paced sender never builds a
/// queue), its hosts, and `linkpilot watch` on HK's eth0 with peer "us" and `output`.
fn calm_lab_watched(name: &str, output: &str) -> (Lab, Host, Host, Watcher) {
    let lab = lab_with(name, "delay = \"90ms\"\nrate = \"200Mbit/s\"\nqueue = \"5MiB\"");
    let (hk, us) = lab.hk_us();
    let watcher = Watcher::start_in(&hk.netns, &["eth0"], &["--peer", "us=198.18.2.0/24", output]);
    (lab, hk, us, watcher)
}

#[test]
fn flow_rtt_matches_the_lab_and_ss() {
    let (_lab, hk, us, watcher) = calm_lab_watched("srtt", "--flows");
    let mut server = iperf3_server(&us);
    let mut client = iperf3_client(&hk, &us, &["-b", "10M", "-t", "6"]);
    thread::sleep(Duration::from_secs(4));
    let ss = ss_rtt_ms(&hk.netns, &us.ipv4.to_string());
    thread::sleep(Duration::from_millis(1100)); // one more sample while the flow is busy
    let last = watcher.stop_with(Signal::SIGINT);
    client.wait().expect("iperf3 client");
    server.wait().expect("iperf3 server");
    let s = last.iter().find(|s| s.iface == "eth0").expect("sample");
    let flows = s.flows.as_ref().expect("--flows");
    let data = flows.iter().max_by_key(|f| f.rtt_samples).expect("a flow with RTT samples");
    eprintln!("ss rtt {ss} ms; linkpilot {data:?}; peer {:?}", peer(s, "us").rtt);
    assert_eq!(data.remote.to_string(), "198.18.2.10:5201", "{data:?}");
    let within = |a: f64, b: f64| (a - b).abs() <= 0.05 * b;
    assert!(within(data.srtt_ms, 180.0), "flow srtt {} vs the lab's 180 ms", data.srtt_ms);
    assert!(ss > 0.0 && within(data.srtt_ms, ss), "flow srtt {} vs ss -ti {ss}", data.srtt_ms);
    let rtt = peer(s, "us").rtt;
    assert!(rtt.samples > 100 && within(rtt.sum_ms / rtt.samples as f64, 180.0), "{rtt:?}");
}

#[test]
fn retransmissions_per_peer_equal_nstat_under_loss() {
    let lab = lab_with("sret", "delay = \"20ms\"\nrate = \"200Mbit/s\"\nqueue = \"5MiB\"\n[phase.hk_to_us]\nloss = { model = \"bernoulli\", rate = \"1%\" }");
    let (hk, us) = lab.hk_us();
    let watcher = Watcher::start_in(&hk.netns, &["eth0"], &["--peer", "us=198.18.2.0/24"]);
    let names = ["TcpRetransSegs", "TcpExtTCPRetransFail"];
    // The kernel's own record of every retransmission event and its count of our program's
    // runs: on a mismatch they tell an event the program never ran for (the tracepoint's perf
    // layer drops some without counting a skip) from one it ran for and mis-counted, and both
    // from one nstat counted without a tracepoint.
    let stats = linkpilot_tests::oracle::BpfStats::enable();
    let runs_before = linkpilot_tests::oracle::run_count("lp_tcp_retrans");
    let trace = linkpilot_tests::oracle::KernelTrace::start(
        "lp_sret",
        &["tcp/tcp_retransmit_skb", "tcp/tcp_retransmit_synack"],
    );
    let before = linkpilot_tests::oracle::nstat_in(&hk.netns, &names);
    let mut server = iperf3_server(&us);
    hk.exec(&["iperf3", "-c", &us.ipv4.to_string(), "-b", "50M", "-t", "4"]).expect("iperf3 -c");
    server.wait().expect("iperf3 server");
    thread::sleep(Duration::from_millis(500));
    let after = linkpilot_tests::oracle::nstat_in(&hk.netns, &names);
    // The trace first, the run count after: an event between the two reads can only add a
    // run, never a traced event the program seems not to have run for.
    let events = trace.lines();
    drop(trace);
    let missed = linkpilot_tests::oracle::recursion_misses("lp_tcp_retrans");
    let runs = linkpilot_tests::oracle::run_count("lp_tcp_retrans") - runs_before;
    drop(stats);
    let last = watcher.stop_with(Signal::SIGINT);
    let s = last.iter().find(|s| s.iface == "eth0").expect("sample");
    let (segs, failed) = (after[0] - before[0], after[1] - before[1]);
    let seen = peer(s, "us").retrans_segs;
    eprintln!(
        "nstat TcpRetransSegs {segs} (failed {failed}); linkpilot peer us {seen} (failed {}); \
         the kernel skipped the program {missed} time(s)",
        s.totals.retrans_failed
    );
    let to_us = |l: &&String| l.contains(&format!("daddr={}", us.ipv4));
    // Every tcp_retransmit_skb event on the machine, of any namespace, runs the program once.
    let all = events.iter().filter(|l| l.contains("tcp_retransmit_skb")).count() as u64;
    let fired = events.iter().filter(to_us).filter(|l| l.contains("tcp_retransmit_skb")).count();
    let ok = events.iter().filter(to_us).filter(|l| l.ends_with(" err=0")).count();
    let synack = events.iter().filter(|l| l.contains("tcp_retransmit_synack")).count();
    let kernel = format!(
        "the kernel's trace: {fired} tcp_retransmit_skb events to us ({ok} with err=0), \
         {all} in all, {synack} tcp_retransmit_synack; the program ran {runs} time(s); \
         events that are not err=0:\n{}",
        events
            .iter()
            .filter(to_us)
            .filter(|l| !l.ends_with(" err=0"))
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!("{kernel}");
    assert!(segs > 10, "1% loss caused too few retransmissions: {segs}");
    assert_eq!(s.totals.retrans_segs, seen);
    // Runs the kernel never made: skipped ones it counts (another BPF program on that CPU),
    // and ones the tracepoint's perf layer drops without counting (its per-CPU recursion
    // guard), which only the run count beside the trace shows.
    let not_run = missed + all.saturating_sub(runs);
    if not_run == 0 {
        assert_eq!(seen, segs - failed, "{kernel}");
    } else {
        // Runs the kernel skipped (another BPF program on that CPU) are retransmissions the
        // program never saw: fewer, never more (the kernel's count covers every namespace).
        assert!(seen <= segs - failed, "{seen} seen, {segs} - {failed}, {not_run} not run");
    }
}

#[test]
fn snapshots_carry_rtt_percentiles_and_rates() {
    let (_lab, hk, us, watcher) = calm_lab_watched("ssnap", "--snapshots");
    let mut server = iperf3_server(&us);
    hk.exec(&["iperf3", "-c", &us.ipv4.to_string(), "-b", "10M", "-t", "4"]).expect("iperf3 -c");
    server.wait().expect("iperf3 server");
    let (lines, log) = watcher.stop_lines(Signal::SIGINT);
    let snaps: Vec<linkpilot::sense::sensors::Snapshot> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad snapshot {l}: {e}\n{log}")))
        .collect();
    let us: Vec<_> = snaps.iter().flat_map(|s| &s.peers).filter(|p| p.peer == "us").collect();
    let busy = us
        .iter()
        .max_by_key(|p| p.rtt.samples)
        .unwrap_or_else(|| panic!("no snapshot for peer us: {lines:?}"));
    eprintln!("{busy:?}");
    let within = |a: Option<f64>| a.is_some_and(|v| (v - 180.0).abs() <= 9.0);
    assert!(
        within(busy.rtt.p50_ms) && within(busy.rtt.p99_ms) && within(busy.rtt.min_ms),
        "{:?}",
        busy.rtt
    );
    assert!(busy.flows >= 1, "{busy:?}");
    // iperf3 sent 4 s at 10 Mbit/s: the rates times their intervals add up to that, plus
    // headers (~4%).
    let bits: f64 = snaps
        .iter()
        .flat_map(|s| {
            s.peers.iter().filter(|p| p.peer == "us").map(|p| p.tx_bps * s.interval_ms as f64 / 1e3)
        })
        .sum();
    assert!((38e6..48e6).contains(&bits), "bits sent to us: {bits}");
}

#[test]
fn flow_opens_and_closes_equal_nstat() {
    let lab = lab_with("sflow", "delay = \"5ms\"\nrate = \"200Mbit/s\"\nqueue = \"5MiB\"");
    let (hk, us) = lab.hk_us();
    let watcher = Watcher::start_in(
        &hk.netns,
        &["eth0"],
        &["--peer", "us=198.18.2.0/24", "--peer", "us=2001:db8:2::/64", "--flows"],
    );
    let names = ["TcpActiveOpens", "TcpPassiveOpens", "TcpAttemptFails"];
    let before = linkpilot_tests::oracle::nstat_in(&hk.netns, &names);
    // Active opens: iperf3's control connection plus 3 streams, over IPv4 and over IPv6.
    for dst in [us.ipv4.to_string(), us.ipv6.to_string()] {
        let mut server =
            us.command("iperf3").args(["-s", "-1"]).stdout(Stdio::null()).spawn().expect("iperf3");
        thread::sleep(Duration::from_millis(300));
        hk.exec(&["iperf3", "-c", &dst, "-P", "3", "-t", "1"]).expect("iperf3 -c");
        server.wait().expect("iperf3 server");
    }
    // Passive opens: us connects to a server on hk.
    let mut server =
        hk.command("iperf3").args(["-s", "-1"]).stdout(Stdio::null()).spawn().expect("iperf3");
    thread::sleep(Duration::from_millis(300));
    us.exec(&["iperf3", "-c", &hk.ipv4.to_string(), "-P", "2", "-t", "1"]).expect("iperf3 -c");
    server.wait().expect("iperf3 server");
    // A refused connection (nothing listens on port 9): SYN_SENT -> CLOSE.
    let refused = hk.exec(&["iperf3", "-c", &us.ipv4.to_string(), "-p", "9", "-t", "1"]);
    assert!(refused.is_err(), "port 9 accepted a connection");
    thread::sleep(Duration::from_millis(500)); // the last FIN/ACK exchanges (10 ms RTT)
    let after = linkpilot_tests::oracle::nstat_in(&hk.netns, &names);
    let last = watcher.stop_with(Signal::SIGINT);
    let s = last.iter().find(|s| s.iface == "eth0").expect("sample");
    let f = peer(s, "us").flows;
    let d: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    eprintln!("nstat {names:?} deltas {d:?}; linkpilot {f:?}");
    assert_eq!(d[2], 1, "the refused connection is one TcpAttemptFails");
    assert_eq!(f.failed_opens, d[2], "failed opens vs TcpAttemptFails");
    assert_eq!(f.active_opens, d[0] - d[2], "active opens vs TcpActiveOpens - TcpAttemptFails");
    assert_eq!(f.passive_opens, d[1], "passive opens vs TcpPassiveOpens");
    assert_eq!((f.active_opens, f.passive_opens), (8, 3));
    // Nothing left established, as ss sees it (nstat prints no TcpCurrEstab gauge).
    let open = hk.exec(&["ss", "-Htn", "state", "established"]).expect("ss");
    assert!(open.trim().is_empty(), "connections still established:\n{open}");
    assert_eq!(f.closes, f.active_opens + f.passive_opens, "every connection closed");
    let flows = s.flows.as_ref().expect("--flows");
    assert!(flows.is_empty(), "closed flows left the table: {flows:?}");
}

#[test]
fn nic_counters_join_the_snapshot_of_their_link() {
    // The ConnectX fixture, its first port's netdev renamed to the lab host's eth0.
    let root = std::env::temp_dir().join(format!("lp-sysfs-{}", std::process::id()));
    let port = linkpilot_tests::rdma::sysfs_on(&root, "eth0");
    let cnp = port.join("hw_counters/rp_cnp_handled");
    let lab = lab_with("snic", "delay = \"5ms\"");
    let hk = lab.host(Site::Hk, 0).clone();
    let rdma_root = root.to_str().expect("utf-8");
    let watcher =
        Watcher::start_in(&hk.netns, &["eth0"], &["--snapshots", "--rdma-root", rdma_root]);
    thread::sleep(Duration::from_millis(1500));
    std::fs::write(&cnp, "6121\n").expect("bump"); // +1000 CNPs handled
    thread::sleep(Duration::from_millis(2500));
    let (lines, log) = watcher.stop_lines(Signal::SIGINT);
    let _ = std::fs::remove_dir_all(&root);
    let snaps: Vec<linkpilot::sense::sensors::Snapshot> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad snapshot {l}: {e}\n{log}")))
        .collect();
    let links: Vec<_> = snaps.iter().flat_map(|s| s.links.iter().map(move |l| (s, l))).collect();
    assert!(links.len() >= 3, "{lines:?}");
    assert!(links.iter().all(|(_, l)| l.link == "eth0" && l.rdma_ports == ["mlx5_0/1 ACTIVE"]));
    let handled: f64 =
        links.iter().map(|(s, l)| l.cnp_handled_per_s * s.interval_ms as f64 / 1e3).sum();
    assert!((handled - 1000.0).abs() < 1.0, "CNPs handled over the run: {handled}\n{lines:?}");
    assert!(links.iter().all(|(_, l)| l.retrans_events_per_s == 0.0));
}
