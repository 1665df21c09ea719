//! The closed loop's timing on the WAN lab, judged by the lab's own clock and counters: how soon
//! the knob board follows the first CE mark, that it returns only after the exit window, and
//! that the timeouts cover a delay spike while the spike is still on.

use std::sync::LazyLock;

use linkpilot_tests::policy::PolicyToml;
use std::{
    thread,
    time::{Duration, Instant},
};

use linkpilot::board::{name, BoardReader};
use linkpilot_common::board::compression;
use linkpilot_lab::{
    lab::{Lab, LabConfig},
    scenario::{Direction, Scenario},
};
use linkpilot_tests::daemon::{ecn_lab, iperf3_client, iperf3_server, wait_for, Daemon};

static ECN_POLICY: LazyLock<String> = LazyLock::new(|| {
    PolicyToml::new()
        .hysteresis("3s", "1s")
        .lab_link("50Mbit/s")
        .healthy()
        .congested_on_ce(26, 106)
        .build()
});

#[test]
fn congested_within_a_second_of_the_first_ce_mark_and_healthy_only_after_the_exit_window() {
    let (lab, hk, us) = ecn_lab("ctlecn", "10ms");
    let dir = linkpilot_tests::temp_dir("ctl-ecn");
    let mut d = Daemon::start_with(&hk.netns, &dir, &ECN_POLICY, &["--metrics-addr", "off"]);
    d.wait_up();
    let board = d.first_decision();
    let state = || board.read().map(|b| name(&b.links[0].state)).unwrap_or_default();
    assert_eq!(state(), "healthy");

    let mut server = iperf3_server(&us);
    let mut client = iperf3_client(&hk, &us, &["-C", "cubic", "-t", "5"]);
    // The lab's counter says when marking started; the board says when the daemon followed.
    let ce = || lab.stats(Direction::HkToUs).ce_marked;
    let start = Instant::now();
    let mut first_mark = None;
    let congested = loop {
        let now = Instant::now();
        if first_mark.is_none() && ce() > 0 {
            first_mark = Some(now);
        }
        if state() == "congested" {
            break now;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "never congested; lab CE {}", ce());
        thread::sleep(Duration::from_millis(10));
    };
    let first_mark = first_mark.expect("the lab marked before the board changed");
    let lag = congested.duration_since(first_mark);
    eprintln!("congested {lag:?} after the lab's first CE mark");
    assert!(lag < Duration::from_secs(1), "congested {lag:?} after the first CE mark");
    let b = board.read().expect("read");
    assert_eq!(b.links[0].compression, compression::INT8);

    client.wait().expect("iperf3 client");
    let stopped = Instant::now();
    server.wait().expect("iperf3 server");
    let marks = ce();
    // Back to healthy only after the 3 s exit window, which starts once the CE EWMA (500 ms
    // half-life) is under 0.2%.
    wait_for("healthy again", Duration::from_secs(12), || state() == "healthy");
    let back = stopped.elapsed();
    assert_eq!(ce(), marks, "no marks after the sender stopped");
    eprintln!("healthy {back:?} after the sender stopped");
    assert!(back >= Duration::from_secs(3), "healthy after {back:?}, inside the exit window");
    let decisions = std::fs::read_to_string(dir.join("decisions.jsonl")).expect("decisions");
    let last = decisions.lines().last().expect("a decision");
    assert!(
        last.contains("\"state\":\"healthy\"") && last.contains("congested cleared for 3."),
        "{last}"
    );
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

static SPIKE_POLICY: LazyLock<String> = LazyLock::new(|| {
    PolicyToml::new()
        .table("[estimator]\nwindow = \"10s\"")
        .table(
            "[bounds]\nnccl_ib_timeout = { k = 4.0, min = 10, max = 24 }\nwatchdog = { min = \"30s\", \
             max = \"60min\", rtt_multiple = 3000.0, max_step = 2.0 }",
        )
        .lab_link("50Mbit/s")
        .healthy()
        .build()
});

/// 4.096 us x 2^t, the QP retransmission timeout NCCL_IB_TIMEOUT = t sets.
fn ib_timeout(t: u8) -> Duration {
    Duration::from_nanos((4096.0 * 2f64.powi(i32::from(t))) as u64)
}

#[test]
fn timeouts_cover_a_delay_spike_before_the_spike_is_over() {
    // 14 s at 20 ms RTT (the daemon starts within it, however slow loading is), then spikes of +200 ms each way (RTT ~420 ms) for 2 s of every 5 s.
    let toml = "name = \"spikes\"\n\
                [[phase]]\nname = \"calm\"\nduration = \"14s\"\n[phase.link]\ndelay = \"10ms\"\n\
                [[phase]]\nname = \"spiky\"\nduration = \"10min\"\n[phase.link]\ndelay = \"10ms\"\n\
                spikes = { extra = \"200ms\", every = \"5s\", length = \"2s\" }\n";
    let scenario = Scenario::parse(toml, "<test>", None).expect("scenario");
    let lab = Lab::start(LabConfig { name: "ctlspk".into(), ..LabConfig::default() }, scenario)
        .expect("lab");
    let (hk, us) = lab.hk_us();
    let dir = linkpilot_tests::temp_dir("ctl-spike");
    let mut d = Daemon::start_with(&hk.netns, &dir, &SPIKE_POLICY, &["--metrics-addr", "off"]);
    d.wait_up();
    let board = BoardReader::open(&dir.join("knobs")).expect("board");
    // A steady sender, so that every ACK carries an RTT sample.
    let mut server = iperf3_server(&us);
    let mut client = iperf3_client(&hk, &us, &["-b", "5M", "-t", "20"]);
    let spike_at = Duration::from_secs(14);
    assert!(lab.elapsed() < spike_at - Duration::from_secs(2), "the calm phase is too short");
    while lab.elapsed() < spike_at - Duration::from_millis(200) {
        thread::sleep(Duration::from_millis(20));
    }
    let calm = board.read().expect("read").links[0];
    let spike_rtt = Duration::from_millis(420);
    eprintln!(
        "calm: NCCL_IB_TIMEOUT {} ({:?}), watchdog {} s",
        calm.nccl_ib_timeout,
        ib_timeout(calm.nccl_ib_timeout),
        calm.watchdog_s
    );
    // The premise: the spike would outlast the calm link's QP timeout.
    assert!(ib_timeout(calm.nccl_ib_timeout) < spike_rtt, "{}", calm.nccl_ib_timeout);
    let spike_ends = spike_at + Duration::from_secs(2);
    let covered = loop {
        let b = board.read().expect("read").links[0];
        // Twice the spike's RTT for the QP timer, and a watchdog of the policy's 3000 x RTT
        // p99 for a p99 of at least 200 ms.
        if ib_timeout(b.nccl_ib_timeout) >= spike_rtt * 2 && b.watchdog_s >= 600 {
            break lab.elapsed();
        }
        assert!(
            lab.elapsed() < spike_ends,
            "the first spike ended with NCCL_IB_TIMEOUT {} and watchdog {} s",
            b.nccl_ib_timeout,
            b.watchdog_s
        );
        thread::sleep(Duration::from_millis(10));
    };
    let b = board.read().expect("read").links[0];
    eprintln!(
        "covered {:?} into the spike: NCCL_IB_TIMEOUT {} ({:?}), watchdog {} s",
        covered - spike_at,
        b.nccl_ib_timeout,
        ib_timeout(b.nccl_ib_timeout),
        b.watchdog_s
    );
    let env = std::fs::read_to_string(dir.join("nccl.env")).expect("env file");
    assert!(env.contains(&format!("NCCL_IB_TIMEOUT={}", b.nccl_ib_timeout)), "{env}");
    // They do not fall back between spikes: the watchdog follows the peak over its window and
    // the timeout only falls after the dwell.
    while lab.elapsed() < spike_ends + Duration::from_millis(2500) {
        let now = board.read().expect("read").links[0];
        assert!(now.watchdog_s >= b.watchdog_s, "watchdog fell to {}", now.watchdog_s);
        thread::sleep(Duration::from_millis(50));
    }
    client.wait().expect("iperf3 client");
    server.wait().expect("iperf3 server");
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}
