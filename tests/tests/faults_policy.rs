//! The policy file replaced 100 times a second for some seconds, by atomic renames and by
//! in-place writes in two parts, valid and invalid contents alternating, under real traffic
//! (iperf3): the daemon keeps deciding, never runs an invalid policy (its status names the
//! running policy's state, and invalid versions name theirs "bad..."), ends on the last valid
//! one, and leaves the namespace as it found it.

use std::{
    io::Write,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use linkpilot_tests::{
    daemon::{status_json, wait_for, Daemon},
    faults::{self, end, iperf3, policy, HostBefore},
    netns::Pair,
    oracle,
};

/// Seconds of replacing: `LINKPILOT_FAULT_SECONDS` (default 3).
fn seconds() -> u64 {
    std::env::var("LINKPILOT_FAULT_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3)
}

fn state(dir: &std::path::Path) -> String {
    status_json(dir)["links"][0]["state"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn a_policy_replaced_100_times_a_second_never_runs_an_invalid_version() {
    let pair = Pair::new("198.18.142.1", "198.18.142.2");
    let dir = faults::temp_dir("policy");
    let mut host = HostBefore::read(&pair.a.name);
    let valid = |i: u32| policy(pair.a_if, pair.b_addr, &format!("v{i}"), (i % 64) as u8);
    // Invalid two ways: not TOML, and TOML whose check fails (DSCP past 63).
    let invalid = |i: u32| {
        if i % 4 == 1 {
            format!("[[link]\nname = \"bad{i}\"")
        } else {
            policy(pair.a_if, pair.b_addr, &format!("bad{i}"), 64 + (i % 100) as u8)
        }
    };
    let path = dir.join("policy.toml");
    let mut d = Daemon::start(&pair.a.name, &dir, &valid(0));
    d.wait_up();
    host.assert_one_set_attached(d.child.id());
    let procs = iperf3(&pair, 30, "20M");

    // A watcher: every state the status shows while the file churns.
    let stop_watch = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (dir, stop_watch) = (dir.clone(), stop_watch.clone());
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            while !stop_watch.load(Ordering::Relaxed) {
                let s = state(&dir);
                if seen.last() != Some(&s) {
                    seen.push(s);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            seen
        })
    };
    let (t0, start) = (faults::ticks(&dir), Instant::now());
    let (mut writes, mut i) = (0u32, 1u32);
    while start.elapsed() < Duration::from_secs(seconds()) {
        let text = if i.is_multiple_of(2) { valid(i) } else { invalid(i) };
        if i.is_multiple_of(3) {
            let tmp = dir.join("policy.new");
            std::fs::write(&tmp, &text).expect("write");
            std::fs::rename(&tmp, &path).expect("rename");
        } else {
            // In place, in two writes: a reader in between sees half a file.
            let mut f = std::fs::File::create(&path).expect("truncate");
            let (a, b) = text.as_bytes().split_at(text.len() / 2);
            f.write_all(a).expect("first half");
            std::thread::sleep(Duration::from_millis(2));
            f.write_all(b).expect("second half");
        }
        writes += 1;
        i += 1;
        std::thread::sleep(Duration::from_millis(8));
    }
    let churned = start.elapsed();
    // The last version written is valid: the daemon ends on it.
    let last = valid(100_000);
    std::fs::write(dir.join("policy.new"), &last).expect("write");
    std::fs::rename(dir.join("policy.new"), &path).expect("rename");
    wait_for("the last valid version", Duration::from_secs(3), || state(&dir) == "v100000");
    let recovered = start.elapsed() - churned;
    stop_watch.store(true, Ordering::Relaxed);
    let seen = watcher.join().expect("watcher");
    let ticks = faults::ticks(&dir) - t0;
    let st = status_json(&dir);
    let (applied, rejected) = (st["reloads_applied"].as_u64(), st["reloads_rejected"].as_u64());
    eprintln!(
        "{writes} replacements in {churned:.1?} ({:.0}/s): {applied:?} applied, {rejected:?} \
         rejected, {} states shown, {ticks} ticks; the last one running {recovered:.1?} after",
        f64::from(writes) / churned.as_secs_f64(),
        seen.len()
    );
    let bad: Vec<&String> = seen.iter().filter(|s| !s.starts_with('v')).collect();
    assert!(bad.is_empty(), "an invalid version ran: {bad:?} (all: {seen:?})");
    // Applied includes the last valid version's reload. Whether a once-a-second check met an
    // invalid version during the churn is chance (three samples): the rejection is shown below.
    assert!(applied > Some(0), "{st}");
    let secs = start.elapsed().as_secs_f64();
    assert!(ticks as f64 >= secs * 10.0 * 0.7, "{ticks} ticks in {secs:.1} s");
    // One more invalid version in place: rejected, the last valid one stays.
    std::fs::write(&path, invalid(3)).expect("write");
    wait_for("the rejection", Duration::from_secs(3), || {
        status_json(&dir)["reloads_rejected"].as_u64() > rejected
    });
    assert_eq!(state(&dir), "v100000");
    // Status names the running version by its digest: the last valid one's, as sha256sum has it.
    let copy = dir.join("policy.last");
    std::fs::write(&copy, &last).expect("write");
    assert_eq!(status_json(&dir)["policy_sha256"], oracle::sha256sum(&copy).as_str());
    assert!(d.child.try_wait().expect("wait").is_none(), "{}", d.log());
    end(procs);
    host.stop_and_assert_unchanged(&mut d);
    let _ = std::fs::remove_dir_all(&dir);
}
