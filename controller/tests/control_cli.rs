//! `linkpilot policy check` and `linkpilot replay` as a user runs them.

use std::{path::PathBuf, process::Command};

fn linkpilot(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_linkpilot")).args(args).output().expect("run");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn repo(path: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(path).display().to_string()
}

fn temp(name: &str, contents: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("lp-{}-{name}", std::process::id()));
    std::fs::write(&p, contents).expect("write");
    p
}

#[test]
fn shipped_policies_check_ok() {
    for name in ["default", "hk-us", "static-handtuned", "static-bbr"] {
        let path = repo(&format!("policies/{name}.toml"));
        let (code, out, err) = linkpilot(&["policy", "check", &path]);
        assert_eq!(code, 0, "{name}: {out}{err}");
        // The digest a node's metrics show for this file: sha256sum's.
        let sum = std::process::Command::new("sha256sum").arg(&path).output().expect("sha256sum");
        let sum = String::from_utf8_lossy(&sum.stdout);
        let sum = sum.split_whitespace().next().expect("a digest");
        assert_eq!(out.trim_end(), format!("{path}: OK (sha256 {sum})"), "{name}: {err}");
    }
}

#[test]
fn a_bad_policy_prints_every_error_with_its_location_and_exits_1() {
    let bad = temp(
        "bad.toml",
        "[[link]]\nname = \"wan\"\ninterfaces = [\"eth0\"]\ncapacity = \"10Gbit/s\"\n\
         [[state]]\nname = \"healthy\"\n[state.knobs]\ncompression = \"none\"\ndscp = 99\n\
         roce_traffic_class = 106\n",
    );
    let (code, out, err) = linkpilot(&["policy", "check", bad.to_str().unwrap()]);
    let _ = std::fs::remove_file(&bad);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("bad.toml:7:1: state \"healthy\": dscp 99 must be 0..=63"), "{out}");
    assert!(!err.contains("panicked"), "{err}");
    let (code, out, _) = linkpilot(&["policy", "check", "/nonexistent/policy.toml"]);
    assert_eq!(code, 1);
    assert!(out.contains("/nonexistent/policy.toml") && out.contains("cannot read"), "{out}");
}

/// A real trace: `linkpilot watch --snapshots` on the WAN lab's HK host while iperf3 (CUBIC,
/// ECN on, 150 Mbit/s) crossed the `congestion-ecn` scenario, whose bottleneck falls to
/// 80 Mbit/s and marks CE above 5 ms of queue; the sender sees the marks echoed as ECE.
const TRACE: &str = "controller/tests/fixtures/trace-congestion-ecn.jsonl";
/// The lab's training day (`lab/scenarios/training-day.toml`) as `linkpilot watch --snapshots`
/// recorded it on the Hong Kong host, with paced iperf3 toward the US host.
const TRAINING_DAY: &str = "controller/tests/fixtures/trace-training-day.jsonl";

#[test]
fn replay_of_a_lab_trace_escalates_on_echoed_ce_and_plots() {
    let svg = std::env::temp_dir().join(format!("lp-{}-replay.svg", std::process::id()));
    let (code, out, err) = linkpilot(&[
        "replay",
        &repo(TRACE),
        "--policy",
        &repo("policies/hk-us.toml"),
        "--json",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let ds: Vec<serde_json::Value> =
        out.lines().map(|l| serde_json::from_str(l).expect("a JSON decision")).collect();
    assert_eq!(ds[0]["state"], "healthy");
    assert_eq!(ds[0]["knobs"]["chunk_bytes"], 8 << 20, "the hand-tuned start");
    // Ids count up from 1.
    for (i, d) in ds.iter().enumerate() {
        assert_eq!(d["id"], i as u64 + 1);
    }
    let congested = ds.iter().find(|d| d["state"] == "congested" || d["state"] == "degraded");
    let c = congested.unwrap_or_else(|| panic!("no escalation in {out}"));
    assert!(c["reason"].as_str().unwrap().contains("ce_fraction"), "{c}");
    assert_ne!(c["knobs"]["compression"], ds[0]["knobs"]["compression"], "compresses harder: {c}");
    // Jobs that sync every H steps: "auto" H (0) throughout, pseudo-gradients int8 -> int4.
    let sync = |d: &serde_json::Value| {
        (d["knobs"]["sync"]["sync_every"].as_u64(), d["knobs"]["sync"]["outer_compression"].clone())
    };
    assert_eq!(sync(&ds[0]), (Some(0), "int8".into()));
    assert_eq!(sync(c), (Some(0), "int4".into()));
    // Never below the hand-tuned NCCL_IB_TIMEOUT in any state.
    assert!(ds.iter().all(|d| d["knobs"]["nccl_ib_timeout"].as_u64() >= Some(22)));
    let plot = std::fs::read_to_string(&svg).expect("the SVG");
    let _ = std::fs::remove_file(&svg);
    assert!(plot.starts_with("<svg") && plot.contains("RTT p99") && plot.contains("chunk (MiB)"));
}

#[test]
fn the_static_policy_decides_once_on_the_same_trace() {
    let (code, out, _) = linkpilot(&[
        "replay",
        &repo(TRACE),
        "--policy",
        &repo("policies/static-handtuned.toml"),
        "--json",
    ]);
    assert_eq!((code, out.lines().count()), (0, 1), "{out}");
    assert!(out.contains("\"compression\":\"int8\""), "{out}");
}

#[test]
fn a_bad_trace_line_is_named() {
    let bad =
        temp("trace.jsonl", "{\"at_ms\": 1000, \"interval_ms\": 1000, \"peers\": []}\nnot json\n");
    let (code, _, err) =
        linkpilot(&["replay", bad.to_str().unwrap(), "--policy", &repo("policies/default.toml")]);
    let _ = std::fs::remove_file(&bad);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("trace.jsonl:2: not a snapshot"), "{err}");
}

#[test]
fn env_prints_a_policys_starting_values_or_says_why_not() {
    let (code, out, err) = linkpilot(&["env", "--policy", &repo("policies/static-handtuned.toml")]);
    assert_eq!(code, 0, "{err}");
    for line in [
        "NCCL_IB_TIMEOUT=22",
        "NCCL_IB_TC=106",
        "NCCL_BUFFSIZE=8388608",
        "LINKPILOT_COMPRESSION=int8",
        // The recipe's NCCL variables, from the policy's [env].
        "NCCL_ALGO=Tree",
        "NCCL_PROTO=Simple",
        "NCCL_NET_GDR_LEVEL=2",
        "NCCL_NTHREADS=512",
        "NCCL_MIN_NRINGS=2",
    ] {
        assert!(out.lines().any(|l| l == line), "{line} missing from:\n{out}");
    }
    assert!(!out.contains("NCCL_IB_HCA"), "host-specific variables stay commented out:\n{out}");
    let (code, _, err) = linkpilot(&["env", "--file", "/nonexistent/nccl.env"]);
    assert_eq!(code, 1);
    assert!(err.contains("no env file at /nonexistent/nccl.env"), "{err}");
}

#[test]
fn run_with_a_bad_policy_names_it_and_starts_nothing() {
    let bad = temp(
        "run-bad.toml",
        "[[link]]\nname = \"wan\"\ninterfaces = [\"eth0\"]\ncapacity = \"fast\"\n",
    );
    let board = std::env::temp_dir().join(format!("lp-{}-run-bad-board", std::process::id()));
    let (code, _, err) =
        linkpilot(&["run", "--policy", bad.to_str().unwrap(), "--board", board.to_str().unwrap()]);
    let _ = std::fs::remove_file(&bad);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("run-bad.toml:4:12: invalid rate \"fast\""), "{err}");
    assert!(!board.exists(), "nothing was created");
}

/// `policy init` for the reference case's link (40 Gbit/s, 180 ms) on `interface` toward `peer`.
fn hk_us_init(interface: &str, peer: &str) -> (i32, String, String) {
    linkpilot(&[
        "policy",
        "init",
        "--link",
        "hk-us",
        "--interface",
        interface,
        "--peer",
        peer,
        "--capacity",
        "40Gbit/s",
        "--rtt",
        "180ms",
    ])
}

#[test]
fn policy_init_writes_a_policy_that_policy_check_passes() {
    let (code, out, err) = hk_us_init("eth2", "us=10.2.0.0/16,2001:db8:2::/64");
    assert_eq!(code, 0, "{err}");
    let file = temp("init.toml", &out);
    let (code, checked, err) = linkpilot(&["policy", "check", &file.display().to_string()]);
    assert_eq!(code, 0, "{checked}{err}\n{out}");
    // Bad answers: what is wrong, nothing printed as a policy.
    let (code, out, err) = linkpilot(&[
        "policy",
        "init",
        "--interface",
        "eth2",
        "--capacity",
        "40Gbit",
        "--rtt",
        "1s",
    ]);
    assert_ne!(code, 0);
    assert!(out.is_empty() && err.contains("40Gbit"), "{out}{err}");
    let (code, out, err) = linkpilot(&[
        "policy",
        "init",
        "--interface",
        "eth2",
        "--peer",
        "us=10.0.0.300/8",
        "--capacity",
        "1Gbit/s",
        "--rtt",
        "10ms",
    ]);
    assert_eq!((code, out.is_empty()), (1, true), "{out}");
    assert!(err.contains("10.0.0.300/8"), "{err}");
}

/// `policy init` for the lab's link decides as the shipped hk-us.toml on recorded traces (a
/// congestion day and the training day hk-us.toml was tuned on): the same states, codecs and
/// sync plan, change by change.
#[test]
fn policy_init_replays_a_lab_trace_as_the_shipped_hk_us_policy() {
    let (code, init, err) = hk_us_init("eth0", "us=198.18.2.0/24,2001:db8:2::/64");
    assert_eq!(code, 0, "{err}");
    let init = temp("init-lab.toml", &init);
    let replay = |trace: &str, policy: &str| {
        let (code, out, err) = linkpilot(&["replay", &repo(trace), "--policy", policy, "--json"]);
        assert_eq!(code, 0, "{policy}: {err}");
        out.lines()
            .map(|l| {
                let d: serde_json::Value = serde_json::from_str(l).expect("a JSON decision");
                let k = &d["knobs"];
                (
                    d["at_ms"].clone(),
                    d["state"].clone(),
                    k["compression"].clone(),
                    k["sync"].clone(),
                )
            })
            // The bounds differ (sized for the link, not hand-tuned), and so do the chunk's
            // changes: the decisions that change the state, codec or sync plan are compared.
            .fold(Vec::new(), |mut v: Vec<(_, _, _, _)>, d| {
                if v.last().is_none_or(|l| (&l.1, &l.2, &l.3) != (&d.1, &d.2, &d.3)) {
                    v.push(d);
                }
                v
            })
    };
    for trace in [TRACE, TRAINING_DAY] {
        let ours = replay(trace, &init.display().to_string());
        let shipped = replay(trace, &repo("policies/hk-us.toml"));
        let states: std::collections::BTreeSet<String> =
            ours.iter().map(|d| d.1.to_string()).collect();
        assert!(states.len() >= 3, "{trace} walks the ladder: {ours:?}");
        assert_eq!(ours, shipped, "{trace}");
    }
    // And `policy check` has nothing to warn of but what this host lacks.
    let (code, out, err) = linkpilot(&["policy", "check", &init.display().to_string()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!err.contains("dscp"), "{err}");
}

#[test]
fn the_recipes_dscp_on_tcp_is_warned_of_and_still_checks() {
    let shipped = std::fs::read_to_string(repo("policies/hk-us.toml")).expect("hk-us.toml");
    let (_, _, err) = linkpilot(&["policy", "check", &repo("policies/hk-us.toml")]);
    assert!(!err.contains("warning"), "the shipped policy keeps TCP's DSCP: {err}");
    // The RoCE class's DSCP on TCP too, as the recipe's 106 suggests.
    let marked = shipped.replace("dscp = \"keep\"", "dscp = 26");
    assert_ne!(marked, shipped);
    let file = temp("hk-us-dscp-26.toml", &marked);
    let (code, out, err) = linkpilot(&["policy", "check", &file.display().to_string()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        err.contains("warning: dscp = 26 on TCP is the DSCP of the policy's roce_traffic_class"),
        "{err}"
    );
}

#[test]
fn an_interface_this_host_lacks_is_a_warning_not_an_error() {
    let (_, policy, _) = linkpilot(&[
        "policy",
        "init",
        "--interface",
        "lpnosuch0",
        "--capacity",
        "1Gbit/s",
        "--rtt",
        "10ms",
    ]);
    let file = temp("missing-iface.toml", &policy);
    let (code, out, err) = linkpilot(&["policy", "check", &file.display().to_string()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(": OK (sha256 "), "{out}");
    assert!(err.contains("warning: link \"wan\": no interface lpnosuch0 on this host"), "{err}");
    // One this host has: no warning.
    // (No transport profile: one naming BBR draws a warning where tcp_bbr is not loaded.)
    let (_, policy, _) = linkpilot(&[
        "policy",
        "init",
        "--interface",
        "lo",
        "--capacity",
        "1Gbit/s",
        "--rtt",
        "1ms",
        "--no-transport",
    ]);
    let file = temp("lo.toml", &policy);
    let (code, out, err) = linkpilot(&["policy", "check", &file.display().to_string()]);
    assert_eq!((code, err.as_str()), (0, ""), "{out}");
}

/// `replay --plans`: one plan per snapshot, and at each decision's snapshot the plan holds what
/// the decision set (state, knobs, its id).
#[test]
fn replay_prints_a_plan_per_snapshot_that_carries_each_decision() {
    let hk_us = repo("policies/hk-us.toml");
    let run = |flag: &str| {
        let (code, out, err) = linkpilot(&["replay", &repo(TRACE), "--policy", &hk_us, flag]);
        assert_eq!(code, 0, "{err}");
        out.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON"))
            .collect::<Vec<_>>()
    };
    let plans = run("--plans");
    let trace = std::fs::read_to_string(repo(TRACE)).expect("trace");
    assert_eq!(plans.len(), trace.lines().filter(|l| !l.trim().is_empty()).count());
    let decisions = run("--json");
    assert!(decisions.len() >= 3, "{decisions:?}");
    for d in &decisions {
        let p = plans.iter().find(|p| p["at_ms"] == d["at_ms"]).expect("a plan at the decision");
        let link = &p["links"][0];
        assert_eq!((&link["state"], &link["knobs"]), (&d["state"], &d["knobs"]), "{p}");
        assert_eq!(link["decision"], d["id"], "{p}");
    }
    let (code, _, err) =
        linkpilot(&["replay", &repo(TRACE), "--policy", &hk_us, "--json", "--plans"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot be used with"), "{err}");
}
