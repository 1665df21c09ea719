//! Whose queue: the daemon splits the CE marks it receives into those on the flows of a job
//! that reports on its host and those on everyone else's, and the split is judged against
//! tshark's per-flow CE count of the same packets, without and with iperf3 as cross traffic.

use std::{
    io::Write,
    process::{Child, ChildStdin, Stdio},
    sync::mpsc,
    thread,
    time::Duration,
};

use linkpilot_lab::{
    lab::{Host, Site},
    selftest,
};
use linkpilot_tests::daemon::{
    iperf3_server, lab_with, sample, scrape, status_json, wait_for, Daemon,
};

/// The job's port on the receiving (US) host.
const JOB_PORT: u16 = 6000;

const POLICY: &str = r#"
[daemon]
tick = "100ms"
[[link]]
name = "wan"
interfaces = ["eth0"]
capacity = "50Mbit/s"
[[link.peer]]
name = "hk"
cidrs = ["198.18.1.0/24"]
[[state]]
name = "healthy"
[state.knobs]
compression = "none"
dscp = 0
roce_traffic_class = 106
"#;

/// The job: a process that publishes a job report (the Python package's writer, as a training
/// rank does) and receives one TCP connection on JOB_PORT until it closes. It runs as `nobody`:
/// the daemon takes a report owner's connections as the job's, and iperf3 runs as root.
const JOB: &str = r#"
import os, socket, sys
from linkpilot.jobreport import JobReport
report = JobReport(os.environ["LINKPILOT_JOBS"], rank=0, world=1, kind="ddp", job="ce-job")
listener = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
conn, _ = listener.accept()
while conn.recv(1 << 20):
    pass
"#;

/// The job's far end: connects, then sends for as many seconds as each line of stdin says,
/// keeping the connection open between bursts (a closed flow leaves the flow table).
const SENDER: &str = r#"
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
print("connected", flush=True)
buf = bytes(1 << 16)
for line in sys.stdin:
    end = time.monotonic() + float(line)
    while time.monotonic() < end:
        s.sendall(buf)
    print("sent", flush=True)
"#;

struct Sender {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Sender {
    fn start(hk: &Host, us: &Host) -> Self {
        let mut child = hk
            .command(&linkpilot_tests::python().display().to_string())
            .args(["-c", SENDER, &us.ipv4.to_string(), &JOB_PORT.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sender");
        let stdin = child.stdin.take().expect("stdin");
        let lines = lines_of(&mut child);
        let mut s = Self { child, stdin, lines };
        s.expect("connected");
        s
    }

    fn expect(&mut self, line: &str) {
        let got = self.lines.recv_timeout(Duration::from_secs(30)).expect("sender output");
        assert_eq!(got, line);
    }

    /// Sends for `secs`, returning once done.
    fn burst(&mut self, secs: u32) {
        writeln!(self.stdin, "{secs}").expect("sender stdin");
        self.expect("sent");
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Its stdout's lines, which the test waits for.
fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    linkpilot_tests::pipe_output(child).0
}

/// (job, other) CE marks the daemon has counted from the HK peer.
fn daemon_marks(netns: &str) -> (f64, f64) {
    let m = scrape(netns);
    let at = |flows: &str| {
        let series = format!(
            "linkpilot_peer_marks_total{{interface=\"eth0\",peer=\"hk\",mark=\"ce\",flows=\"{flows}\"}}"
        );
        sample(&m, &series).unwrap_or(0.0)
    };
    (at("job"), at("other"))
}

/// (CE marks on the job's flow, all CE marks) in a capture, per tshark.
fn tshark_marks(pcap: &str) -> (u64, u64) {
    let fields = linkpilot_tests::sh(&[
        "tshark",
        "-r",
        pcap,
        "-T",
        "fields",
        "-e",
        "tcp.dstport",
        "-e",
        "ip.dsfield.ecn",
    ]);
    let (mut job, mut all) = (0, 0);
    for l in fields.lines() {
        let mut f = l.split('\t');
        let (port, ecn) = (f.next().unwrap_or(""), f.next().unwrap_or(""));
        if ecn == "3" {
            all += 1;
            if port == JOB_PORT.to_string() {
                job += 1;
            }
        }
    }
    (job, all)
}

/// One phase: the job sends for 6 s (with iperf3 beside it if `cross`); returns the daemon's
/// and tshark's share of the CE marks that fell on the job's flow, and the link's CE and
/// cross-traffic CE fractions read from status during the phase.
fn phase(hk: &Host, us: &Host, sender: &mut Sender, cross: bool) -> (f64, f64, f64, f64) {
    let pcap = std::env::temp_dir().join(format!("lp-ceattr-{}-{cross}.pcap", std::process::id()));
    let pcap_s = pcap.display().to_string();
    let dump = selftest::start_capture(us, &format!("tcp and src host {}", hk.ipv4), &pcap_s)
        .expect("tcpdump");
    let before = daemon_marks(&us.netns);
    let iperf = cross.then(|| {
        let server = iperf3_server(us);
        let client = hk
            .command("iperf3")
            .args(["-c", &us.ipv4.to_string(), "-t", "6"])
            .stdout(Stdio::null())
            .spawn()
            .expect("iperf3 -c");
        (server, client)
    });
    let dir = std::env::temp_dir().join(format!("lp-ceattr-{}", std::process::id()));
    let signals = thread::scope(|s| {
        let watch = s.spawn(|| {
            thread::sleep(Duration::from_secs(4));
            let st = status_json(&dir);
            let g = &st["links"][0]["signals"];
            (
                g["ce_fraction"].as_f64().unwrap_or(-1.0),
                g["cross_ce_fraction"].as_f64().unwrap_or(-1.0),
            )
        });
        sender.burst(6);
        watch.join().expect("status reader")
    });
    if let Some((mut server, mut client)) = iperf {
        assert!(client.wait().expect("iperf3 -c").success());
        server.wait().expect("iperf3 -s");
    }
    // Two readings of the flow table after the last mark, then the counters.
    thread::sleep(Duration::from_millis(1500));
    let after = daemon_marks(&us.netns);
    let dropped = selftest::stop_capture(dump).expect("stop tcpdump");
    assert_eq!(dropped, 0, "tcpdump dropped packets");
    let (job_ce, all_ce) = tshark_marks(&pcap_s);
    let _ = std::fs::remove_file(&pcap);
    let (job, other) = (after.0 - before.0, after.1 - before.1);
    eprintln!(
        "cross {cross}: daemon job {job} other {other}; tshark job {job_ce} of {all_ce}; \
         status ce_fraction {:.4} cross_ce_fraction {:.4}",
        signals.0, signals.1
    );
    assert!(all_ce > 200, "the queue hardly reached the marking threshold: {all_ce} CE marks");
    (job / (job + other), job_ce as f64 / all_ce as f64, signals.0, signals.1)
}

#[test]
fn marks_on_the_jobs_flows_are_told_from_cross_traffics_as_tshark_counts_them() {
    let lab = lab_with(
        "ceattr",
        "delay = \"2ms\"\nrate = \"50Mbit/s\"\nqueue = \"2MiB\"\n\
         ecn = { mode = \"step\", threshold = \"5ms\" }",
    );
    let (hk, us) = (lab.host(Site::Hk, 0).clone(), lab.host(Site::Us, 0).clone());
    for h in [&hk, &us] {
        h.exec(&["sysctl", "-qw", "net.ipv4.tcp_ecn=1"]).expect("sysctl");
        // A loss-based sender answers ECE, so both flows hold the queue near the marking step
        // (Reno: allowed in a namespace everywhere; BBR ignores marks).
        h.exec(&["sysctl", "-qw", "net.ipv4.tcp_congestion_control=reno"]).expect("sysctl");
    }
    let dir = std::env::temp_dir().join(format!("lp-ceattr-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let daemon = Daemon::start(&us.netns, &dir, POLICY);
    let jobs = dir.join("jobs");
    wait_for("the job-report directory", Duration::from_secs(20), || jobs.is_dir());
    let mut job = us
        .command("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(linkpilot_tests::python())
        .args(["-c", JOB, &us.ipv4.to_string(), &JOB_PORT.to_string()])
        .current_dir("/")
        .env("LINKPILOT_JOBS", &jobs)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("job");
    let job_lines = lines_of(&mut job);
    assert_eq!(job_lines.recv_timeout(Duration::from_secs(30)).expect("job"), "listening");
    let mut sender = Sender::start(&hk, &us);
    // The daemon finds the job's flow from its report (read once a second).
    wait_for("the job in status", Duration::from_secs(10), || {
        status_json(&dir)["jobs"].as_array().is_some_and(|j| !j.is_empty())
    });
    thread::sleep(Duration::from_millis(2500));

    let (alone, alone_oracle, ce, cross_ce) = phase(&hk, &us, &mut sender, false);
    assert!(
        (alone - alone_oracle).abs() <= 0.1 * alone_oracle,
        "job alone: daemon {alone:.3}, tshark {alone_oracle:.3}"
    );
    assert!(ce > 0.0, "the job's bursts were marked: ce_fraction {ce}");
    assert!(cross_ce < 0.1 * ce, "its own marks are not cross traffic's: {cross_ce} of {ce}");

    let (shared, shared_oracle, ce, cross_ce) = phase(&hk, &us, &mut sender, true);
    assert!(
        (shared - shared_oracle).abs() <= 0.1 * shared_oracle,
        "with iperf3: daemon {shared:.3}, tshark {shared_oracle:.3}"
    );
    assert!(shared_oracle < 0.9, "iperf3 got marks of its own: {shared_oracle:.3}");
    assert!(cross_ce > 0.1 * ce, "iperf3's marks count as cross traffic: {cross_ce} of {ce}");
    drop(sender);
    let _ = job.kill();
    let _ = job.wait();
    drop(daemon);
}
