//! Per-peer transport from the sock_ops program, judged by `ss -tin` (each connection's
//! congestion control) and bpftool (the program attached to the cgroup, and gone): on a lab
//! host whose daemon's policy gives the US peer "reno" while calm and "cubic" once the link
//! loses packets, an iperf3 connection to the peer gets reno at establishment and switches to
//! cubic when the lab's loss phase moves the link to "lossy", while a loopback connection on
//! the same host and a connection to the same peer from another lab host (another network
//! namespace, same addresses) keep the host's default; the first flight of a new connection to
//! the peer is the profile's initial window (tcpdump, tshark), the other host's the kernel's. A
//! policy naming an algorithm the kernel lacks is refused with its line; SIGKILL then a restart
//! leaves one attachment; a `--cgroup` that is not cgroup v2 is refused; on a host without
//! cgroup v2 the daemon runs without profiles and status says why.

use std::sync::LazyLock;

use linkpilot_tests::policy::PolicyToml;
use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use linkpilot_lab::{
    lab::{Host, Lab, LabConfig, Site},
    scenario::Scenario,
};
use linkpilot_tests::{
    daemon::{status_json, sysctl, wait_for, Daemon},
    linkpilot_bin, sh,
};

static POLICY: LazyLock<String> = LazyLock::new(|| {
    PolicyToml::new()
        .lab_link("100Mbit/s")
        // Compression only: the transport profile is what these tests change.
        .raw(
            "[[state]]\nname = \"healthy\"\n[state.knobs]\ncompression = \"none\"\n\
             [state.transport]\ncongestion_control = \"reno\"\ninitial_cwnd = 20\n\
             [[state]]\nname = \"lossy\"\nenter = { retrans = \"1%\" }\n[state.knobs]\n\
             compression = \"int8\"\n[state.transport]\ncongestion_control = \"cubic\"",
        )
        .build()
});

/// The cgroup v2 hierarchy the daemon attaches to by default here.
fn cgroup() -> String {
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .find(|p| sh(&["stat", "-f", "-c", "%T", p]).trim() == "cgroup2fs")
        .expect("a cgroup v2 hierarchy")
        .to_owned()
}

/// Our sock_ops programs attached to `cgroup`, as bpftool lists them.
fn attached(cgroup: &str) -> usize {
    sh(&["bpftool", "cgroup", "show", cgroup]).lines().filter(|l| l.contains("lp_sock_ops")).count()
}

/// The congestion control of each established TCP connection in `netns` matching `filter`
/// (ss's own filter syntax), as `ss -tin` shows it; with `busy`, only connections that have
/// sent over a megabyte (an iperf3 test's data connection, not its idle control connection).
fn congestion_controls_of(netns: &str, filter: &str, busy: bool) -> Vec<String> {
    let out = sh(&["ip", "netns", "exec", netns, "ss", "-Htin", "state", "established", filter]);
    let known = ["reno", "cubic", "bbr", "dctcp", "vegas", "htcp"];
    out.lines()
        .filter(|l| l.starts_with(char::is_whitespace))
        .filter(|l| {
            let acked = l.split_whitespace().find_map(|t| t.strip_prefix("bytes_acked:"));
            !busy || acked.and_then(|n| n.parse::<u64>().ok()).is_some_and(|n| n > 1 << 20)
        })
        .filter_map(|l| l.split_whitespace().find(|t| known.contains(t)).map(str::to_owned))
        .collect()
}

fn congestion_controls(netns: &str, filter: &str) -> Vec<String> {
    congestion_controls_of(netns, filter, false)
}

fn iperf3(host: &Host, args: &[&str]) -> Child {
    host.command("iperf3")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("iperf3")
}

/// `netns`'s established connections matching `filter` (`busy`: those carrying data) once
/// there are at least `min` and all are `want`, or what they are at `limit`.
fn wait_all(
    netns: &str,
    filter: &str,
    (busy, min): (bool, usize),
    want: &str,
    limit: Duration,
) -> Vec<String> {
    let start = Instant::now();
    loop {
        let cc = congestion_controls_of(netns, filter, busy);
        if (cc.len() >= min && cc.iter().all(|c| c == want)) || start.elapsed() > limit {
            return cc;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The first flight of a new connection from `from` to `to`: the payload bytes `from` sent
/// before the first acknowledgement of data came back, over the connection's MSS (tcpdump on
/// `from`'s side, read by tshark). A 256 KiB write right after connect, so only the initial
/// congestion window limits it.
fn first_flight(from: &Host, to: &Host, port: u16, pcap: &std::path::Path) -> (u64, u64) {
    let filter = format!("tcp port {port}");
    let dump = linkpilot_lab::selftest::start_capture(from, &filter, &pcap.display().to_string())
        .expect("tcpdump");
    let sink = format!(
        "import socket\nl=socket.create_server(('{}',{port}))\nc,_=l.accept()\n\
         while c.recv(1<<16): pass",
        to.ipv4
    );
    let mut server = to.command("python3").args(["-c", &sink]).spawn().expect("sink");
    std::thread::sleep(Duration::from_millis(300));
    let send = format!(
        "import socket\ns=socket.create_connection(('{}',{port}))\ns.sendall(b'x'*(256<<10))\n\
         s.close()",
        to.ipv4
    );
    let sent = from.command("python3").args(["-c", &send]).status().expect("sender");
    assert!(sent.success());
    server.wait().expect("sink");
    assert_eq!(linkpilot_lab::selftest::stop_capture(dump).expect("stop tcpdump"), 0, "drops");
    let fields = sh(&[
        "tshark",
        "-r",
        &pcap.display().to_string(),
        "-T",
        "fields",
        "-e",
        "ip.src",
        "-e",
        "tcp.len",
        "-e",
        "tcp.ack",
        "-e",
        "tcp.options.mss_val",
    ]);
    let (mut bytes, mut mss) = (0u64, 0u64);
    for l in fields.lines() {
        let f: Vec<&str> = l.split('\t').collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        if f[0] == to.ipv4.to_string() {
            // The peer's SYN-ACK offers its MSS; its first ACK beyond the SYN ends the flight.
            if mss == 0 {
                mss = num(3);
            } else if num(2) > 1 {
                break;
            }
        } else {
            bytes += num(1);
        }
    }
    assert!(mss > 0, "no SYN-ACK in the capture:\n{fields}");
    // Timestamps take 12 bytes of each segment's options.
    (bytes, mss - 12)
}

#[test]
fn the_peers_connections_follow_the_links_state_and_no_other_connection_changes() {
    // A queue of 2 MiB (the default is 150 kB, under the 250 kB path BDP): the other host's
    // connection starts in BBR, whose start-up overshoot would overflow the default queue, and
    // the drops would move the link to "lossy" before the calm phase's checks.
    let toml = "name = \"t\"\n\
                [[phase]]\nname = \"calm\"\nduration = \"25s\"\n[phase.link]\ndelay = \"10ms\"\n\
                rate = \"100Mbit/s\"\nqueue = \"2MiB\"\n\
                [[phase]]\nname = \"lossy\"\nduration = \"10min\"\n[phase.link]\ndelay = \"10ms\"\n\
                rate = \"100Mbit/s\"\nqueue = \"2MiB\"\nloss = { model = \"bernoulli\", rate = \"3%\" }\n";
    let scenario = Scenario::parse(toml, "<test>", None).expect("scenario");
    let cfg = LabConfig { name: "dtp".into(), hosts_per_site: 2, ..LabConfig::default() };
    let lab = Lab::start(cfg, scenario).expect("lab");
    let started = Instant::now();
    let (hk, hk2, us) = (
        lab.host(Site::Hk, 0).clone(),
        lab.host(Site::Hk, 1).clone(),
        lab.host(Site::Us, 0).clone(),
    );
    let default_cc = sysctl(&hk.netns, "net.ipv4.tcp_congestion_control");
    assert_ne!(default_cc, "reno", "the test needs a default other than the profiles'");
    assert_ne!(default_cc, "cubic");
    let cg = cgroup();
    let before = attached(&cg);
    let dir = linkpilot_tests::temp_dir("transport");
    let d = Daemon::start_with(&hk.netns, &dir, &POLICY, &["--metrics-addr", "off"]);
    wait_for("the board", Duration::from_secs(20), || dir.join("knobs").exists());
    assert_eq!(attached(&cg), before + 1, "one sock_ops attachment: {}", d.log());
    let st = status_json(&dir);
    assert_eq!(st["transport"]["path"], format!("sock_ops on cgroup {cg}"), "{st}");

    // Long senders, all established in the calm phase: HK -> US (the peer), HK -> HK over
    // loopback, and the other HK host -> US (same peer address, another namespace).
    let usip = us.ipv4.to_string();
    let mut servers = [
        iperf3(&us, &["-s", "-1", "-p", "5201"]),
        iperf3(&us, &["-s", "-1", "-p", "5202"]),
        iperf3(&hk, &["-s", "-1", "-p", "5203", "-B", "127.0.0.1"]),
    ];
    std::thread::sleep(Duration::from_millis(500));
    let mut clients = [
        iperf3(&hk, &["-c", &usip, "-p", "5201", "-t", "60", "-b", "20M"]),
        iperf3(&hk2, &["-c", &usip, "-p", "5202", "-t", "60", "-b", "20M"]),
        iperf3(&hk, &["-c", "127.0.0.1", "-p", "5203", "-t", "60", "-b", "20M"]),
    ];
    let to_peer = wait_all(&hk.netns, "dport = :5201", (false, 2), "reno", Duration::from_secs(5));
    assert!(to_peer.len() >= 2 && to_peer.iter().all(|c| c == "reno"), "{to_peer:?}");
    let secs5 = Duration::from_secs(5);
    let loopback = wait_all(&hk.netns, "dport = :5203", (false, 2), &default_cc, secs5);
    assert!(loopback.len() >= 2 && loopback.iter().all(|c| *c == default_cc), "{loopback:?}");
    let other_ns = wait_all(&hk2.netns, "dport = :5202", (false, 2), &default_cc, secs5);
    assert!(other_ns.len() >= 2 && other_ns.iter().all(|c| *c == default_cc), "{other_ns:?}");
    // The first flight of a new connection to the peer is the profile's initial window (20
    // segments); from the other host, the kernel's (10). Still "healthy": "lossy" has none.
    let st = status_json(&dir);
    assert_eq!(st["links"][0]["state"], "healthy", "{st}");
    let (ours, mss) = first_flight(&hk, &us, 5301, &dir.join("iw-ours.pcap"));
    let (theirs, mss2) = first_flight(&hk2, &us, 5302, &dir.join("iw-theirs.pcap"));
    eprintln!("first flights: profiled {ours} bytes, default {theirs} bytes (MSS {mss})");
    assert_eq!((ours, theirs), (20 * mss, 10 * mss2), "first flights, MSS {mss}");
    assert!(started.elapsed() < Duration::from_secs(25), "still calm when checked");

    // The loss phase: "lossy" gives cubic, and the established data connection takes it at
    // its next RTT sample (iperf3's idle control connection will at its next exchange).
    let switched =
        wait_all(&hk.netns, "dport = :5201", (true, 1), "cubic", Duration::from_secs(40));
    assert!(!switched.is_empty() && switched.iter().all(|c| c == "cubic"), "{switched:?}");
    // Status reads the program's figures once a second.
    wait_for("status to show the lossy profile", Duration::from_secs(5), || {
        status_json(&dir)["transport"]["links"][0]["profile"] == "cc=cubic"
    });
    let st = status_json(&dir);
    assert_eq!(st["links"][0]["state"], "lossy", "{st}");
    let t = &st["transport"]["links"][0];
    assert!(t["profiled"].as_u64() >= Some(2), "{t}");
    assert!(t["updated"].as_u64() >= Some(1) && t["current"].as_u64() >= Some(1), "{t}");
    assert!(t["connections"].as_u64() >= Some(2) && t["refused"] == 0, "{t}");
    assert_eq!(congestion_controls(&hk.netns, "dport = :5203"), loopback, "loopback changed");
    assert_eq!(congestion_controls(&hk2.netns, "dport = :5202"), other_ns, "other namespace");
    for c in clients.iter_mut().chain(servers.iter_mut()) {
        let _ = c.kill();
        let _ = c.wait();
    }

    // SIGKILL: the link dies with the process; a restart attaches exactly one again.
    drop(d);
    assert_eq!(attached(&cg), before, "the attachment outlived a SIGKILL");
    let mut d = Daemon::start_with(&hk.netns, &dir, &POLICY, &["--metrics-addr", "off"]);
    wait_for("the program attached again", Duration::from_secs(20), || {
        d.log().contains("transport profiles by sock_ops")
    });
    assert_eq!(attached(&cg), before + 1);
    // SIGTERM: detached on the way out.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("TERM");
    assert!(d.exit_within(Duration::from_secs(10)).success());
    assert_eq!(attached(&cg), before, "attached after a stop");

    // Told to attach to a directory that is not a cgroup v2 one: refused at start, with the
    // directory named, and nothing attached.
    let not_cgroup = dir.join("not-a-cgroup");
    std::fs::create_dir_all(&not_cgroup).expect("dir");
    let flag = not_cgroup.display().to_string();
    let mut d =
        Daemon::start_with(&hk.netns, &dir, &POLICY, &["--metrics-addr", "off", "--cgroup", &flag]);
    assert!(!d.exit_within(Duration::from_secs(20)).success());
    let want = format!("--cgroup {flag} is not a cgroup v2 directory");
    assert!(d.log().contains(&want), "{}", d.log());
    assert_eq!(attached(&cg), before);

    // A host without cgroup v2 (here a mount namespace whose /sys/fs/cgroup is a tmpfs): it
    // runs on the sysctls alone and says so.
    let no_cgroup2 = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        "mount -t tmpfs none /sys/fs/cgroup && exec \"$0\" \"$@\"",
    ];
    let d = Daemon::start_under(&hk.netns, &no_cgroup2, &dir, &POLICY, &["--metrics-addr", "off"]);
    wait_for("the fallback", Duration::from_secs(20), || {
        d.log().contains("no per-peer transport profiles")
    });
    wait_for("the status", Duration::from_secs(10), || {
        status_json(&dir)["transport"]["path"]
            .as_str()
            .is_some_and(|p| p.starts_with("sysctls only"))
    });
    let path = status_json(&dir)["transport"]["path"].clone();
    assert!(path.as_str().is_some_and(|p| p.contains("no cgroup v2 hierarchy")), "{path}");
    assert_eq!(attached(&cg), before);
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_policy_naming_an_unavailable_algorithm_is_refused_with_its_line() {
    let dir = linkpilot_tests::temp_dir("transport-cc");
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, POLICY.replace("\"cubic\"", "\"no_such_cc\"")).expect("policy");
    // Not a lab host: the check comes before anything is attached or changed.
    let out = Command::new(linkpilot_bin())
        .args(["run", "--policy"])
        .arg(&policy)
        .args(["--metrics-addr", "off", "--lock"])
        .arg(dir.join("lock"))
        .output()
        .expect("linkpilot run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let at = format!(
        "{}:24:22: state \"lossy\": congestion control \"no_such_cc\" is not available",
        policy.display()
    );
    assert!(err.contains(&at), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
