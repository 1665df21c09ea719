//! The systemd unit (deploy/linkpilot.service) gives the daemon the capabilities it needs and no
//! more: its exposure score (`systemd-analyze security`) does not regress past the figure
//! recorded in RELIABILITY.md; the real daemon, on the lab under exactly the unit's bounding set
//! and no-new-privileges (`setpriv`), holds only those (/proc/PID/status), attaches (bpftool),
//! decides, writes the sysctls and restores them on SIGTERM; and without any one of them it
//! stops with an error naming what failed, also when the kernel, not our check, is the judge.

use std::sync::LazyLock;

use linkpilot_tests::policy::PolicyToml;
use std::{path::Path, time::Duration};

use linkpilot_tests::{
    daemon::{lab_with, sysctl, tcp_rmem_max, wait_for, Daemon, PAIR_POLICY},
    linkpilot_bin,
    netns::Pair,
    oracle::{attached_programs, links_of, ours_loaded},
    run, sh,
};
use nix::{sys::signal::Signal, unistd::Pid};

const UNIT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/linkpilot.service");
const RELIABILITY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../RELIABILITY.md");

/// `systemd-analyze security --offline=true` of the unit as RELIABILITY.md records it.
const RECORDED_EXPOSURE: &str = "2.1";

/// The kernel's capability numbers (include/uapi/linux/capability.h), by name without CAP_.
const CAPS: [&str; 41] = [
    "chown",
    "dac_override",
    "dac_read_search",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "linux_immutable",
    "net_bind_service",
    "net_broadcast",
    "net_admin",
    "net_raw",
    "ipc_lock",
    "ipc_owner",
    "sys_module",
    "sys_rawio",
    "sys_chroot",
    "sys_ptrace",
    "sys_pacct",
    "sys_admin",
    "sys_boot",
    "sys_nice",
    "sys_resource",
    "sys_time",
    "sys_tty_config",
    "mknod",
    "lease",
    "audit_write",
    "audit_control",
    "setfcap",
    "mac_override",
    "mac_admin",
    "syslog",
    "wake_alarm",
    "block_suspend",
    "audit_read",
    "perfmon",
    "bpf",
    "checkpoint_restore",
];

/// The values of `key` in the unit's [Service] section, in order.
fn unit_values(key: &str) -> Vec<String> {
    let text = std::fs::read_to_string(UNIT).expect("the unit");
    text.lines()
        .skip_while(|l| l.trim() != "[Service]")
        .filter_map(|l| l.trim().strip_prefix(key)?.strip_prefix('=').map(str::to_owned))
        .collect()
}

/// The unit's bounding set, as setpriv names capabilities (`bpf`).
fn unit_capabilities() -> Vec<String> {
    let sets = unit_values("CapabilityBoundingSet");
    assert_eq!(sets.len(), 1, "one CapabilityBoundingSet line: {sets:?}");
    let caps: Vec<String> = sets[0]
        .split_whitespace()
        .map(|c| c.strip_prefix("CAP_").expect("CAP_ name").to_ascii_lowercase())
        .collect();
    for c in &caps {
        assert!(CAPS.contains(&c.as_str()), "unknown capability {c}");
    }
    caps
}

/// `setpriv` with exactly `caps` (root's permitted and effective sets follow the bounding set
/// on exec, as under systemd), nothing inheritable and, as the unit says, no new privileges.
fn setpriv(caps: &[String]) -> Vec<String> {
    assert_eq!(unit_values("NoNewPrivileges"), ["yes"], "the unit sets NoNewPrivileges=yes");
    let set: String = caps.iter().map(|c| format!(",+{c}")).collect();
    ["setpriv", "--inh-caps=-all", &format!("--bounding-set=-all{set}"), "--no-new-privs", "--"]
        .map(str::to_owned)
        .to_vec()
}

fn mask(caps: &[String]) -> u64 {
    caps.iter().map(|c| 1u64 << CAPS.iter().position(|k| k == c).expect("known")).sum()
}

/// A field of /proc/PID/status.
fn proc_status(pid: u32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':').map(|v| v.trim().to_owned()))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

fn hex(pid: u32, field: &str) -> u64 {
    u64::from_str_radix(&proc_status(pid, field), 16).expect("hex")
}

/// The BPF programs `pid` holds, from its descriptors' fdinfo (programs and links name theirs).
fn programs_held(pid: u32) -> Vec<u64> {
    let mut ids: Vec<u64> = std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .expect("fdinfo")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .filter_map(|info| {
            info.lines().find_map(|l| l.strip_prefix("prog_id:")?.trim().parse().ok())
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

#[test]
fn the_units_exposure_score_does_not_regress() {
    let out = run(&["systemd-analyze", "security", "--offline=true", UNIT]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let score: f64 = text
        .lines()
        .find_map(|l| l.split("Overall exposure level for linkpilot.service: ").nth(1))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no overall exposure level in:\n{text}"));
    let recorded: f64 = RECORDED_EXPOSURE.parse().expect("a number");
    assert!(score <= recorded, "exposure {score} is above the recorded {recorded}:\n{text}");
    let doc = std::fs::read_to_string(RELIABILITY).expect("RELIABILITY.md");
    assert!(doc.contains(&format!("exposure level {RECORDED_EXPOSURE}")), "recorded there too");
}

static POLICY: LazyLock<String> = LazyLock::new(|| {
    PolicyToml::new()
        .table("[bounds]\ntcp_buffers = { min = \"64MiB\", max = \"256MiB\", bdp_factor = 2.0, max_step = 4.0 }")
        .table("[host]\ntcp_ecn = 1")
        // The test addresses (a policy naming no peer only observes).
        .link("wan", "eth0", "50Mbit/s", Some(("lab", "198.18.0.0/15")))
        .healthy()
        .build()
});

#[test]
fn the_daemon_works_under_exactly_the_units_capabilities() {
    let caps = unit_capabilities();
    let lab = lab_with("scunit", "delay = \"10ms\"\nrate = \"50Mbit/s\"");
    let hk = lab.host(linkpilot_lab::lab::Site::Hk, 0).clone();
    let (ecn, rmem) = (sysctl(&hk.netns, "net.ipv4.tcp_ecn"), tcp_rmem_max(&hk.netns));
    assert_ne!((ecn.as_str(), rmem.as_str()), ("1", "67108864"), "what the daemon will set");
    let dir = linkpilot_tests::temp_dir("unit-caps");
    let wrapper = setpriv(&caps);
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let mut d = Daemon::start_under(&hk.netns, &wrapper, &dir, &POLICY, &["--metrics-addr", "off"]);
    let pid = d.child.id();
    d.wait_up();
    d.first_decision();
    // Exactly the unit's set, and no way to more.
    assert_eq!(std::fs::read_to_string(format!("/proc/{pid}/comm")).expect("comm"), "linkpilot\n");
    let want = mask(&caps);
    for field in ["CapEff", "CapPrm", "CapBnd"] {
        assert_eq!(hex(pid, field), want, "{field} of {caps:?}");
    }
    assert_eq!((hex(pid, "CapInh"), hex(pid, "CapAmb")), (0, 0));
    assert_eq!(proc_status(pid, "NoNewPrivs"), "1");
    // Attached: bpftool's links of the programs this process holds are every one of ours.
    let held = programs_held(pid);
    let progs: Vec<(u64, String)> =
        ours_loaded().into_iter().filter(|(id, _)| held.contains(id)).collect();
    let mut links = links_of(&progs);
    links.sort();
    let mut want_links: Vec<(String, String)> =
        attached_programs().iter().map(|(t, n)| (t.to_string(), n.to_string())).collect();
    want_links.sort();
    assert_eq!(links, want_links, "{}", d.log());
    // Decided, and wrote the sysctls.
    let decisions = std::fs::read_to_string(dir.join("decisions.jsonl")).expect("decision log");
    let first: serde_json::Value = decisions
        .lines()
        .next()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no decision: {decisions}"));
    assert_eq!(first["id"], 1, "{decisions}");
    wait_for("the policy's sysctls", Duration::from_secs(5), || {
        sysctl(&hk.netns, "net.ipv4.tcp_ecn") == "1" && tcp_rmem_max(&hk.netns) == "67108864"
    });
    nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGTERM).expect("SIGTERM");
    assert!(d.child.wait().expect("exit").success(), "{}", d.log());
    assert_eq!((sysctl(&hk.netns, "net.ipv4.tcp_ecn"), tcp_rmem_max(&hk.netns)), (ecn, rmem));
    assert!(links_of(&progs).is_empty(), "detached");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts the daemon in `ns` under `caps`; its log, once it has stopped with exit status 1.
fn refused(ns: &str, caps: &[String], extra: &[&str], dir: &Path) -> String {
    let wrapper = setpriv(caps);
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let mut args = vec!["--metrics-addr", "off"];
    args.extend(extra);
    let mut d = Daemon::start_under(ns, &wrapper, dir, &PAIR_POLICY, &args);
    let status = d.exit_within(Duration::from_secs(30));
    let log = d.log();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(!log.contains("linkpilot running"), "{log}");
    log
}

#[test]
fn without_any_one_of_the_units_capabilities_the_daemon_stops_naming_what_failed() {
    let caps = unit_capabilities();
    let pair = Pair::new("198.18.85.1", "198.18.85.2");
    let ns = pair.a.name.clone();
    let ecn = sysctl(&ns, "net.ipv4.tcp_ecn");
    for cap in &caps {
        let fewer: Vec<String> = caps.iter().filter(|c| *c != cap).cloned().collect();
        let dir = linkpilot_tests::temp_dir(cap);
        // Our check names the capability before anything is loaded...
        let log = refused(&ns, &fewer, &[], &dir);
        let name = format!("CAP_{}", cap.to_ascii_uppercase());
        assert!(log.contains("missing privileges") && log.contains(&name), "{log}");
        // ...and it is needed: without the check, the kernel refuses a load, and the error
        // names the map or program it refused.
        let log = refused(&ns, &fewer, &["--skip-capability-check"], &dir);
        let error = log.lines().find(|l| l.contains("ERROR")).unwrap_or_default();
        assert!(
            (error.contains("Operation not permitted") || error.contains("Permission denied"))
                && (error.contains("map") || error.contains("program")),
            "{name}: {log}"
        );
        assert_eq!(sysctl(&ns, "net.ipv4.tcp_ecn"), ecn, "{name}: nothing changed");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `ip netns exec` mounts a fresh /sys without tracefs, and the unit's capabilities cannot
/// mount one (no CAP_SYS_ADMIN): the daemon says so. `nsenter --net` keeps the host's tracefs
/// (the tests above), as systemd's mount namespace does.
#[test]
fn under_ip_netns_exec_the_units_capabilities_cannot_mount_tracefs() {
    let caps = unit_capabilities();
    let pair = Pair::new("198.18.86.1", "198.18.86.2");
    let dir = linkpilot_tests::temp_dir("unit-netns-exec");
    std::fs::write(dir.join("policy.toml"), PAIR_POLICY.as_str()).expect("policy");
    let bin = linkpilot_bin().display().to_string();
    let wrapper = setpriv(&caps);
    let p = |f: &str| dir.join(f).display().to_string();
    let mut args: Vec<&str> = vec!["ip", "netns", "exec", &pair.a.name];
    args.extend(wrapper.iter().map(String::as_str));
    let (policy, lock, sock, state) = (p("policy.toml"), p("lock"), p("status.sock"), p("s.json"));
    args.extend([&bin, "run", "--policy", &policy, "--lock", &lock, "--status-socket", &sock]);
    // Ticks, so that a variant that starts after all cannot hang the test.
    args.extend(["--sysctl-state", &state, "--metrics-addr", "off", "--dry-run", "--ticks", "5"]);
    let out = run(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("tracefs is not mounted"), "{err}");
    assert!(err.contains("a mount namespace of our own: EPERM"), "{err}");
    let _ = sh(&["rm", "-rf", &dir.display().to_string()]);
}

/// systemd's syscall groups, each expanded to the calls it holds (`systemd-analyze
/// syscall-filter` lists nested groups by name).
fn syscall_group(name: &str, listing: &str) -> Vec<String> {
    let mut calls = Vec::new();
    let mut in_group = false;
    for line in listing.lines() {
        if !line.starts_with(' ') && !line.trim().is_empty() {
            in_group = line.trim() == name;
            continue;
        }
        let entry = line.trim();
        if !in_group || entry.is_empty() || entry.starts_with('#') {
            continue;
        }
        if entry.starts_with('@') {
            calls.extend(syscall_group(entry, listing));
        } else {
            calls.push(entry.to_owned());
        }
    }
    calls
}

/// What the unit's SystemCallFilter lines allow: the union of the allow lists less every
/// `~` deny list.
fn unit_syscalls() -> Vec<String> {
    let listing = sh(&["systemd-analyze", "syscall-filter"]);
    let expand = |list: &str| -> Vec<String> {
        list.split_whitespace()
            .flat_map(|e| {
                if e.starts_with('@') {
                    syscall_group(e, &listing)
                } else {
                    vec![e.to_owned()]
                }
            })
            .collect()
    };
    let lines = unit_values("SystemCallFilter");
    let denied: Vec<String> =
        lines.iter().filter_map(|l| l.strip_prefix('~')).flat_map(expand).collect();
    lines
        .iter()
        .filter(|l| !l.starts_with('~'))
        .flat_map(|l| expand(l))
        .filter(|c| !denied.contains(c))
        .collect()
}

#[test]
fn the_units_syscall_filter_allows_every_call_the_daemon_makes() {
    let allowed = unit_syscalls();
    assert!(allowed.iter().any(|c| c == "bpf") && !allowed.iter().any(|c| c == "setrlimit"));
    let caps = unit_capabilities();
    let pair = Pair::new("198.18.87.1", "198.18.87.2");
    let dir = linkpilot_tests::temp_dir("unit-syscalls");
    let trace = dir.join("strace.txt").display().to_string();
    // strace after setpriv: what it sees is the daemon under the unit's capabilities, from
    // its exec to its exit (a run of 30 ticks, then the clean stop's restore).
    let mut wrapper = setpriv(&caps);
    wrapper.extend(["strace", "-f", "-qq", "-o", &trace].map(str::to_owned));
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let mut d = Daemon::start_under(&pair.a.name, &wrapper, &dir, &PAIR_POLICY, &["--ticks", "30"]);
    // Both servers answer once while it runs.
    let sock = dir.join("status.sock").display().to_string();
    let status =
        [&linkpilot_bin().display().to_string(), "status", "--socket", &sock].map(str::to_owned);
    wait_for("the status socket", Duration::from_secs(60), || {
        run(&status.iter().map(String::as_str).collect::<Vec<_>>()).status.success()
    });
    assert!(linkpilot_tests::daemon::scrape(&pair.a.name).contains("linkpilot_"));
    assert!(d.child.wait().expect("exit").success(), "{}", d.log());
    let text = std::fs::read_to_string(&trace).expect("strace's output");
    let mut used: Vec<&str> = text
        .lines()
        .filter_map(|l| {
            let call = l.split_once(' ')?.1.trim_start();
            let name = call.split('(').next()?;
            (!name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
                .then_some(name)
        })
        .collect();
    used.sort_unstable();
    used.dedup();
    assert!(used.contains(&"bpf") && used.contains(&"perf_event_open"), "{used:?}");
    let refused: Vec<&&str> = used.iter().filter(|c| !allowed.iter().any(|a| a == *c)).collect();
    assert!(refused.is_empty(), "the unit's filter would refuse {refused:?} (used: {used:?})");
    eprintln!("{} distinct system calls, all allowed: {used:?}", used.len());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A daemon that dies without rolling back (SIGKILL, or systemd giving up restarting it) leaves
/// its sysctls and netlink classifiers behind; the unit's ExecStopPost, run as systemd runs it
/// (the unit's capabilities, after the daemon is gone), puts them back, judged by sysctl(8) and
/// tc(8). While a daemon runs, the same command is refused and changes nothing.
#[test]
fn the_units_exec_stop_post_restores_what_a_killed_daemon_left() {
    let caps = unit_capabilities();
    let post = unit_values("ExecStopPost");
    assert_eq!(post.len(), 1, "one ExecStopPost line: {post:?}");
    let words: Vec<&str> = post[0].split_whitespace().collect();
    assert_eq!(words, ["/usr/local/bin/linkpilot", "restore"], "{post:?}");
    let lab = lab_with("scpost", "delay = \"5ms\"");
    let hk = lab.host(linkpilot_lab::lab::Site::Hk, 0).clone();
    let (ecn, rmem) = (sysctl(&hk.netns, "net.ipv4.tcp_ecn"), tcp_rmem_max(&hk.netns));
    let filters = |dir: &str| hk.exec(&["tc", "filter", "show", "dev", "eth0", dir]);
    let dir = linkpilot_tests::temp_dir("unit-post");
    let wrapper = setpriv(&caps);
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    // The unit's restore command on this daemon's files, in its namespace, under the unit's set.
    let restore = || {
        let p = |f: &str| dir.join(f).display().to_string();
        let bin = linkpilot_bin().display().to_string();
        let mut args = vec!["nsenter".to_owned(), format!("--net=/run/netns/{}", hk.netns)];
        args.extend(wrapper.iter().map(|s| (*s).to_owned()));
        args.extend([bin, words[1].to_owned()]);
        for (flag, file) in [
            ("--policy", "policy.toml"),
            ("--sysctl-state", "sysctl.json"),
            ("--roce-tc-state", "roce-tc.json"),
            ("--lock", "lock"),
        ] {
            args.extend([flag.to_owned(), p(file)]);
        }
        run(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let netlink = ["--netlink-tc", "--metrics-addr", "off"];
    let mut d = Daemon::start_under(&hk.netns, &wrapper, &dir, &POLICY, &netlink);
    d.wait_up();
    wait_for("the policy's sysctls and filters", Duration::from_secs(5), || {
        sysctl(&hk.netns, "net.ipv4.tcp_ecn") == "1"
            && tcp_rmem_max(&hk.netns) == "67108864"
            && filters("egress").is_ok_and(|f| f.contains("lp_tc_egress"))
    });
    // Refused while the daemon runs: it owns all of it.
    let out = restore();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("another linkpilot is running"), "{err}");
    assert_eq!(sysctl(&hk.netns, "net.ipv4.tcp_ecn"), "1", "nothing restored under it");
    d.child.kill().expect("SIGKILL");
    d.child.wait().expect("exit");
    assert_eq!(sysctl(&hk.netns, "net.ipv4.tcp_ecn"), "1", "the kill left it changed");
    assert!(filters("egress").expect("tc").contains("lp_tc_egress"), "and the classifier");
    let out = restore();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!((sysctl(&hk.netns, "net.ipv4.tcp_ecn"), tcp_rmem_max(&hk.netns)), (ecn, rmem));
    for direction in ["ingress", "egress"] {
        let f = filters(direction).expect("tc");
        assert!(!f.contains("lp_tc"), "{direction}: {f}");
    }
    assert!(!dir.join("sysctl.json").exists(), "the crash-state file is gone");
    // Again, with nothing left: it says so and changes nothing.
    let out = restore();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.contains("nothing to restore"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
