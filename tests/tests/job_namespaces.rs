//! A job in its own network namespace (a pod without the host's network), routed through the
//! daemon's host without NAT as a pod network is. Without `job_namespaces` the daemon leaves
//! it alone: its connection to the peer keeps the pod's default congestion control (`ss -tin`
//! in the pod) and the marks on it count as others' (tshark counts them on the job's flow).
//! With the key, the namespace the job's report names is the job's: a new connection gets the
//! link's transport profile, and its marks are told from cross traffic's as tshark counts
//! them, alone and beside iperf3 to the host, as for a job on the host (ce_attribution.rs).

use std::time::Duration;

use linkpilot_lab::lab::{Host, Lab, Site};
use linkpilot_tests::{
    daemon::{sample, scrape, status_json, wait_for, Daemon},
    marking::{judge, lines_of, marking_lab, phase, python, stop, Mark, Sender, JOB_PORT, POLICY},
    netns::Netns,
    sh,
    sink::RECEIVER,
};

const POD_ADDR: &str = "198.18.102.2";
const POD_GATEWAY: &str = "198.18.102.1";
const POD_SUBNET: &str = "198.18.102.0/24";

/// The marking lab's policy with cubic for the peer's connections and, if `opted_in`, the
/// jobs' own namespaces.
fn policy(opted_in: bool) -> String {
    let daemon =
        if opted_in { "tick = \"100ms\"\njob_namespaces = true" } else { "tick = \"100ms\"" };
    format!(
        "{}[state.transport]\ncongestion_control = \"cubic\"\n",
        POLICY.replace("tick = \"100ms\"", daemon)
    )
}

/// A pod behind the US host: its own namespace, a veth to the host, a route for its subnet
/// in the router, reno as its default congestion control (allowed in any namespace; the
/// profile's is cubic).
fn pod(lab: &Lab, us: &Host) -> (Netns, Host) {
    let ns = Netns::new("pod");
    let in_us = |args: &[&str]| us.exec(args).expect("on the US host");
    in_us(&[
        "ip", "link", "add", "pod0", "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
    ]);
    in_us(&["ip", "addr", "add", &format!("{POD_GATEWAY}/24"), "dev", "pod0"]);
    in_us(&["ip", "link", "set", "pod0", "up"]);
    in_us(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    ns.exec(&["ip", "addr", "add", &format!("{POD_ADDR}/24"), "dev", "eth0"]);
    ns.exec(&["ip", "link", "set", "eth0", "up"]);
    ns.exec(&["ip", "route", "add", "default", "via", POD_GATEWAY]);
    ns.exec(&["sysctl", "-qw", "net.ipv4.tcp_congestion_control=reno"]);
    sh(&["ip", "-n", lab.wan_netns(), "route", "add", POD_SUBNET, "via", &us.ipv4.to_string()]);
    let host = Host {
        site: Site::Us,
        netns: ns.name.clone(),
        iface: "eth0",
        ipv4: POD_ADDR.parse().expect("an address"),
        ipv6: "2001:db8:102::2".parse().expect("an address"), // unused: IPv6 is off there
    };
    (ns, host)
}

/// The congestion control of the pod's connection on JOB_PORT, as `ss -tin` shows it.
fn congestion_control(pod: &Host) -> String {
    let filter = format!("sport = :{JOB_PORT}");
    let out =
        sh(&["ip", "netns", "exec", &pod.netns, "ss", "-Htin", "state", "established", &filter]);
    let known = ["reno", "cubic", "bbr"];
    let found: Vec<&str> = out.split_whitespace().filter(|t| known.contains(t)).collect();
    assert_eq!(found.len(), 1, "one connection on the job's port: {out}");
    found[0].to_owned()
}

/// A job in the pod (as `nobody`, reporting) receiving from a plain sender on HK, once the
/// daemon shows its report.
fn pod_job(hk: &Host, pod: &Host, dir: &std::path::Path) -> (std::process::Child, Sender) {
    let mut job = python(pod, RECEIVER, pod, Some(&dir.join("jobs")), &[]);
    let job_lines = lines_of(&mut job);
    assert_eq!(job_lines.recv_timeout(Duration::from_secs(30)).expect("job"), "listening");
    wait_for("the job in status", Duration::from_secs(10), || {
        status_json(dir)["jobs"].as_array().is_some_and(|j| !j.is_empty())
    });
    // The namespace is taken with the reports, once a second.
    std::thread::sleep(Duration::from_millis(2500));
    (job, Sender::start(hk, pod, None, false))
}

#[test]
fn a_pod_jobs_connection_gets_the_profile_and_its_marks_are_the_jobs_once_opted_in() {
    let (lab, hk, us, dir, daemon) = marking_lab("podns", &policy(false));
    let (_ns, pod) = pod(&lab, &us);

    // Not opted in: the pod is someone else's.
    let (job, mut sender) = pod_job(&hk, &pod, &dir);
    assert_eq!(congestion_control(&pod), "reno", "the pod's connection was left alone");
    assert_eq!(sample(&scrape(&us.netns), "linkpilot_job_namespaces"), Some(0.0));
    let (share, oracle, _, _) = phase(&hk, &us, &dir, &mut sender, Mark::Ce, false);
    assert!(oracle > 0.9, "tshark: the marks are on the pod's flow ({oracle:.3})");
    assert_eq!(share, 0.0, "without job_namespaces the pod's marks are others'");
    drop(sender);
    stop(job);
    drop(daemon);

    // Opted in: a new connection of a new job.
    std::fs::remove_file(dir.join("status.sock")).expect("the killed daemon's status socket");
    std::fs::write(dir.join("policy.toml"), policy(true)).expect("the policy");
    let mut daemon = Daemon::start(&us.netns, &dir, "");
    // Its first tick: the socket answers from its bind, while the programs still load.
    daemon.wait_up();
    let (job, mut sender) = pod_job(&hk, &pod, &dir);
    assert_eq!(congestion_control(&pod), "cubic", "the link's profile in the pod");
    assert_eq!(sample(&scrape(&us.netns), "linkpilot_job_namespaces"), Some(1.0));
    judge(&hk, &us, &dir, &mut sender, Mark::Ce);
    drop(sender);
    stop(job);
    drop(daemon);
}
