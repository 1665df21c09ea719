//! What the daemon changes outside itself is undone truly and said honestly, judged from
//! outside: a SIGKILLed run's RoCE class and host sysctl go back to the values from before it
//! (not what the killed run left), an administrator's change made during a run survives its stop (`sysctl -n`,
//! the configfs file), and an actuator that cannot write shows as pending in status, metrics and
//! on the board until it holds, with no new decision needed.

use std::sync::LazyLock;

use linkpilot_tests::policy::PolicyToml;
use linkpilot_tests::rdma::RdmaFixture;
use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use linkpilot::board::BoardReader;
use linkpilot_common::board::pending;
use linkpilot_tests::{
    daemon::{sample, scrape, status_table, sysctl, wait_for, Daemon},
    netns::Pair,
};
use nix::{sys::signal::Signal, unistd::Pid};

static POLICY: LazyLock<String> = LazyLock::new(|| {
    PolicyToml::new()
        .table("[host]\ntcp_ecn = 1\ntcp_slow_start_after_idle = 0")
        // The test addresses (a policy naming no peer only observes).
        .link("wan", "lpa0", "50Mbit/s", Some(("lab", "198.18.0.0/15")))
        .healthy()
        .congested_on_ce(10, 42)
        .build()
});

/// The ConnectX sysfs fixture with port 1 on `iface`, and an rdma_cm configfs look-alike whose
/// class is 0: the `run` arguments for them and the class file.
fn rdma_fixture(dir: &Path, iface: &str) -> (Vec<String>, PathBuf) {
    let rdma = RdmaFixture::create(dir, iface);
    (rdma.args(), rdma.tos)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default().trim().to_owned()
}

/// `linkpilot status --json`, or null while the daemon does not answer yet.
fn status(dir: &Path) -> serde_json::Value {
    linkpilot_tests::daemon::try_status_json(dir).unwrap_or_default()
}

fn stop(d: &mut Daemon) {
    nix::sys::signal::kill(Pid::from_raw(d.child.id() as i32), Signal::SIGTERM).expect("SIGTERM");
    assert!(d.child.wait().expect("exit").success(), "{}", d.log());
}

#[test]
fn a_sigkilled_runs_roce_class_goes_back_to_the_value_from_before_it() {
    let pair = Pair::new("198.18.71.1", "198.18.71.2");
    let dir = linkpilot_tests::temp_dir("rev-roce-kill");
    let (rdma, tos) = rdma_fixture(&dir, pair.a_if);
    let mut extra: Vec<&str> = rdma.iter().map(String::as_str).collect();
    extra.extend(["--metrics-addr", "off"]);
    const IDLE: &str = "net.ipv4.tcp_slow_start_after_idle";
    assert_eq!(sysctl(&pair.a.name, IDLE), "1", "a fresh namespace's window restart");
    let mut first = Daemon::start_with(&pair.a.name, &dir, &POLICY, &extra);
    first.wait_up();
    wait_for("the first run's class and window setting", Duration::from_secs(5), || {
        read(&tos) == "106" && sysctl(&pair.a.name, IDLE) == "0"
    });
    assert!(dir.join("roce-tc.json").exists(), "the original is saved before the write");
    first.child.kill().expect("SIGKILL");
    first.child.wait().expect("exit");
    assert_eq!(read(&tos), "106", "a killed run restores nothing");
    assert_eq!(sysctl(&pair.a.name, IDLE), "0");

    std::fs::remove_file(dir.join("knobs")).expect("the old board");
    let mut second = Daemon::start_with(&pair.a.name, &dir, &POLICY, &extra);
    second.wait_up();
    wait_for("the second run's board", Duration::from_secs(5), || {
        BoardReader::open(&dir.join("knobs"))
            .and_then(|b| b.read())
            .is_ok_and(|b| b.header.n_links == 1)
    });
    assert_eq!(read(&tos), "106", "the second run's own class");
    let log = second.log();
    assert!(log.contains("a previous run left RoCE traffic classes changed"), "{log}");
    stop(&mut second);
    // The value from before the first run, not the 106 the killed run left.
    assert_eq!(read(&tos), "0", "{}", second.log());
    assert_eq!(sysctl(&pair.a.name, IDLE), "1", "{}", second.log());
    assert!(!dir.join("roce-tc.json").exists(), "nothing left to restore");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_administrators_change_during_the_run_survives_the_stop() {
    let pair = Pair::new("198.18.72.1", "198.18.72.2");
    let ns = pair.a.name.clone();
    let dir = linkpilot_tests::temp_dir("rev-admin");
    let (rdma, tos) = rdma_fixture(&dir, pair.a_if);
    let mut extra: Vec<&str> = rdma.iter().map(String::as_str).collect();
    extra.extend(["--metrics-addr", "off"]);
    let original = sysctl(&ns, "net.ipv4.tcp_ecn");
    assert!(original != "1" && original != "0", "a fresh namespace's tcp_ecn: {original}");
    let mut d = Daemon::start_with(&ns, &dir, &POLICY, &extra);
    d.wait_up();
    wait_for("the policy's tcp_ecn and class", Duration::from_secs(5), || {
        sysctl(&ns, "net.ipv4.tcp_ecn") == "1" && read(&tos) == "106"
    });
    // Values that are neither the daemon's nor the originals.
    pair.a.exec(&["sysctl", "-qw", "net.ipv4.tcp_ecn=0"]);
    std::fs::write(&tos, "184\n").expect("the administrator's class");
    stop(&mut d);
    let log = d.log();
    assert_eq!(sysctl(&ns, "net.ipv4.tcp_ecn"), "0", "{log}");
    assert_eq!(read(&tos), "184", "{log}");
    assert!(log.contains("changed by someone else"), "{log}");
    assert!(!dir.join("sysctl.json").exists() && !dir.join("roce-tc.json").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A tmpfs mounted read-only on a directory, unmounted when dropped (also on failure).
struct ReadOnlyMount(PathBuf);

impl ReadOnlyMount {
    fn new(at: &Path) -> Self {
        std::fs::create_dir_all(at).expect("mount point");
        let at_s = at.to_str().expect("utf-8");
        linkpilot_tests::sh(&["mount", "-t", "tmpfs", "-o", "ro,size=1m", "lp-rev", at_s]);
        Self(at.to_owned())
    }

    fn make_writable(&self) {
        linkpilot_tests::sh(&["mount", "-o", "remount,rw", self.0.to_str().expect("utf-8")]);
    }
}

impl Drop for ReadOnlyMount {
    fn drop(&mut self) {
        let _ = linkpilot_tests::run(&["umount", self.0.to_str().unwrap_or("")]);
    }
}

#[test]
fn a_failing_actuator_is_pending_until_it_holds() {
    let pair = Pair::new("198.18.73.1", "198.18.73.2");
    let ns = pair.a.name.clone();
    let dir = linkpilot_tests::temp_dir("rev-pending");
    // The env file's directory is a read-only file system (EROFS) until the test fixes it.
    let ro = ReadOnlyMount::new(&dir.join("run"));
    let env_file = dir.join("run/nccl.env");
    let env_arg = env_file.display().to_string();
    let mut d = Daemon::start_with(&ns, &dir, &POLICY, &["--env-file", &env_arg]);
    let env_status = || {
        status(&dir)["actuators"]
            .as_array()
            .and_then(|a| a.iter().find(|a| a["actuator"] == "env_file").cloned())
            .unwrap_or_default()
    };
    wait_for("env_file pending in status", Duration::from_secs(20), || {
        env_status()["pending"] == true
    });
    let st = env_status();
    assert_eq!(st["wanted"], "wan healthy #1", "{st}");
    assert!(st["applied"].is_null(), "nothing written yet: {st}");
    assert!(st["pending_since"].as_f64().is_some_and(|t| t > 0.0), "{st}");
    let error = st["last_error"].as_str().unwrap_or_default();
    assert!(error.contains(&env_arg) && error.contains("Read-only file system"), "{st}");
    let m = scrape(&ns);
    assert_eq!(sample(&m, "linkpilot_actuator_pending{actuator=\"env_file\"}"), Some(1.0), "{m}");
    assert_eq!(sample(&m, "linkpilot_actuator_pending{actuator=\"dscp\"}"), Some(0.0), "{m}");
    assert!(sample(&m, "linkpilot_actuator_errors_total{actuator=\"env_file\"}")
        .is_some_and(|n| n >= 1.0));
    // The board shows the decision, and that its env file part is not in place.
    let board = BoardReader::open(&dir.join("knobs")).expect("board");
    let b = board.read().expect("read");
    assert_eq!((b.header.n_links, b.header.pending), (1, pending::ENV_FILE));
    // Retried every tick: a few ticks after the file system is writable it holds, with the
    // same decision (no new one is needed).
    let errors_before = st["errors"].as_u64().unwrap_or(0);
    ro.make_writable();
    wait_for("the env file", Duration::from_secs(3), || env_file.exists());
    let env = std::fs::read_to_string(&env_file).expect("env file");
    assert!(env.contains("LINKPILOT_STATE=healthy") && env.contains("NCCL_IB_TC=106"), "{env}");
    wait_for("env_file in place in status", Duration::from_secs(3), || {
        env_status()["pending"] == false
    });
    let st = env_status();
    assert_eq!(st["applied"], "wan healthy #1", "{st}");
    assert!(st["pending_since"].is_null() && st["errors"].as_u64() >= Some(errors_before));
    let m = scrape(&ns);
    assert_eq!(sample(&m, "linkpilot_actuator_pending{actuator=\"env_file\"}"), Some(0.0), "{m}");
    assert_eq!(board.read().expect("read").header.pending, 0);
    let table = status_table(&dir);
    assert!(table.contains("env_file     in place: wan healthy #1"), "{table}");
    stop(&mut d);
    drop(ro);
    let _ = std::fs::remove_dir_all(&dir);
}
