//! `linkpilot run` driven as an operator would: in a lab host's namespace, every path in one
//! directory, its log kept; and what tests read back from it (metrics, status, sysctls).

use std::sync::LazyLock;

use crate::policy::PolicyToml;
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use linkpilot_lab::{
    lab::{Host, Lab, LabConfig},
    scenario::Scenario,
};

use linkpilot::board::BoardReader;

use crate::linkpilot_bin;

/// A lab of `delay` each way at 50 Mbit/s whose queue CE-marks above 5 ms, both hosts
/// negotiating ECN: the lab and its HK and US hosts.
pub fn ecn_lab(name: &str, delay: &str) -> (Lab, Host, Host) {
    let link = format!(
        "delay = \"{delay}\"\nrate = \"50Mbit/s\"\nqueue = \"2MiB\"\n\
         ecn = {{ mode = \"step\", threshold = \"5ms\" }}"
    );
    let lab = lab_with(name, &link);
    let (hk, us) = lab.hk_us();
    for h in [&hk, &us] {
        h.exec(&["sysctl", "-qw", "net.ipv4.tcp_ecn=1"]).expect("sysctl");
    }
    (lab, hk, us)
}

/// A lab whose link is `link` (the `[phase.link]` body of a one-phase scenario) for 10 minutes.
pub fn lab_with(name: &str, link: &str) -> Lab {
    let toml = format!(
        "name = \"t\"\n[[phase]]\nname = \"only\"\nduration = \"10min\"\n[phase.link]\n{link}\n"
    );
    let scenario = Scenario::parse(&toml, "<test>", None).expect("scenario");
    Lab::start(LabConfig { name: name.into(), ..LabConfig::default() }, scenario).expect("lab")
}

/// An iperf3 server on `host`'s IPv4 address for one test (`-1`), listening.
pub fn iperf3_server(host: &Host) -> Child {
    iperf3_server_in(&host.netns, &host.ipv4.to_string())
}

/// An iperf3 server on `addr` in the network namespace `netns` for one test (`-1`), listening.
pub fn iperf3_server_in(netns: &str, addr: &str) -> Child {
    let child = Command::new("ip")
        .args(["netns", "exec", netns, "iperf3", "-s", "-1", "-B", addr])
        .stdout(Stdio::null())
        .spawn()
        .expect("iperf3 -s");
    // Listening, as ss sees it (a fixed sleep loses the race on a loaded machine).
    wait_for("iperf3 -s listening", Duration::from_secs(5), || {
        !crate::run(&["ip", "netns", "exec", netns, "ss", "-Hltn", "sport = :5201"])
            .stdout
            .is_empty()
    });
    child
}

/// `iperf3 -c` from `from` to `to`'s IPv4 address with `args`, running, its report discarded.
pub fn iperf3_client(from: &Host, to: &Host, args: &[&str]) -> Child {
    from.command("iperf3")
        .args(["-c", &to.ipv4.to_string()])
        .args(args)
        .stdout(Stdio::null())
        .spawn()
        .expect("iperf3 -c")
}

pub fn tcp_rmem_max(netns: &str) -> String {
    let out = crate::sh(&["ip", "netns", "exec", netns, "cat", "/proc/sys/net/ipv4/tcp_rmem"]);
    out.split_whitespace().last().unwrap_or_default().to_owned()
}

/// A sysctl's value in `netns`, as `sysctl -n` prints it (`name` dotted: net.ipv4.tcp_ecn).
pub fn sysctl(netns: &str, name: &str) -> String {
    crate::sh(&["ip", "netns", "exec", netns, "sysctl", "-n", name]).trim().to_owned()
}

pub fn wait_for(what: &str, limit: Duration, f: impl FnMut() -> bool) {
    wait_for_every(what, limit, Duration::from_millis(50), f);
}

/// [`wait_for`], asking every `every`: for checks that start a process each time.
pub fn wait_for_every(what: &str, limit: Duration, every: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "{what} did not happen within {limit:?}");
        thread::sleep(every);
    }
}

/// How long `pid`'s main thread has been runnable without a CPU, as the scheduler counts it
/// (the second field of `/proc/PID/schedstat`); `None` where the kernel keeps no such count.
pub fn run_delay(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
    Some(Duration::from_nanos(stat.split_whitespace().nth(1)?.parse().ok()?))
}

/// What the lab tests allow a daemon's start (binding, loading and attaching the programs, a
/// first tick) of its own time: the wall time less what its main thread spent runnable but
/// waiting for a CPU (`/proc/PID/schedstat`). The start costs 1-2 CPU seconds, mostly the
/// kernel's verifier; on the suite's loaded 2 cores a start's wall time reached 21 s, all but
/// a second of it queued behind other tests' processes. Its own time moves with what the
/// daemon does (computing, sleeping, blocking on a file), not with how busy the node is.
pub const START_ALLOWANCE: Duration = Duration::from_secs(30);

/// How often a wait asks the status API: each ask is a `linkpilot status` process, and tests
/// side by side asking at 20 Hz slow every start around them.
const STATUS_EVERY: Duration = Duration::from_millis(200);

pub struct Daemon {
    pub child: Child,
    pub dir: PathBuf,
    spawned: Instant,
}

impl Daemon {
    /// Starts with `policy` written to DIR/policy.toml (unless one is there already).
    pub fn start(netns: &str, dir: &Path, policy: &str) -> Self {
        Self::start_with(netns, dir, policy, &[])
    }

    /// `extra` may name other files for the flags below (`--policy` too: then `policy` is not
    /// written).
    pub fn start_with(netns: &str, dir: &Path, policy: &str, extra: &[&str]) -> Self {
        Self::start_under(netns, &[], dir, policy, extra)
    }

    /// [`Self::start_with`] with `wrapper` (a program and its arguments, `setpriv ...`, which
    /// execs the daemon in its place) between `nsenter` and `linkpilot`.
    pub fn start_under(
        netns: &str,
        wrapper: &[&str],
        dir: &Path,
        policy: &str,
        extra: &[&str],
    ) -> Self {
        std::fs::create_dir_all(dir).expect("dir");
        if !extra.contains(&"--policy") && !dir.join("policy.toml").exists() {
            std::fs::write(dir.join("policy.toml"), policy).expect("policy");
        }
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{netns}")).args(wrapper).arg(linkpilot_bin()).arg("run");
        // Every file in `dir`, unless `extra` names another.
        for (flag, file) in [
            ("--policy", "policy.toml"),
            ("--board", "knobs"),
            ("--env-file", "nccl.env"),
            ("--sysctl-state", "sysctl.json"),
            ("--roce-tc-state", "roce-tc.json"),
            ("--decision-log", "decisions.jsonl"),
            ("--record", "trace.jsonl"),
            ("--status-socket", "status.sock"),
            ("--lock", "lock"),
            ("--tuner-stats", "tuner"),
            ("--job-reports", "jobs"),
        ] {
            if !extra.contains(&flag) {
                cmd.arg(flag).arg(dir.join(file));
            }
        }
        let child = cmd
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("log")).expect("log"))
            .spawn()
            .expect("linkpilot run");
        Self { child, dir: dir.to_owned(), spawned: Instant::now() }
    }

    /// Its exit status once it has stopped, within `limit` (a daemon still running then is a
    /// failure, and is killed when dropped).
    pub fn exit_within(&mut self, limit: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                return s;
            }
            assert!(start.elapsed() < limit, "still running after {limit:?}:\n{}", self.log());
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the start to end: the status API (answering from its bind, `starting` while
    /// the programs load) says a first tick is done. Fails with the log if the daemon exits
    /// first, or once the start has taken [`START_ALLOWANCE`] of its own time. For a daemon on
    /// `DIR/status.sock` (`nsenter` and any wrapper exec it, so the child is the daemon).
    pub fn wait_up(&mut self) {
        loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                panic!("linkpilot run exited ({s}): {}", self.log());
            }
            // Until the bind, the socket may be a killed run's: not answering is not yet up.
            let last = match try_status_json(&self.dir) {
                Ok(s) if s["starting"] == false && s["ticks"].as_u64() > Some(0) => return,
                Ok(s) => format!("starting {}, ticks {}", s["starting"], s["ticks"]),
                Err(e) => e,
            };
            let wall = self.spawned.elapsed();
            let queued = run_delay(self.child.id()).unwrap_or_default();
            assert!(
                wall.saturating_sub(queued) < START_ALLOWANCE,
                "no first tick within {START_ALLOWANCE:?} of the start's own time ({wall:?} of \
                 wall time, {queued:?} of it waiting for a CPU); the status: {last}\n{}",
                self.log()
            );
            thread::sleep(STATUS_EVERY);
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    /// The daemon's knob board once its first decision is there (a policy of one link).
    pub fn first_decision(&self) -> BoardReader {
        let path = self.dir.join("knobs");
        wait_for("the first decision on the board", Duration::from_secs(5), || {
            BoardReader::open(&path).and_then(|b| b.read()).is_ok_and(|b| b.header.n_links == 1)
        });
        BoardReader::open(&path).expect("board")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A failing test shows what the daemon said (its directory may be removed after).
        if thread::panicking() {
            eprintln!("linkpilot run's log ({}):\n{}", self.dir.display(), self.log());
        }
    }
}

/// The daemon's metrics, fetched from inside its namespace as a local Prometheus would.
pub fn scrape(netns: &str) -> String {
    crate::sh(&[
        "nsenter",
        &format!("--net=/run/netns/{netns}"),
        "curl",
        "-sf",
        "http://127.0.0.1:9464/metrics",
    ])
}

/// The value of the sample line that starts with `series` (name and labels).
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
}

/// `linkpilot status ARGS` on `DIR/status.sock`, whatever it answers (`prefix`: what the
/// command runs under, `setpriv` for another user).
pub fn linkpilot_status(prefix: &[&str], dir: &Path, args: &[&str]) -> Output {
    let (bin, socket) = (linkpilot_bin(), dir.join("status.sock"));
    let (bin, socket) = (bin.display().to_string(), socket.display().to_string());
    let mut all = prefix.to_vec();
    all.extend([bin.as_str(), "status", "--socket", &socket]);
    all.extend(args);
    crate::run(&all)
}

/// The status table, as root reads it.
pub fn status_table(dir: &Path) -> String {
    let out = linkpilot_status(&[], dir, &[]);
    assert!(out.status.success(), "linkpilot status: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn status_json(dir: &Path) -> serde_json::Value {
    try_status_json(dir).unwrap_or_else(|e| panic!("{e}"))
}

/// `linkpilot status --json` on `DIR/status.sock`, or what it said when it failed.
pub fn try_status_json(dir: &Path) -> Result<serde_json::Value, String> {
    let out = linkpilot_status(&[], dir, &["--json"]);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).expect("status JSON"))
}

/// A one-state policy for a `netns::Pair`'s `lpa0` that sets tcp_ecn: enough for tests of how the
/// daemon starts, runs and stops rather than of what it decides.
pub static PAIR_POLICY: LazyLock<String> = LazyLock::new(|| {
    PolicyToml::new()
        .table("[host]\ntcp_ecn = 1")
        // The test addresses (a policy naming no peer only observes).
        .link("wan", "lpa0", "50Mbit/s", Some(("lab", "198.18.0.0/15")))
        .healthy()
        .build()
});
