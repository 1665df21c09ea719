//! The Rust tests under cargo-nextest, each test in its own process. The privileged lab tests
//! each make their own namespaces, so most run side by side; those listed in [`ALONE`] run one
//! at a time afterwards, with nothing else of the suite beside them, each for the reason given.

use std::{path::PathBuf, process::Command};

use crate::run::status;

/// Tests that cannot run beside others (nextest filtersets), and why.
pub const ALONE: &[(&str, &str)] = &[
    // What they measure moves with other tests' CPU load.
    (
        "binary_id(linkpilot-tests::capacity_auto)",
        "fills the lab link at 300 Mbit/s and judges iperf3's rate against it",
    ),
    (
        "binary_id(linkpilot-tests::lab) & test(=iperf3_throughput_matches_bottleneck_rate)",
        "judges iperf3's rate through the delay line within 10%",
    ),
    (
        "binary_id(linkpilot-tests::daemon_control)",
        "times the control loop: congested within a second of the first mark",
    ),
    ("binary_id(linkpilot-tests::outcome)", "judges codecs by the training ranks' step times"),
    (
        "binary_id(linkpilot-tests::outer) & test(=rounds_overlap_send_the_codecs_bytes_and_ride_through_an_outage)",
        "judges overlap by wall time against the ranks' compute time",
    ),
    (
        "binary_id(linkpilot-tests::queue_attribution)",
        "compares queueing delay with tshark and ping within milliseconds",
    ),
    (
        "binary_id(linkpilot-tests::sensing) & (test(=flow_rtt_matches_the_lab_and_ss) | test(=snapshots_carry_rtt_percentiles_and_rates))",
        "judges RTT within 5% and p99 within 9 ms of the lab's",
    ),
    (
        "binary_id(linkpilot-tests::multilink)",
        "judges a 20 ms path's latest RTT sample within 5 ms of ping's (a receiver that waits \
         for a core adds that much)",
    ),
    // What they read is machine-wide.
    (
        "binary_id(linkpilot-tests::faults_flows)",
        "sums bpf_stats over every program of our names, switches bpf_stats_enabled and opens 70,000 connections",
    ),
    (
        "binary_id(linkpilot-tests::sensing) & test(=retransmissions_per_peer_equal_nstat_under_loss)",
        "sums bpf_stats over every program of our names and switches bpf_stats_enabled",
    ),
    (
        "binary_id(linkpilot-tests::errors) | (binary_id(linkpilot-tests::watch) & test(=detaches_everything_on_sigterm))",
        "reads which of our programs are loaded machine-wide, by name",
    ),
    (
        "binary_id(linkpilot-tests::daemon) & (test(=sigkill_then_restart_leaves_one_set_of_attachments_and_the_original_sysctls) | test(=the_default_policy_runs_unedited_on_the_default_route_device))",
        "counts BPF links machine-wide",
    ),
    (
        "binary_id(linkpilot-tests::transport)",
        "counts sock_ops programs at the root cgroup by name (prometheus.rs attaches one too), \
         and checks the calm phase's first flights within its first 25 s",
    ),
    (
        "binary_id(linkpilot-tests::watch) & test(=retransmissions_match_tcp_retrans_segs) | binary_id(linkpilot-tests::netns_attribution) | (binary_id(linkpilot-tests::sensing) & test(=flow_opens_and_closes_equal_nstat))",
        "exact tracepoint counts: others' programs on the same CPU make the kernel skip ours",
    ),
];

/// Lab tests at once in the side-by-side group: their time is mostly spent waiting on the lab's
/// delay line and on the daemons' ticks, not on the CPU.
const SIDE_BY_SIDE: &str = "6";

/// `cargo nextest run` over the workspace's host crates (the selection the suite's one build
/// used, so nothing is compiled again), limited to the tests `filters` all match.
pub fn nextest(
    filters: &[&str],
    threads: Option<&str>,
    env: &[(&str, PathBuf)],
) -> anyhow::Result<()> {
    let filter = filters.iter().map(|f| format!("({f})")).collect::<Vec<_>>().join(" and ");
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["nextest", "run", "--workspace", "--exclude", "linkpilot-ebpf", "--no-fail-fast"])
        .args(["-E", &filter])
        .env("PATH", crate::python::path_with_tools(&[]));
    if let Some(n) = threads {
        cmd.args(["--test-threads", n]);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    status(&format!("cargo nextest run -E '{filter}'"), &mut cmd)
}

fn alone_filter() -> String {
    if ALONE.is_empty() {
        return "none()".to_owned();
    }
    ALONE.iter().map(|(f, _)| format!("({f})")).collect::<Vec<_>>().join(" or ")
}

/// The lab tests that may run beside each other, [`SIDE_BY_SIDE`] at a time.
pub fn side_by_side(env: &[(&str, PathBuf)]) -> anyhow::Result<()> {
    let not_alone = format!("not ({})", alone_filter());
    nextest(&["package(linkpilot-tests)", &not_alone], Some(SIDE_BY_SIDE), env)
}

/// The lab tests of [`ALONE`], one at a time.
pub fn alone(env: &[(&str, PathBuf)]) -> anyhow::Result<()> {
    if ALONE.is_empty() {
        return Ok(());
    }
    for (filter, why) in ALONE {
        eprintln!("test: alone: {filter}: {why}");
    }
    nextest(&["package(linkpilot-tests)", &alone_filter()], Some("1"), env)
}
