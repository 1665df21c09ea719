//! What the fault tests share: a daemon on a veth pair with real traffic, the host as it was
//! before (the namespace's own sysctls, our BPF links as bpftool lists them), and the daemon's
//! progress read from its status API.

use crate::policy::PolicyToml;
use std::{
    path::Path,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};

use crate::{
    daemon::{iperf3_server_in, status_json, Daemon},
    netns::{Netns, Pair},
    oracle,
};

/// One link on `iface` with the pair's other end as peer `b`, 100 ms ticks, a `[host]` sysctl
/// (so the host's state is something the daemon changes), knobs `dscp` and `roce` (reloads that
/// change them make decisions).
pub fn policy(iface: &str, peer: &str, state: &str, dscp: u8) -> String {
    PolicyToml::new()
        .table("[host]\ntcp_ecn = 1")
        .link("wan", iface, "1Gbit/s", Some(("b", &format!("{peer}/32"))))
        .state(state, "", "", ("none", dscp, 106))
        .build()
}

pub use crate::temp_dir;

/// `linkpilot status --json`, or null while the daemon does not answer.
pub fn status(dir: &Path) -> serde_json::Value {
    let out = crate::daemon::linkpilot_status(&[], dir, &["--json"]);
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

pub fn ticks(dir: &Path) -> u64 {
    status(dir)["ticks"].as_u64().unwrap_or(0)
}

/// Ticks the daemon makes over `during` while `fault` runs: (ticks, how long it took).
pub fn ticks_during(dir: &Path, fault: impl FnOnce()) -> (u64, Duration) {
    let (t0, start) = (status_json(dir)["ticks"].as_u64().expect("ticks"), Instant::now());
    fault();
    (status_json(dir)["ticks"].as_u64().expect("ticks") - t0, start.elapsed())
}

/// SIGTERM, and a clean exit.
pub fn stop(d: &mut Daemon) {
    nix::sys::signal::kill(Pid::from_raw(d.child.id() as i32), Signal::SIGTERM).expect("SIGTERM");
    let status = d.child.wait().expect("exit");
    assert!(status.success(), "linkpilot run exited {status}: {}", d.log());
}

/// The sysctls the daemon may change, as `sysctl -n` reads them in the daemon's namespace (a
/// lab or test namespace has its own: other daemons on the machine cannot move them).
/// (netdev_max_backlog and the net.core buffer limits are the initial namespace's alone.)
pub const SYSCTLS: [&str; 3] = ["net.ipv4.tcp_ecn", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"];

/// Ids of the BPF programs process `pid` holds, from its fds' fdinfo (other daemons of ours may
/// run on the machine at the same time: names alone would mix them up).
pub fn programs_of(pid: u32) -> Vec<u64> {
    let mut ids: Vec<u64> = std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .map(|fds| {
            fds.filter_map(|fd| std::fs::read_to_string(fd.ok()?.path()).ok())
                .filter(|info| !info.contains("link_id:"))
                .filter_map(|info| {
                    info.lines().find_map(|l| l.strip_prefix("prog_id:")?.trim().parse().ok())
                })
                .collect()
        })
        .unwrap_or_default();
    ids.sort();
    ids.dedup();
    ids
}

/// Ids of the BPF maps process `pid` holds, from its fds' fdinfo.
pub fn maps_of(pid: u32) -> Vec<u64> {
    std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .map(|fds| {
            fds.filter_map(|fd| std::fs::read_to_string(fd.ok()?.path()).ok())
                .filter_map(|info| {
                    info.lines().find_map(|l| l.strip_prefix("map_id:")?.trim().parse().ok())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Resident memory of process `pid`, bytes (VmRSS in /proc/PID/status).
pub fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix(" kB")?.trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// A fault test's start: the host's state read, then the daemon on `pair.a` with the one-state
/// [`policy`] ("healthy", DSCP 26), files in `dir`, up.
pub fn start_healthy(pair: &Pair, dir: &Path) -> (HostBefore, Daemon) {
    let host = HostBefore::read(&pair.a.name);
    let mut d = Daemon::start(&pair.a.name, dir, &policy(pair.a_if, pair.b_addr, "healthy", 26));
    d.wait_up();
    (host, d)
}

/// What the daemon may change on the host, read before it starts, and the programs it loaded.
pub struct HostBefore {
    netns: String,
    sysctls: Vec<String>,
    seen: Vec<u64>,
}

impl HostBefore {
    pub fn read(netns: &str) -> Self {
        let sysctls = SYSCTLS.iter().map(|s| crate::daemon::sysctl(netns, s)).collect();
        Self { netns: netns.to_owned(), sysctls, seen: Vec::new() }
    }

    /// Exactly one set of attachments of the daemon `pid`: each of our programs linked once, as
    /// bpftool lists links (no duplicate, no leftover of a deleted device).
    pub fn assert_one_set_attached(&mut self, pid: u32) {
        let ours = programs_of(pid);
        self.seen.extend(&ours);
        self.seen.sort();
        self.seen.dedup();
        let progs: Vec<(u64, String)> =
            oracle::ours_loaded().into_iter().filter(|(id, _)| ours.contains(id)).collect();
        let mut links = oracle::links_of(&progs);
        links.sort();
        let mut want: Vec<(String, String)> = oracle::attached_programs()
            .into_iter()
            .map(|(t, n)| (t.to_owned(), n.to_owned()))
            .collect();
        want.sort();
        assert_eq!(links, want, "links of the programs of pid {pid}, as bpftool lists them");
    }

    /// The end of a fault test: the daemon `d` still with one set of attachments, then stopped
    /// (SIGTERM, exit 0) and the host as it was before.
    pub fn stop_and_assert_unchanged(&mut self, d: &mut Daemon) {
        self.assert_one_set_attached(d.child.id());
        stop(d);
        self.assert_unchanged();
    }

    pub fn assert_sysctls_unchanged(&self) {
        let now: Vec<String> =
            SYSCTLS.iter().map(|s| crate::daemon::sysctl(&self.netns, s)).collect();
        assert_eq!(now, self.sysctls, "sysctls {SYSCTLS:?} of {}", self.netns);
    }

    /// After the daemon exited: the sysctls as before, none of its programs loaded or linked.
    pub fn assert_unchanged(&self) {
        self.assert_sysctls_unchanged();
        assert!(!self.seen.is_empty(), "the daemon's programs were never seen");
        let left = oracle::loaded_after_exit(|(id, _)| self.seen.contains(id));
        assert!(left.is_empty(), "programs of the stopped daemon still loaded 10 s on: {left:?}");
    }
}

/// An iperf3 client in `a` sending to a one-shot server in `b` at `rate` for `secs`.
pub fn iperf3(pair: &Pair, secs: u32, rate: &str) -> (Child, Child) {
    let server = iperf3_server_in(&pair.b.name, pair.b_addr);
    let client = pair
        .a
        .command(&["iperf3", "-c", pair.b_addr, "-t", &secs.to_string(), "-b", rate])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("iperf3 -c");
    (server, client)
}

/// Ends an iperf3 pair, whatever state it is in.
pub fn end(mut procs: (Child, Child)) {
    for c in [&mut procs.0, &mut procs.1] {
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl Netns {
    /// `args` as a command inside the namespace, to spawn.
    pub fn command(&self, args: &[&str]) -> std::process::Command {
        let mut c = std::process::Command::new("ip");
        c.args(["netns", "exec", &self.name]).args(args);
        c
    }
}
