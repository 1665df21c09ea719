//! Whose queue: the daemon splits the congestion marks it receives into those on the flows of
//! a job that reports on its host and those on everyone else's, and the split is judged against
//! tshark's per-flow count of the same packets, without and with iperf3 as cross traffic: CE on
//! the data a receiving job gets, and ECE on what comes back to a sending job.

use std::time::Duration;

use linkpilot_tests::{
    daemon::{wait_for, Daemon},
    marking::{
        judge, lines_of, marking_lab, phase, python, receiving_job, stop, wait_for_the_job, Mark,
        Sender, POLICY,
    },
    sink::RECEIVER,
};

#[test]
fn marks_on_the_jobs_flows_are_told_from_cross_traffics_as_tshark_counts_them() {
    let (_lab, hk, us, dir, daemon) = marking_lab("ceattr", &POLICY);
    let (job, mut sender) = receiving_job(&hk, &us, &dir);
    judge(&hk, &us, &dir, &mut sender, Mark::Ce);
    drop(sender);
    stop(job);
    drop(daemon);
}

/// A daemon restarted under a running job: the job's connection, which only receives, opened
/// before this daemon ran, so no tracepoint put it in the flow table; the daemon writes the
/// connections already open into the table at its start, and their marks are the job's again.
#[test]
fn marks_on_a_receiving_jobs_flow_opened_before_the_daemon_started_are_the_jobs() {
    let (_lab, hk, us, dir, daemon) = marking_lab("ceseed", &POLICY);
    let (job, mut sender) = receiving_job(&hk, &us, &dir);
    // Killed as a crash or an upgrade would: the next one starts with an empty flow table.
    drop(daemon);
    // The killed one's socket stays behind: the new one is up when its own appears.
    let socket = dir.join("status.sock");
    std::fs::remove_file(&socket).expect("the killed daemon's status socket");
    let daemon = Daemon::start(&us.netns, &dir, &POLICY);
    wait_for("the restarted daemon", Duration::from_secs(20), || socket.exists());
    wait_for_the_job(&dir);
    judge(&hk, &us, &dir, &mut sender, Mark::Ce);
    drop(sender);
    stop(job);
    drop(daemon);
}

/// A job connection marked from its first seconds: it opens while the job already reports
/// (a rank connecting to a new peer, or the synchronizer's first round), and the daemon has to
/// tell it for the job's before its marks count as anyone's.
#[test]
fn marks_on_a_job_connection_from_its_open_on_are_the_jobs() {
    let (_lab, hk, us, dir, daemon) = marking_lab("cenew", &POLICY);
    let mut job = python(&us, RECEIVER, &us, Some(&dir.join("jobs")), &[]);
    let job_lines = lines_of(&mut job);
    assert_eq!(job_lines.recv_timeout(Duration::from_secs(30)).expect("job"), "listening");
    wait_for_the_job(&dir);
    let mut sender = Sender::start(&hk, &us, None, true);
    let (share, oracle, ce, cross_ce) = phase(&hk, &us, &dir, &mut sender, Mark::Ce, false);
    assert!((share - oracle).abs() <= 0.1 * oracle, "daemon {share:.3}, tshark {oracle:.3}");
    assert!(cross_ce < 0.1 * ce, "its own marks are not cross traffic's: {cross_ce} of {ce}");
    drop(sender);
    stop(job);
    drop(daemon);
}

/// The same for a job that sends: the marks come back to its host as ECE.
#[test]
fn echoed_marks_on_the_jobs_flows_are_told_from_cross_traffics_as_tshark_counts_them() {
    let (_lab, hk, us, dir, daemon) = marking_lab("eceattr", &POLICY);
    let mut sink = python(&hk, RECEIVER, &hk, None, &[]);
    let sink_lines = lines_of(&mut sink);
    assert_eq!(sink_lines.recv_timeout(Duration::from_secs(30)).expect("sink"), "listening");
    let mut job = Sender::start(&us, &hk, Some(&dir.join("jobs")), false);
    wait_for_the_job(&dir);
    judge(&hk, &us, &dir, &mut job, Mark::Ece);
    drop(job);
    stop(sink);
    drop(daemon);
}
