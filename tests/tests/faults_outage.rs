//! The lab's outage (`outage.toml`: a phase with the link down both ways) under iperf3, the daemon
//! on the HK host: it keeps deciding through the outage, what it reads follows the link (nothing
//! arrives while it is down, by the lab's own delivery counter; iperf3's rate after), it enters its dead-link state (`unanswered`),
//! and it recovers after; the namespace is left as it was.

use linkpilot_tests::policy::PolicyToml;
use std::time::Duration;

use linkpilot_lab::{
    lab::LabConfig,
    scenario::{Direction, Scenario},
};
use linkpilot_tests::{
    daemon::{status_json, Daemon},
    faults::{self, HostBefore},
};

/// The shipped scenario: 20 s up (90 ms, 200 Mbit/s), 3 s down, 20 s up; the first phase made
/// 45 s, since loading the programs on a loaded 2-core machine took up to 20 s, and the outage
/// 6 s, since the dead-link state comes only after TCP's first retransmission timeout, 500 ms
/// unanswered and the policy's `enter_after` (about 2 s in, two runs).
const SCENARIO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../lab/scenarios/outage.toml");
const DOWN: (f64, f64) = (45.0, 51.0);

/// A calm state and one entered when the link has retransmitted and heard nothing for 500 ms:
/// the first RTO comes about 0.4 s into the outage, so the state is entered about 1 s in.
fn policy(us: &str) -> String {
    PolicyToml::new()
        .table("[host]\ntcp_ecn = 1")
        .hysteresis("2s", "500ms")
        .link("wan", "eth0", "20Mbit/s", Some(("us", &format!("{us}/32"))))
        .healthy()
        .state("stalled", "unanswered = \"500ms\"", "unanswered = \"200ms\"", ("int8", 10, 42))
        .build()
}

/// The daemon's (tx, rx) bit/s for the peer `us` in one status.
fn peer_bps(st: &serde_json::Value) -> (f64, f64) {
    let peer = st["peers"].as_array().and_then(|p| p.iter().find(|p| p["peer"] == "us").cloned());
    let read = |k: &str| peer.as_ref().and_then(|p| p[k].as_f64()).unwrap_or(0.0);
    (read("tx_bps"), read("rx_bps"))
}

/// One reading of the test's 100 ms clock.
struct Sample {
    at: f64,
    ticks: u64,
    state: String,
    tx_bps: f64,
    rx_bps: f64,
    /// Packets the lab delivered from US to HK so far (its own counter, the oracle).
    lab_delivered_to_hk: u64,
}

#[test]
fn through_the_lab_outage_the_daemon_decides_on_and_recovers_after() {
    let text = std::fs::read_to_string(SCENARIO).expect("outage.toml");
    let text = text.replacen("duration = \"20s\"", "duration = \"45s\"", 1);
    let text = text.replacen("duration = \"3s\"", "duration = \"6s\"", 1);
    let scenario = Scenario::parse(&text, SCENARIO, None).expect("scenario");
    let lab = linkpilot_lab::lab::Lab::start(
        LabConfig { name: "ftout".into(), ..LabConfig::default() },
        scenario,
    )
    .expect("lab");
    let (hk, us) = lab.hk_us();
    let dir = faults::temp_dir("outage");
    let mut host = HostBefore::read(&hk.netns);
    let mut d = Daemon::start(&hk.netns, &dir, &policy(&us.ipv4.to_string()));
    d.wait_up();
    host.assert_one_set_attached(d.child.id());
    let mut server = linkpilot_tests::daemon::iperf3_server(&us);
    let mut client = hk
        .command("iperf3")
        .args(["-c", &us.ipv4.to_string(), "-t", "120", "-b", "10M"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("iperf3 -c");
    let mut samples = Vec::new();
    let ready = lab.elapsed().as_secs_f64();
    assert!(ready < DOWN.0 - 5.0, "daemon and iperf3 up only {ready:.1} s into the scenario");
    while lab.elapsed().as_secs_f64() < DOWN.1 + 14.0 {
        let at = lab.elapsed().as_secs_f64();
        let lab_delivered_to_hk = lab.stats(Direction::UsToHk).packets_out;
        let st = status_json(&dir);
        let (tx_bps, rx_bps) = peer_bps(&st);
        samples.push(Sample {
            at,
            ticks: st["ticks"].as_u64().unwrap_or(0),
            state: st["links"][0]["state"].as_str().unwrap_or_default().to_owned(),
            tx_bps,
            rx_bps,
            lab_delivered_to_hk,
        });
        std::thread::sleep(Duration::from_millis(100));
    }
    let phase = |from: f64, to: f64| samples.iter().filter(move |s| s.at >= from && s.at < to);
    // A tick reads rates over the tick before: the first second down is left out. What HK sends
    // is no oracle here: a sender whose window has room keeps sending new data into a dead link
    // until it fills (how long depends on the kernel's window growth); what arrives is.
    let down: Vec<&Sample> = phase(DOWN.0 + 1.0, DOWN.1).collect();
    let (first, last) = (down[0], *down.last().expect("samples"));
    let ticks_down = last.ticks - first.ticks;
    let lab_delivered_down = last.lab_delivered_to_hk - first.lab_delivered_to_hk;
    let states_down: Vec<&str> = down.iter().map(|s| s.state.as_str()).collect();
    let max_rx_down = down.iter().map(|s| s.rx_bps).fold(0.0, f64::max);
    let max_tx_down = down.iter().map(|s| s.tx_bps).fold(0.0, f64::max);
    let before_tx = phase(DOWN.0 - 3.0, DOWN.0).map(|s| s.tx_bps).fold(0.0, f64::max);
    let back = phase(DOWN.1, DOWN.1 + 14.0).find(|s| s.tx_bps > 5e6).map(|s| s.at - DOWN.1);
    let end_state = samples.last().expect("samples").state.clone();
    let states_before: Vec<&str> = phase(DOWN.0 - 3.0, DOWN.0).map(|s| s.state.as_str()).collect();
    eprintln!(
        "outage: {ticks_down} ticks in the last 5 s down; tx before {before_tx:.0} bit/s, at most \
         {max_tx_down:.0} down; rx at most {max_rx_down:.0} bit/s down, the lab delivered \
         {lab_delivered_down} packets to HK; states down {states_down:?}; traffic back after \
         {back:?} s; state at the end {end_state}"
    );
    for c in [&mut client, &mut server] {
        let _ = c.kill();
        let _ = c.wait();
    }
    assert!(ticks_down >= 35, "{ticks_down} ticks in 5 s of outage");
    assert!(before_tx > 5e6, "iperf3 read before the outage: {before_tx}");
    assert_eq!(lab_delivered_down, 0, "the lab delivers nothing while down");
    assert_eq!(max_rx_down, 0.0, "the daemon reads nothing arriving over a dead link");
    assert!(back.is_some(), "traffic read again after the outage");
    assert!(states_before.iter().all(|s| *s == "healthy"), "before the outage: {states_before:?}");
    assert!(states_down.contains(&"stalled"), "a dead link is entered as such: {states_down:?}");
    assert_eq!(end_state, "healthy", "after the outage");
    assert_eq!(status_json(&dir)["sensing_errors"], 0);
    host.stop_and_assert_unchanged(&mut d);
    let _ = std::fs::remove_dir_all(&dir);
}
