//! Whose queue, the lab's side: a marking lab, a job that reports (receiving or sending) and a
//! plain other end, and the daemon's split of the congestion marks judged against tshark's
//! per-flow count of the same packets, without and with iperf3 as cross traffic.

use std::sync::LazyLock;

use crate::policy::PolicyToml;
use std::{
    io::Write,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Stdio},
    sync::{
        atomic::{AtomicU32, Ordering},
        mpsc,
    },
    thread,
    time::Duration,
};

use linkpilot_lab::{lab::Host, selftest};

use crate::{
    daemon::{
        ecn_lab, iperf3_client, iperf3_server, sample, scrape, status_json, wait_for, Daemon,
    },
    sink::RECEIVER,
};

/// The job's port on the receiving (US) host.
pub const JOB_PORT: u16 = 6000;

/// The marking lab's policy: one link to the HK peer.
pub static POLICY: LazyLock<String> = LazyLock::new(|| {
    PolicyToml::new()
        .link("wan", "eth0", "50Mbit/s", Some(("hk", "198.18.1.0/24")))
        .state("healthy", "", "", ("none", 0, 106))
        .build()
});

/// The sending end: connects (at once, or with a third argument "late" at its first burst, so
/// that the flow is marked from its first seconds), then sends for as many seconds as each line
/// of stdin says, keeping the connection open between bursts (a closed flow leaves the flow
/// table). The job too with `LINKPILOT_JOBS` set.
pub const SENDER: &str = r#"
import os, socket, sys, time
if "LINKPILOT_JOBS" in os.environ:
    from linkpilot.jobreport import JobReport
    report = JobReport(os.environ["LINKPILOT_JOBS"], rank=0, world=1, kind="ddp", job="ce-job")
def connect():
    return socket.create_connection((sys.argv[1], int(sys.argv[2])))
s = None if sys.argv[3:] == ["late"] else connect()
print("started", flush=True)
buf = bytes(1 << 16)
for line in sys.stdin:
    s = s or connect()
    end = time.monotonic() + float(line)
    while time.monotonic() < end:
        s.sendall(buf)
    print("sent", flush=True)
"#;

/// `script` on `host` with `to`'s address, JOB_PORT and `more` as arguments; as the job when `jobs` is
/// its report directory: the daemon takes a report owner's connections as the job's, so the job
/// runs as `nobody` and everything else (iperf3, the other end) as root.
pub fn python(host: &Host, script: &str, to: &Host, jobs: Option<&Path>, more: &[&str]) -> Child {
    let mut cmd = match jobs {
        Some(jobs) => {
            let mut c = host.command("setpriv");
            c.args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
                .arg(crate::python())
                .current_dir("/")
                .env("LINKPILOT_JOBS", jobs);
            c
        }
        None => host.command(&crate::python().display().to_string()),
    };
    cmd.args(["-c", script, &to.ipv4.to_string(), &JOB_PORT.to_string()])
        .args(more)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3")
}

pub struct Sender {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Sender {
    /// Connected at once, or at its first burst if `late`.
    pub fn start(from: &Host, to: &Host, jobs: Option<&Path>, late: bool) -> Self {
        let mut child = python(from, SENDER, to, jobs, if late { &["late"] } else { &[] });
        let stdin = child.stdin.take().expect("stdin");
        let lines = lines_of(&mut child);
        let mut s = Self { child, stdin, lines };
        s.expect("started");
        s
    }

    pub fn expect(&mut self, line: &str) {
        let got = self.lines.recv_timeout(Duration::from_secs(30)).expect("sender output");
        assert_eq!(got, line);
    }

    /// Sends for `secs`, returning once done.
    pub fn burst(&mut self, secs: u32) {
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
pub fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    crate::pipe_output(child).0
}

/// Which marks a phase counts on the daemon's (US) host: CE on the data the job receives, or
/// ECE on the segments that come back for the data it sends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mark {
    Ce,
    Ece,
}

/// (job, other) marks the daemon has counted from the HK peer.
pub fn daemon_marks(netns: &str, mark: Mark) -> (f64, f64) {
    let m = scrape(netns);
    let name = if mark == Mark::Ce { "ce" } else { "ece" };
    let at = |flows: &str| {
        let series = format!(
            "linkpilot_peer_marks_total{{interface=\"eth0\",peer=\"hk\",mark=\"{name}\",flows=\"{flows}\"}}"
        );
        sample(&m, &series).unwrap_or(0.0)
    };
    (at("job"), at("other"))
}

/// (marks on the job's flow, all marks) in a capture of what HK sent, per tshark: CE in the IP
/// header, or the TCP header's ECE flag. The job's flow is the one with JOB_PORT at its
/// receiving end: US's for CE, HK's for ECE.
pub fn tshark_marks(pcap: &str, mark: Mark) -> (u64, u64) {
    let (port, field) = match mark {
        Mark::Ce => ("tcp.dstport", "ip.dsfield.ecn"),
        Mark::Ece => ("tcp.srcport", "tcp.flags.ece"),
    };
    let fields = crate::sh(&["tshark", "-r", pcap, "-T", "fields", "-e", port, "-e", field]);
    let (mut job, mut all) = (0, 0);
    for l in fields.lines() {
        let mut f = l.split('\t');
        let (port, value) = (f.next().unwrap_or(""), f.next().unwrap_or(""));
        // tshark prints a flag as 1 or True, depending on its version.
        let marked = match mark {
            Mark::Ce => value == "3",
            Mark::Ece => matches!(value, "1" | "True"),
        };
        if marked {
            all += 1;
            if port == JOB_PORT.to_string() {
                job += 1;
            }
        }
    }
    (job, all)
}

/// One phase: the job's data crosses for 6 s (with iperf3's in the same direction beside it if
/// `cross`); returns the daemon's and tshark's share of the `mark`s that fell on the job's flow,
/// and the link's CE and cross-traffic CE fractions read from status during the phase.
pub fn phase(
    hk: &Host,
    us: &Host,
    dir: &Path,
    sender: &mut Sender,
    mark: Mark,
    cross: bool,
) -> (f64, f64, f64, f64) {
    // Unique within the process too: tests of one binary may share it (cargo test's threads).
    static PHASES: AtomicU32 = AtomicU32::new(0);
    let n = PHASES.fetch_add(1, Ordering::Relaxed);
    let pcap = std::env::temp_dir()
        .join(format!("lp-ceattr-{}-{n}-{mark:?}-{cross}.pcap", std::process::id()));
    let pcap_s = pcap.display().to_string();
    let dump = selftest::start_capture(us, &format!("tcp and src host {}", hk.ipv4), &pcap_s)
        .expect("tcpdump");
    let before = daemon_marks(&us.netns, mark);
    // iperf3 sends the way the job's data goes: to US for CE, from US for ECE.
    let (from, to) = if mark == Mark::Ce { (hk, us) } else { (us, hk) };
    let iperf = cross.then(|| {
        let server = iperf3_server(to);
        let client = iperf3_client(from, to, &["-t", "6"]);
        (server, client)
    });
    let signals = thread::scope(|s| {
        let watch = s.spawn(|| {
            thread::sleep(Duration::from_secs(4));
            let st = status_json(dir);
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
    let after = daemon_marks(&us.netns, mark);
    let dropped = selftest::stop_capture(dump).expect("stop tcpdump");
    assert_eq!(dropped, 0, "tcpdump dropped packets");
    let (job_marks, all_marks) = tshark_marks(&pcap_s, mark);
    let _ = std::fs::remove_file(&pcap);
    let (job, other) = (after.0 - before.0, after.1 - before.1);
    eprintln!(
        "{mark:?}, cross {cross}: daemon job {job} other {other}; tshark job {job_marks} of \
         {all_marks}; status ce_fraction {:.4} cross_ce_fraction {:.4}",
        signals.0, signals.1
    );
    assert!(all_marks > 200, "the queue hardly reached the marking threshold: {all_marks} marks");
    (job / (job + other), job_marks as f64 / all_marks as f64, signals.0, signals.1)
}

/// The lab both tests use: a 2 ms path at 50 Mbit/s whose queue marks CE above 5 ms, ECN and
/// Reno on both hosts (a loss-based sender answers ECE, so the flows hold the queue near the
/// marking step; Reno is allowed in a namespace everywhere; BBR ignores marks), and the daemon
/// on the US host with its job-report directory.
pub fn marking_lab(
    name: &str,
    policy: &str,
) -> (linkpilot_lab::lab::Lab, Host, Host, PathBuf, Daemon) {
    let (lab, hk, us) = ecn_lab(name, "2ms");
    for h in [&hk, &us] {
        h.exec(&["sysctl", "-qw", "net.ipv4.tcp_congestion_control=reno"]).expect("sysctl");
    }
    let dir = crate::temp_dir(name);
    let daemon = Daemon::start(&us.netns, &dir, policy);
    wait_for("the job-report directory", Duration::from_secs(20), || dir.join("jobs").is_dir());
    (lab, hk, us, dir, daemon)
}

/// Waits until the daemon has found the job's flow from its report (read once a second).
pub fn wait_for_the_job(dir: &Path) {
    wait_for("the job in status", Duration::from_secs(10), || {
        status_json(dir)["jobs"].as_array().is_some_and(|j| !j.is_empty())
    });
    thread::sleep(Duration::from_millis(2500));
}

/// Both phases of `mark`, judged against tshark: the job alone (its marks are its own, not
/// cross traffic's) and beside iperf3 (iperf3's count as cross traffic).
pub fn judge(hk: &Host, us: &Host, dir: &Path, sender: &mut Sender, mark: Mark) {
    let (alone, alone_oracle, ce, cross_ce) = phase(hk, us, dir, sender, mark, false);
    assert!(
        (alone - alone_oracle).abs() <= 0.1 * alone_oracle,
        "{mark:?}, job alone: daemon {alone:.3}, tshark {alone_oracle:.3}"
    );
    assert!(ce > 0.0, "the job's data was marked: ce_fraction {ce}");
    assert!(cross_ce < 0.1 * ce, "its own marks are not cross traffic's: {cross_ce} of {ce}");

    let (shared, shared_oracle, ce, cross_ce) = phase(hk, us, dir, sender, mark, true);
    assert!(
        (shared - shared_oracle).abs() <= 0.1 * shared_oracle,
        "{mark:?}, with iperf3: daemon {shared:.3}, tshark {shared_oracle:.3}"
    );
    assert!(shared_oracle < 0.9, "iperf3 got marks of its own: {shared_oracle:.3}");
    assert!(cross_ce > 0.1 * ce, "iperf3's marks count as cross traffic: {cross_ce} of {ce}");
}

/// A job on the US host that receives (as `nobody`, reporting), from a plain sender on the HK
/// host, once the daemon has found its flow.
pub fn receiving_job(hk: &Host, us: &Host, dir: &Path) -> (Child, Sender) {
    let mut job = python(us, RECEIVER, us, Some(&dir.join("jobs")), &[]);
    let job_lines = lines_of(&mut job);
    assert_eq!(job_lines.recv_timeout(Duration::from_secs(30)).expect("job"), "listening");
    let sender = Sender::start(hk, us, None, false);
    wait_for_the_job(dir);
    (job, sender)
}

pub fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}
