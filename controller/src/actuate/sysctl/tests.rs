//! The sysctls against a /proc/sys look-alike.

use super::*;

/// A /proc/sys look-alike with the defaults of a stock kernel, and the state file's path beside
/// it; both go with the returned directory.
fn tree(name: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::Builder::new().prefix(&format!("lp-sysctl-{name}-")).tempdir().unwrap();
    let root = dir.path().join("sys");
    fs::create_dir_all(root.join("net/core")).unwrap();
    fs::create_dir_all(root.join("net/ipv4")).unwrap();
    fs::write(root.join("net/core/rmem_max"), "212992\n").unwrap();
    fs::write(root.join("net/core/wmem_max"), "212992\n").unwrap();
    fs::write(root.join("net/ipv4/tcp_rmem"), "4096\t131072\t6291456\n").unwrap();
    fs::write(root.join("net/ipv4/tcp_wmem"), "4096\t16384\t4194304\n").unwrap();
    fs::write(root.join(TCP_ECN), "2\n").unwrap();
    fs::write(root.join(NETDEV_MAX_BACKLOG), "1000\n").unwrap();
    let state = dir.path().join("state.json");
    (dir, root, state)
}

fn get(root: &Path, key: &str) -> String {
    read(&root.join(key)).unwrap()
}

#[test]
fn apply_then_restore() {
    let (_dir, root, state) = tree("restore");
    let mut s = Sysctls::open(&root, &state).unwrap();
    let changed = s.apply(128 << 20).unwrap();
    assert_eq!(changed.len(), 4, "{changed:?}");
    assert_eq!(get(&root, "net/core/rmem_max"), "134217728");
    assert_eq!(get(&root, "net/ipv4/tcp_wmem"), "4096 16384 134217728");
    assert!(state.exists(), "originals saved before the change");
    assert!(s.apply(128 << 20).unwrap().is_empty(), "nothing to do the second time");
    s.restore().unwrap();
    assert_eq!(get(&root, "net/core/rmem_max"), "212992");
    assert_eq!(get(&root, "net/ipv4/tcp_rmem"), "4096 131072 6291456");
    assert!(!state.exists());
}

#[test]
fn the_hosts_own_maximum_is_a_floor() {
    let (_dir, root, state) = tree("floor");
    let mut s = Sysctls::open(&root, &state).unwrap();
    // 1 MiB is above rmem_max (208 KiB) but below tcp_rmem's 6 MiB: only raises happen.
    s.apply(1 << 20).unwrap();
    assert_eq!(get(&root, "net/core/rmem_max"), "1048576");
    assert_eq!(get(&root, "net/ipv4/tcp_rmem"), "4096 131072 6291456", "never lowered");
    s.apply(128 << 20).unwrap();
    s.apply(1 << 20).unwrap();
    assert_eq!(get(&root, "net/ipv4/tcp_rmem"), "4096 131072 6291456", "back to the floor");
    s.restore().unwrap();
    assert_eq!(get(&root, "net/core/rmem_max"), "212992");
}

#[test]
fn a_crashed_run_is_undone_at_the_next_start() {
    let (_dir, root, state) = tree("crash");
    let mut s = Sysctls::open(&root, &state).unwrap();
    s.apply(64 << 20).unwrap();
    s.apply(256 << 20).unwrap();
    std::mem::forget(s); // SIGKILL: no restore
    assert_eq!(get(&root, "net/core/wmem_max"), "268435456");
    let _s = Sysctls::open(&root, &state).unwrap();
    // The originals from before the first change, not the intermediate 64 MiB.
    assert_eq!(get(&root, "net/core/wmem_max"), "212992");
    assert_eq!(get(&root, "net/ipv4/tcp_wmem"), "4096 16384 4194304");
    assert!(!state.exists());
}

#[test]
fn an_administrators_change_is_left_alone() {
    let (_dir, root, state) = tree("admin");
    let mut s = Sysctls::open(&root, &state).unwrap();
    s.apply(128 << 20).unwrap();
    fs::write(root.join("net/core/rmem_max"), "999999\n").unwrap();
    s.apply(256 << 20).unwrap();
    assert_eq!(get(&root, "net/core/rmem_max"), "999999", "not overwritten");
    assert_eq!(s.released(), ["net/core/rmem_max"]);
    assert_eq!(get(&root, "net/core/wmem_max"), "268435456", "the others still managed");
    s.restore().unwrap();
    assert_eq!(get(&root, "net/core/rmem_max"), "999999", "not restored over the admin");
    assert_eq!(get(&root, "net/core/wmem_max"), "212992");
}

#[test]
fn unexpected_values_are_errors_not_guesses() {
    let (_dir, root, state) = tree("bad");
    fs::write(root.join("net/ipv4/tcp_rmem"), "lots\n").unwrap();
    let mut s = Sysctls::open(&root, &state).unwrap();
    let err = s.apply(1 << 20).unwrap_err().to_string();
    assert!(err.contains("tcp_rmem") && err.contains("unexpected value"), "{err}");
    assert_eq!(get(&root, "net/core/rmem_max"), "212992", "nothing changed");
    assert!(!state.exists());
}

/// The reference case's `[host]`.
const RECIPE: [(&str, i64); 2] = [(TCP_ECN, 1), (NETDEV_MAX_BACKLOG, 250_000)];

#[test]
fn host_settings_follow_the_policy_and_go_back() {
    let (_dir, root, state) = tree("host");
    let mut s = Sysctls::open(&root, &state).unwrap();
    s.apply(128 << 20).unwrap();
    let changed = s.apply_host(&RECIPE).unwrap();
    assert_eq!(changed, ["net/ipv4/tcp_ecn 2 -> 1", "net/core/netdev_max_backlog 1000 -> 250000"]);
    assert_eq!(
        (get(&root, TCP_ECN), get(&root, NETDEV_MAX_BACKLOG)),
        ("1".into(), "250000".into())
    );
    let saved = fs::read_to_string(&state).unwrap();
    assert!(saved.contains("\"net/ipv4/tcp_ecn\": \"2\""), "{saved}");
    assert!(s.apply_host(&RECIPE).unwrap().is_empty(), "nothing to do the second time");
    // A reloaded policy with another value, then without tcp_ecn at all.
    s.apply_host(&[(TCP_ECN, 0), (NETDEV_MAX_BACKLOG, 250_000)]).unwrap();
    assert_eq!(get(&root, TCP_ECN), "0");
    let changed = s.apply_host(&[(NETDEV_MAX_BACKLOG, 250_000)]).unwrap();
    assert_eq!(changed, ["net/ipv4/tcp_ecn 0 -> 2"]);
    assert_eq!(get(&root, TCP_ECN), "2", "dropped: the original back");
    assert!(!fs::read_to_string(&state).unwrap().contains("tcp_ecn"), "and forgotten");
    // Asked for again: managed again, from the value now there.
    s.apply_host(&RECIPE).unwrap();
    assert_eq!(get(&root, TCP_ECN), "1");
    s.restore().unwrap();
    assert_eq!((get(&root, TCP_ECN), get(&root, NETDEV_MAX_BACKLOG)), ("2".into(), "1000".into()));
    assert_eq!(get(&root, "net/core/rmem_max"), "212992");
    assert!(!state.exists());
}

#[test]
fn host_settings_after_a_crash_an_administrator_or_in_a_namespace() {
    let (_dir, root, state) = tree("host-crash");
    let mut s = Sysctls::open(&root, &state).unwrap();
    s.apply_host(&RECIPE).unwrap();
    std::mem::forget(s); // SIGKILL: no restore
    let mut s = Sysctls::open(&root, &state).unwrap();
    assert_eq!((get(&root, TCP_ECN), get(&root, NETDEV_MAX_BACKLOG)), ("2".into(), "1000".into()));
    // An administrator's value is theirs: not overwritten, not restored.
    s.apply_host(&RECIPE).unwrap();
    fs::write(root.join(TCP_ECN), "0\n").unwrap();
    s.apply_host(&RECIPE).unwrap();
    assert_eq!(get(&root, TCP_ECN), "0");
    assert_eq!(s.released(), [TCP_ECN]);
    s.restore().unwrap();
    assert_eq!((get(&root, TCP_ECN), get(&root, NETDEV_MAX_BACKLOG)), ("0".into(), "1000".into()));
    // Absent (net.core outside the initial network namespace): left alone, the rest applies.
    fs::remove_file(root.join(NETDEV_MAX_BACKLOG)).unwrap();
    let mut s = Sysctls::open(&root, &state).unwrap();
    assert_eq!(s.apply_host(&RECIPE).unwrap(), ["net/ipv4/tcp_ecn 0 -> 1"]);
    assert_eq!(s.unmanaged(), [NETDEV_MAX_BACKLOG]);
    assert!(s.released().is_empty(), "absent is not an administrator's change");
    assert!(!root.join(NETDEV_MAX_BACKLOG).exists());
    s.restore().unwrap();
    assert_eq!(get(&root, TCP_ECN), "0");
}

#[test]
fn host_settings_are_all_checked_before_any_is_written() {
    let (_dir, root, state) = tree("host-bad");
    fs::write(root.join(NETDEV_MAX_BACKLOG), "many\n").unwrap();
    let mut s = Sysctls::open(&root, &state).unwrap();
    let err = s.apply_host(&RECIPE).unwrap_err().to_string();
    assert!(err.contains("netdev_max_backlog") && err.contains("unexpected value"), "{err}");
    assert_eq!(get(&root, TCP_ECN), "2", "nothing changed");
    assert!(!state.exists());
    let host = crate::control::policy::Host {
        tcp_ecn: Some(1),
        netdev_max_backlog: None,
        tcp_slow_start_after_idle: None,
    };
    assert_eq!(host_values(&host), [(TCP_ECN, 1)]);
}

#[test]
fn a_stop_leaves_an_administrators_value_alone() {
    let (_dir, root, state) = tree("stop-admin");
    let mut s = Sysctls::open(&root, &state).unwrap();
    s.apply(128 << 20).unwrap();
    s.apply_host(&RECIPE).unwrap();
    // Changed between our last write and the stop, with no apply in between.
    fs::write(root.join(TCP_ECN), "0\n").unwrap();
    fs::write(root.join("net/ipv4/tcp_rmem"), "4096 131072 7000000\n").unwrap();
    s.restore().unwrap();
    assert_eq!(get(&root, TCP_ECN), "0", "the administrator's, not our original 2");
    assert_eq!(get(&root, "net/ipv4/tcp_rmem"), "4096 131072 7000000");
    assert_eq!(s.released(), [TCP_ECN, "net/ipv4/tcp_rmem"]);
    assert_eq!(get(&root, NETDEV_MAX_BACKLOG), "1000", "ours: restored");
    assert_eq!(get(&root, "net/core/rmem_max"), "212992");
    assert!(!state.exists());
}

#[test]
fn a_crashed_runs_value_an_administrator_changed_stays_theirs() {
    let (_dir, root, state) = tree("crash-admin");
    let mut s = Sysctls::open(&root, &state).unwrap();
    s.apply(128 << 20).unwrap();
    s.apply_host(&RECIPE).unwrap();
    std::mem::forget(s); // SIGKILL
    fs::write(root.join("net/core/wmem_max"), "500000\n").unwrap();
    let s = Sysctls::open(&root, &state).unwrap();
    assert_eq!(get(&root, "net/core/wmem_max"), "500000", "theirs");
    assert_eq!(s.released(), ["net/core/wmem_max"]);
    assert_eq!(get(&root, "net/core/rmem_max"), "212992", "ours: restored");
    assert_eq!(get(&root, TCP_ECN), "2");
    assert!(!state.exists());
}

#[test]
fn a_state_file_naming_another_file_is_refused_and_nothing_changes() {
    let (_dir, root, state) = tree("escape");
    let victim = root.parent().unwrap().join("victim");
    fs::write(&victim, "precious\n").unwrap();
    for key in
        [victim.display().to_string(), "../victim".to_owned(), "net/core/../../victim".into()]
    {
        let text = serde_json::json!({ "values": { TCP_ECN: "0", key.as_str(): "owned" } });
        fs::write(&state, text.to_string()).unwrap();
        let err = Sysctls::open(&root, &state).err().expect("refused").to_string();
        assert!(err.contains(&state.display().to_string()), "{err}");
        assert!(err.contains(&format!("{key:?}")), "{err}");
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");
        assert_eq!(get(&root, TCP_ECN), "2", "nothing restored either");
        assert!(state.exists(), "left for the operator to look at");
    }
}

#[test]
fn slow_start_after_idle_is_a_host_setting_like_the_others() {
    let (_dir, root, state) = tree("idle");
    fs::write(root.join(SLOW_START_AFTER_IDLE), "1\n").unwrap();
    let host =
        crate::control::policy::Host { tcp_slow_start_after_idle: Some(0), ..Default::default() };
    let mut s = Sysctls::open(&root, &state).unwrap();
    let changed = s.apply_host(&host_values(&host)).unwrap();
    assert_eq!(changed, ["net/ipv4/tcp_slow_start_after_idle 1 -> 0"]);
    assert_eq!(get(&root, SLOW_START_AFTER_IDLE), "0");
    s.restore().unwrap();
    assert_eq!(get(&root, SLOW_START_AFTER_IDLE), "1");
}
