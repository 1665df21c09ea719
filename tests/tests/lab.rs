//! The WAN lab: fidelity against ping, iperf3, tcpdump and tshark (the same checks as
//! `linkpilot-lab selftest`), teardown, crash cleanup and bad scenario files.

use std::{
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use linkpilot_lab::{
    lab::{cleanup_stale, Lab, LabConfig},
    scenario::Scenario,
    selftest,
};
use linkpilot_tests::{lab_bin, run, sh};

/// One test per fidelity check of `linkpilot-lab selftest`: it must run and pass.
macro_rules! selftests {
    ($($name:ident: $check:path;)*) => {$(
        #[test]
        fn $name() {
            let f = $check().unwrap_or_else(|e| panic!("check could not run: {e:#}"));
            eprintln!("{f}");
            assert!(f.pass, "{f}");
        }
    )*};
}

selftests! {
    ping_rtt_matches_configured_rtt: selftest::rtt;
    iperf3_throughput_matches_bottleneck_rate: selftest::throughput;
    ce_marks_seen_by_tshark_equal_lab_count: selftest::ce_marks;
    ping_loss_matches_configured_loss: selftest::loss;
    outage_stops_traffic_for_its_duration: selftest::outage;
}

fn namespaces() -> Vec<String> {
    sh(&["ip", "netns", "list"])
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn drop_tears_everything_down() {
    let lab = Lab::start(
        LabConfig { name: "tdrop".into(), hosts_per_site: 2, seed: 1 },
        Scenario::load("steady-180ms").expect("built-in"),
    )
    .expect("lab starts");
    let made: Vec<String> =
        namespaces().into_iter().filter(|n| n.starts_with("lpl-tdrop-")).collect();
    assert_eq!(made.len(), 5, "router + 2 hosts per site: {made:?}");
    drop(lab);
    let left: Vec<String> =
        namespaces().into_iter().filter(|n| n.starts_with("lpl-tdrop-")).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(!std::path::Path::new("/run/linkpilot-lab/tdrop.json").exists());
}

/// `linkpilot-lab run` of `scenario` as lab `name`, returned once its last namespace exists.
fn cli_lab(name: &str, scenario: &str) -> std::process::Child {
    let child = Command::new(lab_bin())
        .args(["run", "--name", name, "--scenario", scenario])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start linkpilot-lab");
    let deadline = Instant::now() + Duration::from_secs(20);
    let last = format!("lpl-{name}-us0");
    while !namespaces().contains(&last) {
        assert!(Instant::now() < deadline, "lab did not come up");
        thread::sleep(Duration::from_millis(100));
    }
    child
}

#[test]
fn restart_after_a_crash_removes_exactly_what_the_crashed_run_made() {
    let mut child = cli_lab("tcrash", "steady-180ms");
    thread::sleep(Duration::from_millis(500));
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    // Someone else's namespace that merely looks like ours must survive the cleanup.
    sh(&["ip", "netns", "add", "lpl-tcrash-other"]);
    let crashed: Vec<String> =
        namespaces().into_iter().filter(|n| n.starts_with("lpl-tcrash-")).collect();
    assert_eq!(crashed.len(), 4, "the killed run left its namespaces: {crashed:?}");

    let deleted = cleanup_stale("tcrash").expect("cleanup");
    let mut deleted_sorted = deleted.clone();
    deleted_sorted.sort();
    assert_eq!(deleted_sorted, ["lpl-tcrash-hk0", "lpl-tcrash-us0", "lpl-tcrash-wan"]);
    let survivors: Vec<String> =
        namespaces().into_iter().filter(|n| n.starts_with("lpl-tcrash-")).collect();
    assert_eq!(survivors, ["lpl-tcrash-other"]);
    sh(&["ip", "netns", "del", "lpl-tcrash-other"]);
}

#[test]
fn sigterm_tears_the_cli_lab_down() {
    let mut child = cli_lab("tterm", "outage");
    run(&["kill", "-TERM", &child.id().to_string()]);
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status}");
    assert!(namespaces().iter().all(|n| !n.starts_with("lpl-tterm-")), "{:?}", namespaces());
}

#[test]
fn bad_scenario_names_line_and_column_and_starts_nothing() {
    let dir = std::env::temp_dir().join(format!("lpl-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let file = dir.join("bad.toml");
    std::fs::write(&file, "name = \"bad\"\n[[phase]]\nname = \"a\"\nduration = \"10s\"\n[phase.link]\nrate = \"200 Mbps\"\n")
        .expect("write");
    let before = namespaces();
    let out = run(&[
        lab_bin().to_str().expect("utf-8"),
        "run",
        "--name",
        "tbad",
        "--scenario",
        file.to_str().expect("utf-8"),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("{}:6:8: field `rate`: invalid rate \"200 Mbps\"", file.display())),
        "{err}"
    );
    assert_eq!(namespaces(), before, "a bad scenario created namespaces");
    let _ = std::fs::remove_dir_all(&dir);
}
