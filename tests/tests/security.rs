//! The daemon's security promises, each judged from outside: the status socket refuses other
//! users (the kernel on the socket's mode, and the daemon on the peer's credentials when the
//! mode is loosened), metrics listen on loopback unless told otherwise (`ss`), and a warning
//! is logged when told every interface; no file the daemon writes as root is written through a
//! symlink planted at its path, and a state file with hostile keys stops the start with
//! nothing changed (the victim's bytes and metadata, `sysctl -n`, `bpftool`).

use std::{
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    time::Duration,
};

use linkpilot_tests::{
    daemon::{status_json, sysctl, wait_for, Daemon, PAIR_POLICY},
    linkpilot_bin,
    netns::Pair,
    run, sh,
};
use nix::{sys::signal::Signal, unistd::Pid};

/// An unprivileged user, as `setpriv` becomes it.
const NOBODY: [&str; 7] =
    ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "--"];

fn temp_dir(name: &str) -> PathBuf {
    let dir = linkpilot_tests::temp_dir(&format!("security-{name}"));
    // Others may enter (the status socket's test), as /run/linkpilot (0755).
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    dir
}

fn stop(d: &mut Daemon) {
    nix::sys::signal::kill(Pid::from_raw(d.child.id() as i32), Signal::SIGTERM).expect("SIGTERM");
    assert!(d.child.wait().expect("exit").success(), "{}", d.log());
}

/// The status socket answering root: the daemon is up.
fn wait_until_serving(dir: &Path) {
    let sock = dir.join("status.sock").display().to_string();
    wait_for("the status socket", Duration::from_secs(20), || {
        run(&[&linkpilot_bin().display().to_string(), "status", "--socket", &sock]).status.success()
    });
}

/// A `linkpilot` that user 65534 can run: the build's own, or a copy in `dir` when the build
/// lies where others may not look (a checkout under /root).
fn binary_for_nobody(dir: &Path) -> String {
    let bin = linkpilot_bin().display().to_string();
    if run(&[&NOBODY[..], &[&bin, "--version"]].concat()).status.success() {
        return bin;
    }
    let copy = dir.join("linkpilot").display().to_string();
    sh(&["install", "-m", "0755", &bin, &copy]);
    copy
}

#[test]
fn the_status_socket_refuses_other_users_by_its_mode_and_by_the_daemon() {
    let pair = Pair::new("198.18.81.1", "198.18.81.2");
    let dir = temp_dir("status");
    let bin = binary_for_nobody(&dir);
    let mut d = Daemon::start_with(&pair.a.name, &dir, &PAIR_POLICY, &["--metrics-addr", "off"]);
    wait_until_serving(&dir);
    let sock = dir.join("status.sock");
    let sock_s = sock.display().to_string();
    assert_eq!(std::fs::metadata(&sock).expect("socket").mode() & 0o777, 0o600);
    let as_nobody = || run(&[&NOBODY[..], &[&bin, "status", "--socket", &sock_s]].concat());
    let refusals =
        |d: &Daemon| d.log().matches("status: refused a client that is not root").count();

    // The socket's mode: the kernel refuses the connection; the daemon never sees it.
    let out = as_nobody();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("Permission denied (os error 13) (the status API is root-only)"), "{err}");
    assert_eq!(refusals(&d), 0, "{}", d.log());

    // The mode loosened: the connection is made, and the daemon's credential check refuses.
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let out = as_nobody();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("permission denied: the status API is root-only"), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("\"pid\""), "no status leaked");
    wait_for("the daemon's refusal in its log", Duration::from_secs(2), || refusals(&d) == 1);

    // Root still gets its status.
    let st = status_json(&dir);
    assert_eq!(st["pid"].as_u64(), Some(u64::from(d.child.id())), "{st}");
    stop(&mut d);
    let _ = std::fs::remove_dir_all(&dir);
}

/// TCP listeners in `netns` as `ss -ltnH` prints their local addresses.
fn listeners(netns: &str) -> Vec<String> {
    sh(&["ip", "netns", "exec", netns, "ss", "-ltnH"])
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3).map(str::to_owned))
        .collect()
}

#[test]
fn metrics_listen_on_loopback_unless_told_otherwise_and_every_interface_is_warned_about() {
    let pair = Pair::new("198.18.82.1", "198.18.82.2");
    let ns = pair.a.name.clone();
    let warning = "every interface of this host serves them";
    // (--metrics-addr, what ss shows, whether the log warns)
    for (addr, shown, warns) in [
        (None, "127.0.0.1:9464", false),
        (Some("0.0.0.0:9464"), "0.0.0.0:9464", true),
        (Some("[::]:9464"), "*:9464", true),
    ] {
        let dir = temp_dir("metrics");
        let extra: Vec<&str> = addr.map(|a| vec!["--metrics-addr", a]).unwrap_or_default();
        let mut d = Daemon::start_with(&ns, &dir, &PAIR_POLICY, &extra);
        wait_until_serving(&dir);
        // The namespace is the test's: every listener in it is the daemon's.
        assert_eq!(listeners(&ns), [shown], "{addr:?}");
        let log = d.log();
        assert_eq!(log.contains(warning), warns, "{addr:?}: {log}");
        if let Some(a) = addr.filter(|_| warns) {
            assert!(log.contains("WARN") && log.contains(&format!("metrics on {a}:")), "{log}");
        }
        stop(&mut d);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// What a write through a link would change: the victim's bytes and metadata.
#[derive(Debug, PartialEq)]
struct Fingerprint {
    bytes: Vec<u8>,
    ino: u64,
    mode: u32,
    uid: u32,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

fn fingerprint(path: &Path) -> Fingerprint {
    let m = std::fs::symlink_metadata(path).expect("victim");
    Fingerprint {
        bytes: std::fs::read(path).expect("victim's bytes"),
        ino: m.ino(),
        mode: m.mode(),
        uid: m.uid(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
    }
}

/// A file of someone else's (user 65534, 0640) and a directory holding a file named by a pid
/// that cannot be running (what the tuner directory's cleaning removes).
fn victims(dir: &Path) -> (PathBuf, PathBuf) {
    let victim = dir.join("victim");
    std::fs::write(&victim, "precious\n").expect("victim");
    std::os::unix::fs::chown(&victim, Some(65534), Some(65534)).expect("chown");
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    let victim_dir = dir.join("victim-dir");
    std::fs::create_dir(&victim_dir).expect("victim dir");
    std::fs::write(victim_dir.join("4194305"), "precious\n").expect("victim dir's file");
    // Named as a training process's file (tuner counters, job report) of a dead process.
    std::fs::write(victim_dir.join(DEAD), "precious\n").expect("victim dir's file");
    (victim, victim_dir)
}

const DEAD: &str = "4194305-0123456789abcdef";

fn plant(link: &Path, target: &Path) {
    std::fs::create_dir_all(link.parent().expect("dir")).expect("dir");
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(target, link).expect("symlink");
}

#[test]
fn no_file_the_daemon_writes_is_written_through_a_planted_symlink() {
    let pair = Pair::new("198.18.83.1", "198.18.83.2");
    let ns = pair.a.name.clone();
    let dir = temp_dir("symlinks");
    let run_dir = dir.join("run");
    let (victim, victim_dir) = victims(&dir);
    let (before, before_dir) = (fingerprint(&victim), fingerprint(&victim_dir.join("4194305")));
    let before_dead = fingerprint(&victim_dir.join(DEAD));
    let ecn = sysctl(&ns, "net.ipv4.tcp_ecn");

    // Files written whole are replaced (a rename over the link); the tuner and job-report
    // directories, which the daemon would make world-writable and clean, are refused and left
    // alone.
    plant(&run_dir.join("knobs"), &victim);
    plant(&run_dir.join("nccl.env"), &victim);
    plant(&run_dir.join("tuner"), &victim_dir);
    plant(&run_dir.join("jobs"), &victim_dir);
    let mut d = Daemon::start_with(&ns, &run_dir, &PAIR_POLICY, &["--metrics-addr", "off"]);
    d.wait_up();
    d.first_decision();
    wait_for("the env file", Duration::from_secs(5), || {
        std::fs::read_to_string(run_dir.join("nccl.env"))
            .is_ok_and(|e| e.contains("LINKPILOT_STATE=healthy"))
    });
    for name in ["knobs", "nccl.env"] {
        let t = std::fs::symlink_metadata(run_dir.join(name)).expect(name).file_type();
        assert!(t.is_file(), "{name}: the link is replaced by the daemon's file");
    }
    let log = d.log();
    assert!(log.contains("tuner is a symbolic link; refusing to use it"), "{log}");
    assert!(log.contains("jobs is a symbolic link; refusing to use it"), "{log}");
    // Past a directory scan (once a second).
    std::thread::sleep(Duration::from_millis(1500));
    stop(&mut d);
    for name in ["tuner", "jobs"] {
        assert!(std::fs::symlink_metadata(run_dir.join(name)).expect(name).is_symlink());
    }
    assert_eq!(fingerprint(&victim_dir.join(DEAD)), before_dead, "not cleaned");
    assert_eq!(fingerprint(&victim), before);
    assert_eq!(fingerprint(&victim_dir.join("4194305")), before_dir, "not cleaned");
    let mode = std::fs::metadata(&victim_dir).expect("victim dir").mode();
    assert_eq!(mode & 0o7777, 0o755, "not made world-writable");

    // Files opened in place (appended, locked, read back and restored) are refused: the start
    // stops, naming the link, before anything is loaded or changed.
    for (flag, name, says) in [
        ("--lock", "lock", "is a symbolic link; refusing to follow it"),
        ("--status-socket", "status.sock", "exists and is not a socket (a symbolic link)"),
        ("--decision-log", "decisions.jsonl", "is a symbolic link; refusing to follow it"),
        ("--record", "trace.jsonl", "is a symbolic link; refusing to follow it"),
        ("--sysctl-state", "sysctl.json", "is a symbolic link; refusing to follow it"),
        ("--roce-tc-state", "roce-tc.json", "is a symbolic link; refusing to follow it"),
    ] {
        let link = run_dir.join(name);
        plant(&link, &victim);
        let mut d = Daemon::start_with(&ns, &run_dir, &PAIR_POLICY, &["--metrics-addr", "off"]);
        let status = d.exit_within(Duration::from_secs(20));
        let log = d.log();
        assert!(!status.success(), "{flag}: {log}");
        assert!(log.contains(&format!("{}: ", link.display())) && log.contains(says), "{log}");
        assert_eq!(sysctl(&ns, "net.ipv4.tcp_ecn"), ecn, "{flag}: nothing changed");
        assert_eq!(fingerprint(&victim), before, "{flag}");
        std::fs::remove_file(&link).expect("the link");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A UTS namespace of the test's own, kept by a bind mount: a hostile key naming
/// kernel.domainname, if it were followed, would change this one, not the host's.
struct Uts(PathBuf);

impl Uts {
    fn new() -> Self {
        let path = PathBuf::from(format!("/run/sc-sec-uts-{}", std::process::id()));
        std::fs::write(&path, "").expect("mount point");
        sh(&["unshare", &format!("--uts={}", path.display()), "true"]);
        Self(path)
    }

    fn domainname(&self) -> String {
        let ns = format!("--uts={}", self.0.display());
        sh(&["nsenter", &ns, "cat", "/proc/sys/kernel/domainname"]).trim().to_owned()
    }
}

impl Drop for Uts {
    fn drop(&mut self) {
        let _ = run(&["umount", &self.0.display().to_string()]);
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn a_planted_state_file_with_hostile_keys_stops_the_start_with_nothing_changed() {
    let pair = Pair::new("198.18.84.1", "198.18.84.2");
    let ns = pair.a.name.clone();
    let uts = Uts::new();
    let dir = temp_dir("hostile");
    let run_dir = dir.join("run");
    std::fs::create_dir_all(run_dir.join("rdma_cm")).expect("rdma_cm root");
    let (victim, victim_dir) = victims(&dir);
    let (before, domainname) = (fingerprint(&victim), uts.domainname());
    let ecn = sysctl(&ns, "net.ipv4.tcp_ecn");
    // From /proc/sys and from the rdma_cm root, `../` as far as / and back down to the victims.
    let up = |p: &Path| format!("../../../../../../../..{}", p.display());
    let sysctl_keys = [victim.display().to_string(), up(&victim), "kernel/domainname".to_owned()];
    // An empty directory: what a restore would remove as one it created.
    let empty = dir.join("victim-empty");
    std::fs::create_dir(&empty).expect("empty victim");
    let roce_keys = [empty.display().to_string(), up(&empty)];
    let cases = sysctl_keys
        .iter()
        .map(|k| {
            (
                "sysctl.json",
                serde_json::json!({ "values": { "net/ipv4/tcp_ecn": "0", k: "owned" } }),
                k,
            )
        })
        .chain(
            roce_keys
                .iter()
                .map(|k| ("roce-tc.json", serde_json::json!({ "values": {}, "created": [k] }), k)),
        );
    let rdma_cm = run_dir.join("rdma_cm").display().to_string();
    let wrapper = ["nsenter", &format!("--uts={}", uts.0.display())];
    for (file, state, key) in cases {
        let state_path = run_dir.join(file);
        std::fs::write(&state_path, state.to_string()).expect("state file");
        let extra = ["--metrics-addr", "off", "--rdma-cm-root", &rdma_cm];
        let mut d = Daemon::start_under(&ns, &wrapper, &run_dir, &PAIR_POLICY, &extra);
        let status = d.exit_within(Duration::from_secs(20));
        let log = d.log();
        assert!(!status.success(), "{key}: {log}");
        assert!(
            log.contains(&format!(
                "{}: key {key:?} is not one linkpilot manages",
                state_path.display()
            )) && log.contains("nothing was changed"),
            "{log}"
        );
        assert_eq!(sysctl(&ns, "net.ipv4.tcp_ecn"), ecn, "{key}: nothing restored");
        assert_eq!(uts.domainname(), domainname, "{key}");
        assert_eq!(fingerprint(&victim), before, "{key}");
        assert!(victim_dir.join("4194305").exists() && empty.is_dir(), "{key}");
        assert_eq!(std::fs::read(&state_path).expect("left"), state.to_string().as_bytes());
        std::fs::remove_file(&state_path).expect("state file");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
