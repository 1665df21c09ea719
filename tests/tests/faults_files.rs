//! The daemon's files on file systems that fail under it, with real traffic (iperf3): a decision
//! log on a tiny tmpfs that fills up, and a run directory that is read-only at the start or
//! becomes read-only during the run. The daemon keeps deciding or refuses to start with the
//! reason, says so, recovers when the file system does, and leaves the namespace as it was.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use linkpilot_tests::{
    daemon::{sample, scrape, status_json, wait_for, Daemon},
    faults::{self, end, iperf3, policy, HostBefore},
    netns::Pair,
    run, sh,
};
use nix::{sys::signal::Signal, unistd::Pid};

/// A tmpfs of `size` on `at`, unmounted when dropped (also on failure).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn new(at: &Path, opts: &str) -> Self {
        std::fs::create_dir_all(at).expect("mount point");
        sh(&["mount", "-t", "tmpfs", "-o", opts, "lp-faults", at.to_str().expect("utf-8")]);
        Self(at.to_owned())
    }

    fn remount(&self, opts: &str) -> std::process::Output {
        // (Only the refused remount uses this.)
        run(&["mount", "-o", &format!("remount,{opts}"), self.0.to_str().expect("utf-8")])
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = run(&["umount", "-l", self.0.to_str().unwrap_or("")]);
    }
}

/// A reload that flips the DSCP knob: one decision each (the core decides after a reload).
fn flip(d: &Daemon, pair: &Pair, i: u32) {
    let text = policy(pair.a_if, pair.b_addr, "healthy", if i.is_multiple_of(2) { 26 } else { 10 });
    std::fs::write(d.dir.join("policy.new"), text).expect("policy");
    std::fs::rename(d.dir.join("policy.new"), d.dir.join("policy.toml")).expect("rename");
    nix::sys::signal::kill(Pid::from_raw(d.child.id() as i32), Signal::SIGHUP).expect("SIGHUP");
}

fn applied(dir: &Path) -> u64 {
    status_json(dir)["reloads_applied"].as_u64().unwrap_or(0)
}

/// `n` reloads, each waited for.
fn decide(d: &Daemon, pair: &Pair, from: u32, n: u32) {
    for i in from..from + n {
        let before = applied(&d.dir);
        flip(d, pair, i);
        wait_for("a reload", Duration::from_secs(3), || applied(&d.dir) > before);
    }
}

/// Every line of the decision log is a whole JSON decision; their ids.
fn logged_ids(path: &Path) -> Vec<u64> {
    let text = std::fs::read_to_string(path).expect("decision log");
    assert!(text.is_empty() || text.ends_with('\n'), "a torn last line");
    text.lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("a torn line ({e}): {l:?}"));
            v["id"].as_u64().expect("id")
        })
        .collect()
}

#[test]
fn a_full_decision_log_disk_loses_lines_whole_and_the_daemon_decides_on() {
    let pair = Pair::new("198.18.143.1", "198.18.143.2");
    let dir = faults::temp_dir("fulldisk");
    let logs = Tmpfs::new(&dir.join("logs"), "size=64k");
    let log = dir.join("logs/decisions.jsonl");
    let log_arg = log.display().to_string();
    let mut host = HostBefore::read(&pair.a.name);
    let mut d = Daemon::start_with(
        &pair.a.name,
        &dir,
        &policy(pair.a_if, pair.b_addr, "healthy", 26),
        &["--decision-log", &log_arg],
    );
    d.wait_up();
    let procs = iperf3(&pair, 60, "20M");
    decide(&d, &pair, 1, 3);
    let before = logged_ids(&log).len();
    // Fill the file system to its last byte.
    let fill = run(&["dd", "if=/dev/zero", &format!("of={}/logs/fill", dir.display()), "bs=512"]);
    assert!(String::from_utf8_lossy(&fill.stderr).contains("No space left"), "{fill:?}");
    let (ticks, took) = faults::ticks_during(&dir, || decide(&d, &pair, 4, 20));
    let m = scrape(&pair.a.name);
    let lost = sample(&m, "linkpilot_log_write_errors_total{file=\"decision_log\"}");
    let during = logged_ids(&log).len() - before;
    eprintln!(
        "disk full: 20 decisions, {during} logged, {lost:?} lost, {ticks} ticks in {took:.1?}"
    );
    assert!(lost >= Some(15.0), "lines lost and counted: {lost:?}");
    assert!(ticks as f64 >= took.as_secs_f64() * 10.0 * 0.7, "{ticks} ticks in {took:?}");
    assert!(d.log().contains("its lines are lost"), "{}", d.log());
    // Space again: the next decisions are logged, whole, and the daemon says how many were lost.
    std::fs::remove_file(dir.join("logs/fill")).expect("rm");
    decide(&d, &pair, 24, 3);
    let ids = logged_ids(&log);
    assert!(ids.len() >= before + during + 3, "logged again: {ids:?}");
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids in order: {ids:?}");
    assert!(d.log().contains("writing again;"), "{}", d.log());
    end(procs);
    host.stop_and_assert_unchanged(&mut d);
    drop(logs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The daemon on `pair`'s first end, its run files all in `dir/run` (the healthy state, DSCP 26).
fn start_with_run_dir(pair: &Pair, dir: &Path) -> Daemon {
    let args = run_paths(&dir.join("run"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Daemon::start_with(&pair.a.name, dir, &policy(pair.a_if, pair.b_addr, "healthy", 26), &args)
}

/// Every path `run` writes, in `run_dir`.
fn run_paths(run_dir: &Path) -> Vec<String> {
    let mut args = Vec::new();
    for (flag, file) in [
        ("--board", "knobs"),
        ("--env-file", "nccl.env"),
        ("--sysctl-state", "sysctl.json"),
        ("--roce-tc-state", "roce-tc.json"),
        ("--lock", "linkpilot.lock"),
        ("--tuner-stats", "tuner"),
        ("--job-reports", "jobs"),
    ] {
        args.push(flag.to_owned());
        args.push(run_dir.join(file).display().to_string());
    }
    args
}

#[test]
fn a_read_only_run_dir_at_the_start_is_refused_with_the_reason_and_changes_nothing() {
    let pair = Pair::new("198.18.144.1", "198.18.144.2");
    let dir = faults::temp_dir("ro-start");
    let ro = Tmpfs::new(&dir.join("run"), "ro,size=1m");
    let host = HostBefore::read(&pair.a.name);
    let mut d = start_with_run_dir(&pair, &dir);
    let mut status = None;
    wait_for("linkpilot run to refuse", Duration::from_secs(20), || {
        status = d.child.try_wait().expect("wait");
        status.is_some()
    });
    let log = d.log();
    assert!(!status.expect("exited").success(), "{log}");
    assert!(log.contains("linkpilot.lock") && log.contains("Read-only file system"), "{log}");
    assert!(!log.contains("attached"), "refused before anything was attached: {log}");
    host.assert_sysctls_unchanged();
    drop(ro);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_run_dir_gone_read_only_during_the_run_leaves_actuators_pending_and_decisions_going() {
    let pair = Pair::new("198.18.145.1", "198.18.145.2");
    let dir = faults::temp_dir("ro-run");
    let run_dir = Tmpfs::new(&dir.join("run"), "size=1m");
    let mut host = HostBefore::read(&pair.a.name);
    let mut d = start_with_run_dir(&pair, &dir);
    d.wait_up();
    let procs = iperf3(&pair, 60, "20M");
    // The kernel refuses to remount a file system read-only while files on it are open for
    // writing (the board's mapping, the lock): /run cannot turn read-only under the daemon
    // that way. What can happen is a read-only file system mounted over it.
    let remount = run_dir.remount("ro");
    assert!(String::from_utf8_lossy(&remount.stderr).contains("busy"), "{remount:?}");
    let over = Tmpfs::new(&dir.join("run"), "ro,size=1m");
    let env_pending = || {
        status_json(&dir)["actuators"]
            .as_array()
            .and_then(|a| a.iter().find(|a| a["actuator"] == "env_file").cloned())
            .unwrap_or_default()["pending"]
            == true
    };
    let (ticks, took) = faults::ticks_during(&dir, || {
        decide(&d, &pair, 1, 5);
        wait_for("env_file pending", Duration::from_secs(3), env_pending);
        std::thread::sleep(Duration::from_secs(2));
    });
    eprintln!("read-only: {ticks} ticks in {took:.1?}");
    assert!(ticks as f64 >= took.as_secs_f64() * 10.0 * 0.7, "{ticks} ticks in {took:?}");
    assert!(d.child.try_wait().expect("wait").is_none(), "{}", d.log());
    drop(over);
    wait_for("env_file in place again", Duration::from_secs(3), || !env_pending());
    end(procs);
    host.stop_and_assert_unchanged(&mut d);
    drop(run_dir);
    let _ = std::fs::remove_dir_all(&dir);
}
