//! `capacity = "auto"` on the lab's 300 Mbit/s, 180 ms link with an 8 MiB queue, a daemon on
//! each side (the sender's wmem and the receiver's rmem both bound a flow), one iperf3 flow
//! across: the sender's buffers the daemon sets (`sysctl -n`) grow from the bounds' minimum
//! while the rate follows and stay within a few bandwidth-delay products, and iperf3 reaches the
//! link's rate. (The receiver's rmem stays at least the host's own maximum, 32 MiB on recent
//! kernels: the daemon never lowers a host's buffers.) The same link declared at the reference line's nominal 40 Gbit/s takes the buffers to
//! the 1 GiB bound, which is what overran this queue.

use linkpilot_tests::policy::PolicyToml;
use std::process::Stdio;

use linkpilot_lab::lab::Host;
use linkpilot_tests::{
    daemon::{iperf3_server, lab_with, Daemon},
    faults::stop,
};

const RATE: f64 = 300e6;
const RTT_S: f64 = 0.18;

/// `capacity` as the policy writes it ("40Gbit/s"), or "" for none: measured.
fn policy(capacity: &str, peer: &str, cidr: &str) -> String {
    PolicyToml::new()
        .table("[hysteresis]\nmin_dwell = \"1s\"")
        .link("wan", "eth0", capacity, Some((peer, cidr)))
        .state("healthy", "", "", ("none", 0, 106))
        .build()
}

/// The largest buffer a TCP socket may grow to (the third field of tcp_wmem or tcp_rmem).
fn tcp_max(host: &Host, sysctl: &str) -> u64 {
    let v = host.exec(&["sysctl", "-n", sysctl]).expect("sysctl -n");
    v.split_whitespace().nth(2).and_then(|m| m.parse().ok()).expect("three fields")
}

/// Daemons on both sides with `capacity` in their policies.
fn daemons(hk: &Host, us: &Host, capacity: &str, tag: &str) -> (Daemon, Daemon) {
    let dir = |site: &str| {
        let d =
            std::env::temp_dir().join(format!("lp-capauto-{tag}-{site}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    };
    let a = Daemon::start(&hk.netns, &dir("hk"), &policy(capacity, "us", "198.18.2.0/24"));
    let b = Daemon::start(&us.netns, &dir("us"), &policy(capacity, "hk", "198.18.1.0/24"));
    (a, b)
}

/// iperf3 from HK to US for `secs`: its received bits per second, per 1 s interval.
fn iperf3(hk: &Host, us: &Host, secs: u32) -> Vec<f64> {
    let mut server = iperf3_server(us);
    let out = hk
        .command("iperf3")
        .args(["-c", &us.ipv4.to_string(), "-C", "cubic", "-J", "-t", &secs.to_string()])
        .stderr(Stdio::inherit())
        .output()
        .expect("iperf3 -c");
    let _ = server.kill(); // served its one test (-1) already, unless the client failed
    let _ = server.wait();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("iperf3 -J");
    report["intervals"]
        .as_array()
        .expect("intervals")
        .iter()
        .map(|i| i["sum"]["bits_per_second"].as_f64().expect("bits_per_second"))
        .collect()
}

#[test]
fn auto_capacity_fills_the_link_without_overrunning_its_queue() {
    let lab = lab_with("fcapauto", "delay = \"90ms\"\nrate = \"300Mbit/s\"\nqueue = \"8MiB\"");
    let (hk, us) = lab.hk_us();
    let bdp = RATE / 8.0 * RTT_S;

    // Declared at 40 Gbit/s: the bound, once an RTT was measured.
    let (mut a, mut b) = daemons(&hk, &us, "40Gbit/s", "nominal");
    iperf3(&hk, &us, 15);
    assert_eq!(tcp_max(&hk, "net.ipv4.tcp_wmem"), 1 << 30);
    stop(&mut a); // the originals back
    stop(&mut b);

    let (mut a, mut b) = daemons(&hk, &us, "", "auto");
    let started = tcp_max(&hk, "net.ipv4.tcp_wmem");
    let rates = iperf3(&hk, &us, 90);
    let (send, recv) = (tcp_max(&hk, "net.ipv4.tcp_wmem"), tcp_max(&us, "net.ipv4.tcp_rmem"));
    let late = &rates[rates.len() - 20..];
    let late_mean = late.iter().sum::<f64>() / late.len() as f64;
    eprintln!(
        "auto: wmem max {started} at the start, {send} (HK) and rmem max {recv} (US) after 90 s \
         (BDP {bdp:.0}); iperf3 {:.0} Mbit/s over the last 20 s; per second: {:?}",
        late_mean / 1e6,
        rates.iter().map(|r| (r / 1e6).round()).collect::<Vec<_>>()
    );
    assert_eq!(started, 4 << 20, "the bounds' minimum before anything was measured");
    for (what, v) in [("HK wmem", send), ("US rmem", recv)] {
        assert!(v as f64 >= 2.0 * bdp && v as f64 <= 8.0 * bdp, "{what} {v}, BDP {bdp:.0}");
    }
    assert!(late_mean >= 0.8 * RATE, "iperf3 {late_mean:.0} bit/s");
    let decisions =
        |d: &Daemon| std::fs::read_to_string(d.dir.join("decisions.jsonl")).expect("decision log");
    let log = decisions(&a) + &decisions(&b);
    assert!(log.contains("probing") && log.contains("measured"), "{log}");
    stop(&mut a);
    stop(&mut b);
}
