//! `linkpilot run` on the WAN lab: ECN marks on the path drive the link to "congested", the knob
//! board, the env file and the namespace's TCP buffer sysctls follow, and SIGTERM rolls the
//! sysctls back while the board goes stale.

use std::sync::LazyLock;

use linkpilot_tests::policy::PolicyToml;
use linkpilot_tests::rdma::RdmaFixture;
use std::{
    process::Command,
    thread,
    time::{Duration, Instant},
};

use linkpilot::board::{is_stale, name, BoardReader};
use linkpilot_common::board::compression;
use linkpilot_lab::{
    lab::{Host, Site},
    scenario::Direction,
};
use linkpilot_tests::{
    daemon::{
        ecn_lab, iperf3_client, iperf3_server, lab_with, linkpilot_status, sample, scrape,
        status_json, status_table, sysctl, tcp_rmem_max, wait_for, Daemon,
    },
    linkpilot_bin,
};
use nix::{sys::signal::Signal, unistd::Pid};

static POLICY: LazyLock<String> = LazyLock::new(|| {
    PolicyToml::new()
        .hysteresis("30s", "1s")
        .table("[bounds]\ntcp_buffers = { min = \"64MiB\", max = \"256MiB\", bdp_factor = 2.0, max_step = 4.0 }")
        .table("[host]\ntcp_ecn = 1\nnetdev_max_backlog = 250000")
        .table("[env]\nNCCL_ALGO = \"Tree\"")
        .lab_link("50Mbit/s")
        .healthy()
        .congested_on_ce(10, 42)
        .build()
});

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[test]
fn ecn_drives_the_link_congested_and_sigterm_rolls_back() {
    let (lab, hk, us) = ecn_lab("drun", "10ms");
    let rmem_before = tcp_rmem_max(&hk.netns);
    let dir = std::env::temp_dir().join(format!("lp-daemon-{}", std::process::id()));
    let started_ms = unix_ms();
    let mut d = Daemon::start(&hk.netns, &dir, &POLICY);
    d.wait_up();
    let board = d.first_decision();
    let b = board.read().expect("read");
    assert_eq!(
        (name(&b.links[0].state), b.links[0].compression),
        ("healthy".into(), compression::NONE)
    );

    // What the US host receives, judged by tshark: the DSCP the daemon sets per state.
    let capture = |on: &Host, filter: String, file: &str| {
        let pcap = dir.join(file).display().to_string();
        (linkpilot_lab::selftest::start_capture(on, &filter, &pcap).expect("tcpdump"), pcap)
    };
    let (dump, pcap) = capture(&us, format!("src host {} and tcp", hk.ipv4), "us.pcap");
    // The sender's own capture, after the rewrite, tells new data from retransmissions exactly.
    let (sent_dump, sent_pcap) = capture(&hk, format!("dst host {} and tcp", us.ipv4), "hk.pcap");
    let mut server = iperf3_server(&us);
    let onset = Instant::now();
    let mut client = iperf3_client(&hk, &us, &["-C", "cubic", "-t", "6"]);
    wait_for("congested on the board", Duration::from_secs(6), || {
        board.read().is_ok_and(|b| name(&b.links[0].state) == "congested")
    });
    let took = onset.elapsed();
    let b = board.read().expect("read");
    assert_eq!(b.links[0].compression, compression::INT8);
    assert_eq!((b.links[0].dscp, b.links[0].roce_traffic_class), (10, 42));
    let env = std::fs::read_to_string(dir.join("nccl.env")).expect("env file");
    assert!(env.contains("LINKPILOT_STATE=congested") && env.contains("NCCL_IB_TC=42"), "{env}");
    // The namespace's tcp_rmem maximum is what the board says (the policy's 64 MiB floor).
    assert_eq!(tcp_rmem_max(&hk.netns), b.links[0].tcp_buffer_bytes.to_string());
    client.wait().expect("iperf3 client");
    server.wait().expect("iperf3 server");
    thread::sleep(Duration::from_millis(300));
    assert_eq!(linkpilot_lab::selftest::stop_capture(dump).expect("stop tcpdump"), 0, "drops");
    assert_eq!(linkpilot_lab::selftest::stop_capture(sent_dump).expect("stop tcpdump"), 0, "drops");
    let segments = linkpilot_tests::oracle::segments(&pcap);
    let data: Vec<_> = segments.iter().filter(|s| s.tcp_len > 0).collect();
    let count = |dscp: u64| data.iter().filter(|s| s.dscp == dscp).count();
    assert!(count(26) > 0 && count(10) > 100, "healthy 26 then congested 10: {segments:?}");
    assert_eq!(count(26) + count(10), data.len(), "only the policy's classes");
    // ECN bits kept by the rewrite, checksums valid after it.
    linkpilot_tests::oracle::new_data_is_ect0(&linkpilot_tests::oracle::segments(&sent_pcap))
        .unwrap();
    assert!(segments.iter().all(|s| s.checksum_good), "a bad or unverified IPv4 checksum");
    // The lab's own count says the path really marked: the state follows the link, not noise.
    let lab_ce = lab.stats(Direction::HkToUs).ce_marked;
    assert!(lab_ce >= 10, "the lab marked only {lab_ce} packets CE");

    nix::sys::signal::kill(Pid::from_raw(d.child.id() as i32), Signal::SIGTERM).expect("SIGTERM");
    let status = d.child.wait().expect("exit");
    let log = d.log();
    assert!(status.success(), "{status}: {log}");
    assert_eq!(tcp_rmem_max(&hk.netns), rmem_before, "sysctls restored: {log}");
    assert!(!dir.join("sysctl.json").exists(), "state file removed");
    // Readers see the daemon gone within two heartbeats.
    thread::sleep(Duration::from_millis(250));
    let b = board.read().expect("read");
    assert!(is_stale(&b, linkpilot::kernel::probes::monotonic_ns()), "the board should be stale");
    let decisions = std::fs::read_to_string(dir.join("decisions.jsonl")).unwrap_or_default();
    let trace = std::fs::read_to_string(dir.join("trace.jsonl")).unwrap_or_default();
    eprintln!("congested {took:?} after the sender started; decisions:\n{decisions}");
    assert!(decisions
        .lines()
        .any(|l| l.contains("\"state\":\"congested\"") && l.contains("ce_fraction")));
    // Every decision carries the wall-clock time it was taken, in order, within the test's.
    let stamps: Vec<u64> = decisions
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).expect("a JSON line")["unix_ms"]
                .as_u64()
                .expect("unix_ms")
        })
        .collect();
    assert!(stamps.windows(2).all(|w| w[0] <= w[1]), "{stamps:?}");
    assert!(stamps.iter().all(|t| (started_ms..=unix_ms()).contains(t)), "{stamps:?}");
    assert!(trace.lines().count() > 20, "the recorded trace");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigkill_then_restart_leaves_one_set_of_attachments_and_the_original_sysctls() {
    let lab = lab_with("dkill", "delay = \"5ms\"");
    let hk = lab.host(Site::Hk, 0).clone();
    let rmem_before = tcp_rmem_max(&hk.netns);
    let ours = |links: &[(String, String)]| -> usize {
        links.iter().filter(|(_, p)| p.starts_with("lp_")).count()
    };
    let baseline = ours(&linkpilot_tests::oracle::links());
    let dir = std::env::temp_dir().join(format!("lp-daemon-kill-{}", std::process::id()));
    let mut first = Daemon::start(&hk.netns, &dir, &POLICY);
    first.wait_up();
    assert_ne!(tcp_rmem_max(&hk.netns), rmem_before, "the first run's sysctls");
    let one_set = ours(&linkpilot_tests::oracle::links()) - baseline;
    assert_eq!(one_set, 5, "2 TCX + 3 tracepoint links: {:?}", linkpilot_tests::oracle::links());
    // SIGKILL: no rollback; the state file and the changed sysctl stay behind.
    let board = BoardReader::open(&dir.join("knobs")).expect("board");
    assert!(!is_stale(&board.read().expect("read"), linkpilot::kernel::probes::monotonic_ns()));
    first.child.kill().expect("SIGKILL");
    let killed = linkpilot::kernel::probes::monotonic_ns();
    first.child.wait().expect("exit");
    // Readers call the board stale two heartbeat intervals after the last beat; that beat was
    // at most one interval (plus a late tick) before the death, so staleness comes within two
    // intervals of it. Measured on the board itself rather than by polling.
    let last = board.read().expect("read").header;
    let interval = u64::from(last.heartbeat_interval_ms) * 1_000_000;
    let before_death = killed.saturating_sub(last.heartbeat_ns);
    assert!(
        before_death <= interval + 50_000_000,
        "the last heartbeat was {} ms before SIGKILL",
        before_death / 1_000_000
    );
    wait_for("the board to go stale", Duration::from_secs(2), || {
        board.read().is_ok_and(|b| is_stale(&b, linkpilot::kernel::probes::monotonic_ns()))
    });
    assert!(dir.join("sysctl.json").exists());
    assert_ne!(tcp_rmem_max(&hk.netns), rmem_before);
    // fd-owned links die with the process.
    wait_for("the killed run's links to go", Duration::from_secs(5), || {
        ours(&linkpilot_tests::oracle::links()) == baseline
    });
    std::fs::remove_file(dir.join("knobs")).expect("the old board");
    let mut second = Daemon::start(&hk.netns, &dir, &POLICY);
    second.wait_up();
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

#[test]
fn reload_metrics_and_status() {
    let lab = lab_with("drel", "delay = \"5ms\"");
    let (hk, us) = lab.hk_us();
    let dir = linkpilot_tests::temp_dir("daemon-reload");
    // The ConnectX sysfs fixture with port 1 on eth0, and an rdma_cm configfs fixture.
    let rdma = RdmaFixture::create(&dir, "eth0");
    let tos = rdma.tos.clone();
    let extra = rdma.args();
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let ecn_before = sysctl(&hk.netns, "net.ipv4.tcp_ecn");
    assert_ne!(ecn_before, "1", "a fresh namespace's tcp_ecn");
    let mut d = Daemon::start_with(&hk.netns, &dir, &POLICY, &extra);
    d.wait_up();
    let board = d.first_decision();
    let before = board.read().expect("read");
    assert_eq!(before.links[0].dscp, 26);
    // The RDMA port on eth0 got the healthy state's RoCE traffic class (before the board, which
    // the daemon updates last).
    assert_eq!(std::fs::read_to_string(&tos).expect("tos").trim(), "106");
    // The policy's [host] and [env] (netdev_max_backlog is not in this namespace: left alone).
    assert_eq!(sysctl(&hk.netns, "net.ipv4.tcp_ecn"), "1", "{}", d.log());
    let env = std::fs::read_to_string(dir.join("nccl.env")).expect("env file");
    assert!(env.contains("\nNCCL_ALGO=Tree\n"), "{env}");
    // A second of TCP so that RTT series exist.
    let mut server = iperf3_server(&us);
    let client = hk
        .command("iperf3")
        .args(["-c", &us.ipv4.to_string(), "-t", "1", "-b", "20M"])
        .output()
        .expect("iperf3 -c");
    assert!(client.status.success(), "{}", String::from_utf8_lossy(&client.stderr));
    server.wait().expect("iperf3 server");

    // Metrics, as Prometheus scrapes them.
    let m = scrape(&hk.netns);
    assert_eq!(
        sample(&m, "linkpilot_link_state{link=\"wan\",state=\"healthy\"}"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(sample(&m, "linkpilot_link_state{link=\"wan\",state=\"congested\"}"), Some(0.0));
    assert_eq!(sample(&m, "linkpilot_knob_dscp{link=\"wan\"}"), Some(26.0));
    assert_eq!(sample(&m, "linkpilot_knob_compression{link=\"wan\",mode=\"none\"}"), Some(1.0));
    assert!(sample(&m, "linkpilot_ticks_total").is_some_and(|t| t >= 1.0), "{m}");
    assert!(sample(&m, "linkpilot_process_resident_bytes").is_some_and(|r| r > 1e6), "{m}");
    assert!(m.contains("linkpilot_peer_bytes_per_second{interface=\"eth0\",peer=\"us\""), "{m}");
    // The dashboard's queries are run against a real Prometheus in prometheus.rs.

    // The status API: root only, JSON and a table.
    let st = status_json(&dir);
    assert_eq!(st["links"][0]["state"], "healthy", "{st}");
    assert_eq!(st["links"][0]["knobs"]["dscp"], 26);
    assert_eq!(st["interfaces"][0], "eth0");
    let table = status_table(&dir);
    assert!(table.contains("wan") && table.contains("healthy") && table.contains("us"), "{table}");
    let setpriv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"];
    let nobody = linkpilot_status(&setpriv, &dir, &[]);
    let err = String::from_utf8_lossy(&nobody.stderr);
    assert!(!nobody.status.success() && err.contains("root-only"), "{err}");

    // An invalid policy (DSCP out of range) on file change: logged with line and column,
    // nothing changes.
    let policy = dir.join("policy.toml");
    let bad = POLICY.replacen("dscp = 26", "dscp = 99", 1);
    // Written whole and renamed over, as editors do, so the daemon never reads half a file.
    std::fs::write(dir.join("policy.new"), &bad).expect("bad policy");
    std::fs::rename(dir.join("policy.new"), &policy).expect("rename");
    // The error names the state's knobs table.
    let line = bad.lines().position(|l| l == "[state.knobs]").expect("line") + 1;
    wait_for("the rejected reload", Duration::from_secs(5), || {
        d.log().contains("policy reload rejected")
    });
    let log = d.log();
    assert!(log.contains(&format!("policy.toml:{line}:")), "{log}");
    // Measurements may still move auto knobs; what the policy sets must not move.
    let after = board.read().expect("read");
    assert_eq!((after.links[0].dscp, name(&after.links[0].state)), (26, "healthy".into()));
    let decisions = std::fs::read_to_string(dir.join("decisions.jsonl")).unwrap_or_default();
    assert!(!decisions.contains("policy reloaded"), "{decisions}");
    let m = scrape(&hk.netns);
    assert_eq!(sample(&m, "linkpilot_policy_reloads_total{result=\"rejected\"}"), Some(1.0));
    assert_eq!(sample(&m, "linkpilot_policy_reloads_total{result=\"applied\"}"), Some(0.0));
    let st = status_json(&dir);
    assert!(st["last_reload_error"].as_str().is_some_and(|e| e.contains("dscp")), "{st}");

    // A valid one, written in place: the file watcher applies it (it compares content, so an
    // edit that keeps size and mtime counts too), the board follows, the decision says why.
    let reloaded =
        POLICY.replacen("dscp = 26", "dscp = 18", 1).replacen("tcp_ecn = 1", "tcp_ecn = 0", 1);
    std::fs::write(&policy, reloaded).expect("policy");
    wait_for("the reloaded DSCP on the board", Duration::from_secs(5), || {
        board.read().is_ok_and(|b| b.links[0].dscp == 18)
    });
    assert!(d.log().contains("changed: reloading"), "{}", d.log());
    assert_eq!(sysctl(&hk.netns, "net.ipv4.tcp_ecn"), "0", "the reloaded [host]");
    let decisions = std::fs::read_to_string(dir.join("decisions.jsonl")).unwrap_or_default();
    assert!(
        decisions
            .lines()
            .any(|l| l.contains("policy reloaded, in healthy") && l.contains("dscp 26 -> 18")),
        "{decisions}"
    );
    let m = scrape(&hk.netns);
    assert_eq!(sample(&m, "linkpilot_policy_reloads_total{result=\"applied\"}"), Some(1.0));
    assert_eq!(sample(&m, "linkpilot_knob_dscp{link=\"wan\"}"), Some(18.0));
    // SIGHUP reloads now, whatever the file: with it unchanged, the watcher has nothing to
    // apply, so a second applied reload is the signal's.
    nix::sys::signal::kill(Pid::from_raw(d.child.id() as i32), Signal::SIGHUP).expect("SIGHUP");
    wait_for("the SIGHUP reload counted", Duration::from_secs(5), || {
        sample(&scrape(&hk.netns), "linkpilot_policy_reloads_total{result=\"applied\"}")
            == Some(2.0)
    });
    assert!(d.log().contains("SIGHUP: reloading"), "{}", d.log());

    // A second daemon is refused while this one runs.
    let second = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", hk.netns))
        .arg(linkpilot_bin())
        .args(["run", "--policy", &policy.display().to_string()])
        .args(["--lock", &dir.join("lock").display().to_string(), "--metrics-addr", "off"])
        .args(["--status-socket", &dir.join("other.sock").display().to_string()])
        .output()
        .expect("second run");
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success() && err.contains("another linkpilot is running"), "{err}");

    nix::sys::signal::kill(Pid::from_raw(d.child.id() as i32), Signal::SIGTERM).expect("SIGTERM");
    assert!(d.child.wait().expect("exit").success(), "{}", d.log());
    assert!(!dir.join("status.sock").exists(), "the socket is removed");
    assert_eq!(std::fs::read_to_string(&tos).expect("tos").trim(), "0", "RoCE class restored");
    assert_eq!(sysctl(&hk.netns, "net.ipv4.tcp_ecn"), ecn_before, "tcp_ecn restored");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_restart_removes_the_clsact_filters_a_killed_run_left() {
    let lab = lab_with("dstale", "delay = \"5ms\"");
    let hk = lab.host(Site::Hk, 0).clone();
    let filters = |dir: &str| hk.exec(&["tc", "filter", "show", "dev", "eth0", dir]);
    // A filter that is not ours, which must survive.
    hk.exec(&["tc", "qdisc", "add", "dev", "eth0", "clsact"]).expect("clsact");
    hk.exec(&[
        "tc", "filter", "add", "dev", "eth0", "ingress", "protocol", "ip", "prio", "1", "u32",
        "match", "u32", "0", "0",
    ])
    .expect("u32 filter");
    let dir = linkpilot_tests::temp_dir("daemon-stale");
    let mut first =
        Daemon::start_with(&hk.netns, &dir, &POLICY, &["--netlink-tc", "--metrics-addr", "off"]);
    first.wait_up();
    let (ingress, egress) = (filters("ingress").expect("tc"), filters("egress").expect("tc"));
    assert!(
        ingress.contains("lp_tc_ingress") && egress.contains("lp_tc_egress"),
        "{ingress}\n{egress}"
    );
    first.child.kill().expect("SIGKILL");
    first.child.wait().expect("exit");
    thread::sleep(Duration::from_millis(300));
    // Netlink filters outlive their process (TCX links would not).
    assert!(filters("ingress").expect("tc").contains("lp_tc_ingress"));
    let mut second = Daemon::start_with(&hk.netns, &dir, &POLICY, &["--metrics-addr", "off"]);
    second.wait_up();
    let log = second.log();
    assert!(log.contains("removed a stale attachment of a killed run: eth0 ingress"), "{log}");
    assert!(log.contains("removed a stale attachment of a killed run: eth0 egress"), "{log}");
    let (ingress, egress) = (filters("ingress").expect("tc"), filters("egress").expect("tc"));
    assert!(!ingress.contains("lp_tc") && !egress.contains("lp_tc"), "{ingress}\n{egress}");
    assert!(ingress.contains("u32"), "another filter was removed: {ingress}");
    nix::sys::signal::kill(Pid::from_raw(second.child.id() as i32), Signal::SIGTERM).expect("TERM");
    assert!(second.child.wait().expect("exit").success(), "{}", second.log());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_default_policy_runs_unedited_on_the_default_route_device() {
    let lab = lab_with("ddef", "delay = \"5ms\"");
    let hk = lab.host(Site::Hk, 0).clone();
    let policy = concat!(env!("CARGO_MANIFEST_DIR"), "/../policies/default.toml");
    let dir = std::env::temp_dir().join(format!("lp-daemon-default-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let socket = dir.join("status.sock").display().to_string();
    let run = |netns: &str| {
        std::process::Command::new("nsenter")
            .arg(format!("--net=/run/netns/{netns}"))
            .arg(linkpilot_bin())
            .args(["run", "--policy", policy, "--dry-run", "--ticks", "20"])
            .args(["--metrics-addr", "off", "--status-socket", &socket])
            .output()
            .expect("linkpilot run")
    };
    let out = run(&hk.netns);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("@default-route is eth0") && log.contains("start in healthy"), "{log}");
    // A namespace without a default route: a clear error, nothing attached.
    let bare = linkpilot_tests::netns::Netns::new("noroute");
    let baseline = linkpilot_tests::oracle::links().len();
    let out = run(&bare.name);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("has no default route"), "{err}");
    assert_eq!(linkpilot_tests::oracle::links().len(), baseline);
    let _ = std::fs::remove_dir_all(&dir);
}
