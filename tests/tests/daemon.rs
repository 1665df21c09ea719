//! `linkpilot run` on the WAN lab: ECN marks on the path drive the link to "congested", the knob
//! board, the env file and the namespace's TCP buffer sysctls follow, and SIGTERM rolls the
//! sysctls back while the board goes stale.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use linkpilot::board::{is_stale, name, BoardReader};
use linkpilot_common::board::compression;
use linkpilot_lab::{
    lab::{Lab, LabConfig, Site},
    scenario::{Direction, Scenario},
};
use linkpilot_tests::linkpilot_bin;
use nix::{sys::signal::Signal, unistd::Pid};

const POLICY: &str = r#"
[daemon]
tick = "100ms"
[hysteresis]
enter_after = "300ms"
exit_after = "30s"
min_dwell = "1s"
[bounds]
tcp_buffers = { min = "64MiB", max = "256MiB", bdp_factor = 2.0, max_step = 4.0 }
[[link]]
name = "wan"
interfaces = ["eth0"]
capacity = "50Mbit/s"
[[link.peer]]
name = "us"
cidrs = ["198.18.2.0/24"]
[[state]]
name = "healthy"
[state.knobs]
compression = "none"
dscp = 26
roce_traffic_class = 106
[[state]]
name = "congested"
enter = { ce_fraction = "1%" }
exit = { ce_fraction = "0.2%" }
[state.knobs]
compression = "int8"
dscp = 10
roce_traffic_class = 42
"#;

fn tcp_rmem_max(netns: &str) -> String {
    let out =
        linkpilot_tests::sh(&["ip", "netns", "exec", netns, "cat", "/proc/sys/net/ipv4/tcp_rmem"]);
    out.split_whitespace().last().unwrap_or_default().to_owned()
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "{what} did not happen within {limit:?}");
        thread::sleep(Duration::from_millis(50));
    }
}

struct Daemon {
    child: Child,
    dir: PathBuf,
}

impl Daemon {
    fn start(netns: &str, dir: &Path) -> Self {
        std::fs::create_dir_all(dir).expect("dir");
        std::fs::write(dir.join("policy.toml"), POLICY).expect("policy");
        let p = |f: &str| dir.join(f).display().to_string();
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{netns}"))
            .arg(linkpilot_bin())
            .args(["run", "--policy", &p("policy.toml"), "--board", &p("knobs")])
            .args(["--env-file", &p("nccl.env"), "--sysctl-state", &p("sysctl.json")])
            .args(["--decision-log", &p("decisions.jsonl"), "--record", &p("trace.jsonl")])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("log")).expect("log"))
            .spawn()
            .expect("linkpilot run");
        Self { child, dir: dir.to_owned() }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn ecn_drives_the_link_congested_and_sigterm_rolls_back() {
    let toml = "name = \"ecn\"\n[[phase]]\nname = \"only\"\nduration = \"10min\"\n[phase.link]\n\
                delay = \"10ms\"\nrate = \"50Mbit/s\"\nqueue = \"2MiB\"\n\
                ecn = { mode = \"step\", threshold = \"5ms\" }\n";
    let scenario = Scenario::parse(toml, "<test>", None).expect("scenario");
    let lab = Lab::start(LabConfig { name: "drun".into(), ..LabConfig::default() }, scenario)
        .expect("lab");
    let (hk, us) = (lab.host(Site::Hk, 0).clone(), lab.host(Site::Us, 0).clone());
    for h in [&hk, &us] {
        h.exec(&["sysctl", "-qw", "net.ipv4.tcp_ecn=1"]).expect("sysctl");
    }
    let rmem_before = tcp_rmem_max(&hk.netns);
    let dir = std::env::temp_dir().join(format!("lp-daemon-{}", std::process::id()));
    let mut d = Daemon::start(&hk.netns, &dir);
    wait_for("the board", Duration::from_secs(20), || dir.join("knobs").exists());
    let board = BoardReader::open(&dir.join("knobs")).expect("board");
    wait_for("the first decision", Duration::from_secs(5), || {
        board.read(100).is_ok_and(|b| b.header.n_links == 1)
    });
    let b = board.read(100).expect("read");
    assert_eq!(
        (name(&b.links[0].state), b.links[0].compression),
        ("healthy".into(), compression::NONE)
    );

    let mut server = us
        .command("iperf3")
        .args(["-s", "-1", "-B", &us.ipv4.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .expect("iperf3 -s");
    thread::sleep(Duration::from_millis(300));
    let onset = Instant::now();
    let mut client = hk
        .command("iperf3")
        .args(["-c", &us.ipv4.to_string(), "-C", "cubic", "-t", "6"])
        .stdout(Stdio::null())
        .spawn()
        .expect("iperf3 -c");
    wait_for("congested on the board", Duration::from_secs(6), || {
        board.read(100).is_ok_and(|b| name(&b.links[0].state) == "congested")
    });
    let took = onset.elapsed();
    let b = board.read(100).expect("read");
    assert_eq!(b.links[0].compression, compression::INT8);
    assert_eq!((b.links[0].dscp, b.links[0].roce_traffic_class), (10, 42));
    let env = std::fs::read_to_string(dir.join("nccl.env")).expect("env file");
    assert!(env.contains("LINKPILOT_STATE=congested") && env.contains("NCCL_IB_TC=42"), "{env}");
    // The namespace's tcp_rmem maximum follows the policy (64 MiB at least).
    let rmem_during = tcp_rmem_max(&hk.netns);
    assert!(rmem_during.parse::<u64>().unwrap_or(0) >= 64 << 20, "tcp_rmem max {rmem_during}");
    client.wait().expect("iperf3 client");
    server.wait().expect("iperf3 server");
    // The lab's own count says the path really marked: the state follows the link, not noise.
    let lab_ce = lab.stats(Direction::HkToUs).ce_marked;
    assert!(lab_ce > 100, "the lab marked only {lab_ce} packets CE");

    nix::sys::signal::kill(Pid::from_raw(d.child.id() as i32), Signal::SIGTERM).expect("SIGTERM");
    let status = d.child.wait().expect("exit");
    let log = d.log();
    assert!(status.success(), "{status}: {log}");
    assert_eq!(tcp_rmem_max(&hk.netns), rmem_before, "sysctls restored: {log}");
    assert!(!dir.join("sysctl.json").exists(), "state file removed");
    // Readers see the daemon gone within two heartbeats.
    thread::sleep(Duration::from_millis(250));
    let b = board.read(100).expect("read");
    assert!(is_stale(&b, linkpilot::probes::monotonic_ns()), "the board should be stale");
    let decisions = std::fs::read_to_string(dir.join("decisions.jsonl")).unwrap_or_default();
    let trace = std::fs::read_to_string(dir.join("trace.jsonl")).unwrap_or_default();
    eprintln!("congested {took:?} after the sender started; decisions:\n{decisions}");
    assert!(decisions
        .lines()
        .any(|l| l.contains("\"state\":\"congested\"") && l.contains("ce_fraction")));
    assert!(trace.lines().count() > 20, "the recorded trace");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigkill_then_restart_leaves_one_set_of_attachments_and_the_original_sysctls() {
    let toml = "name = \"calm\"\n[[phase]]\nname = \"only\"\nduration = \"10min\"\n[phase.link]\n\
                delay = \"5ms\"\n";
    let scenario = Scenario::parse(toml, "<test>", None).expect("scenario");
    let lab = Lab::start(LabConfig { name: "dkill".into(), ..LabConfig::default() }, scenario)
        .expect("lab");
    let hk = lab.host(Site::Hk, 0).clone();
    let rmem_before = tcp_rmem_max(&hk.netns);
    let ours = |links: &[(String, String)]| -> usize {
        links.iter().filter(|(_, p)| p.starts_with("lp_")).count()
    };
    let baseline = ours(&linkpilot_tests::oracle::links());
    let dir = std::env::temp_dir().join(format!("lp-daemon-kill-{}", std::process::id()));
    let mut first = Daemon::start(&hk.netns, &dir);
    wait_for("the first run's sysctls", Duration::from_secs(20), || {
        tcp_rmem_max(&hk.netns) != rmem_before
    });
    let one_set = ours(&linkpilot_tests::oracle::links()) - baseline;
    assert_eq!(one_set, 5, "2 TCX + 3 tracepoint links: {:?}", linkpilot_tests::oracle::links());
    // SIGKILL: no rollback; the state file and the changed sysctl stay behind.
    first.child.kill().expect("SIGKILL");
    first.child.wait().expect("exit");
    assert!(dir.join("sysctl.json").exists());
    assert_ne!(tcp_rmem_max(&hk.netns), rmem_before);
    // fd-owned links die with the process.
    wait_for("the killed run's links to go", Duration::from_secs(5), || {
        ours(&linkpilot_tests::oracle::links()) == baseline
    });
    std::fs::remove_file(dir.join("knobs")).expect("the old board");
    let mut second = Daemon::start(&hk.netns, &dir);
    wait_for("the second run's board", Duration::from_secs(20), || dir.join("knobs").exists());
    thread::sleep(Duration::from_millis(500));
    assert_eq!(ours(&linkpilot_tests::oracle::links()) - baseline, one_set, "exactly one set");
    let log = second.log();
    assert!(log.contains("a previous run left sysctls changed; restoring them"), "{log}");
    nix::sys::signal::kill(Pid::from_raw(second.child.id() as i32), Signal::SIGTERM).expect("TERM");
    assert!(second.child.wait().expect("exit").success(), "{}", second.log());
    // The originals from before the first run, not the first run's values.
    assert_eq!(tcp_rmem_max(&hk.netns), rmem_before);
    assert!(!dir.join("sysctl.json").exists());
    assert_eq!(ours(&linkpilot_tests::oracle::links()), baseline);
    let _ = std::fs::remove_dir_all(&dir);
}
