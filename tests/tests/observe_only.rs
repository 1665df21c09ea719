//! The shipped default policy names no peers, so rolled out to every node it only observes: run
//! unedited (not a dry run) on a lab host under real TCP traffic, it decides and shows its
//! decisions but changes nothing: what the other side receives keeps DSCP 0 (tcpdump and
//! tshark), the socket-buffer sysctls read the same (`sysctl -n`), no board or env file
//! appears, and a reload that names peers is refused until a restart. The same policy with a
//! peer named acts (board, env file) but leaves the DSCP and the RoCE class, which it keeps.

use std::{path::Path, process::Stdio, thread, time::Duration};

use linkpilot_lab::lab::Host;
use linkpilot_tests::daemon::{iperf3_server, lab_with, status_json, sysctl, wait_for, Daemon};
use nix::{sys::signal::Signal, unistd::Pid};

const DEFAULT: &str = include_str!("../../policies/default.toml");
const SYSCTLS: [&str; 3] = ["net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem", "net.ipv4.tcp_ecn"];

/// The DSCP of each TCP data packet `us` received from `hk` while iperf3 ran for 2 s.
fn dscp_seen(hk: &Host, us: &Host, pcap: &Path) -> Vec<u64> {
    let filter = format!("src host {} and tcp", hk.ipv4);
    let dump = linkpilot_lab::selftest::start_capture(us, &filter, &pcap.display().to_string())
        .expect("tcpdump");
    let mut server = iperf3_server(us);
    let status = hk
        .command("iperf3")
        .args(["-c", &us.ipv4.to_string(), "-t", "2"])
        .stdout(Stdio::null())
        .status()
        .expect("iperf3 -c");
    assert!(status.success());
    server.wait().expect("iperf3 server");
    thread::sleep(Duration::from_millis(300));
    assert_eq!(linkpilot_lab::selftest::stop_capture(dump).expect("stop tcpdump"), 0, "drops");
    linkpilot_tests::oracle::data_dscp(&pcap.display().to_string())
}

/// Once the daemon `d` (files in `dir`) is up and has decided: HK's data to US is sent unmarked
/// (captured at `dir/<name>.pcap`); returns the daemon's status.
fn unmarked_once_decided(
    d: &mut Daemon,
    hk: &Host,
    us: &Host,
    dir: &Path,
    name: &str,
) -> serde_json::Value {
    d.wait_up();
    wait_for("a decision", Duration::from_secs(5), || {
        std::fs::read_to_string(dir.join("decisions.jsonl")).is_ok_and(|l| !l.is_empty())
    });
    let dscp = dscp_seen(hk, us, &dir.join(format!("{name}.pcap")));
    assert!(dscp.len() > 100 && dscp.iter().all(|&d| d == 0), "{dscp:?}");
    status_json(dir)
}

#[test]
fn the_default_policy_changes_nothing_until_it_names_peers() {
    let lab = lab_with("dobs", "delay = \"5ms\"\nrate = \"100Mbit/s\"");
    let (hk, us) = lab.hk_us();
    let before: Vec<String> = SYSCTLS.iter().map(|s| sysctl(&hk.netns, s)).collect();
    let dir = linkpilot_tests::temp_dir("observe");
    let mut d = Daemon::start(&hk.netns, &dir, DEFAULT);
    let st = unmarked_once_decided(&mut d, &hk, &us, &dir, "observed");
    assert_eq!(st["dry_run"], false);
    assert!(
        st["observe_only"].as_str().is_some_and(|s| s.contains("names no [[link.peer]]")),
        "{st}"
    );
    // It decides all the same (iperf3's queue takes this policy to a worse state here).
    assert!(st["links"][0]["decision_id"].as_u64().is_some_and(|id| id >= 1), "{st}");
    let after: Vec<String> = SYSCTLS.iter().map(|s| sysctl(&hk.netns, s)).collect();
    assert_eq!(after, before, "sysctls changed");
    assert!(!dir.join("knobs").exists() && !dir.join("nccl.env").exists(), "board or env file");
    assert!(d.log().contains("observing only"), "{}", d.log());

    // A reload that names a peer would start changing the host: refused until a restart.
    let with_peer = DEFAULT.replacen(
        "capacity = \"10Gbit/s\"\n",
        "capacity = \"10Gbit/s\"\n[[link.peer]]\nname = \"us\"\ncidrs = [\"198.18.2.0/24\"]\n",
        1,
    );
    assert_ne!(with_peer, DEFAULT);
    std::fs::write(dir.join("policy.toml"), &with_peer).expect("policy");
    nix::sys::signal::kill(Pid::from_raw(d.child.id() as i32), Signal::SIGHUP).expect("HUP");
    wait_for("the reload refused", Duration::from_secs(10), || {
        status_json(&dir)["last_reload_error"]
            .as_str()
            .is_some_and(|e| e.contains("restart it to act on them"))
    });
    assert_eq!(SYSCTLS.iter().map(|s| sysctl(&hk.netns, s)).collect::<Vec<_>>(), before);
    drop(d);

    // Restarted on it: it acts (board, env file), and the packets to the peer keep DSCP 0
    // and the env file leaves NCCL_IB_TC to the job: the default keeps both.
    let mut d = Daemon::start(&hk.netns, &dir, &with_peer);
    d.wait_up();
    let dscp = dscp_seen(&hk, &us, &dir.join("acting.pcap"));
    assert!(dscp.len() > 100 && dscp.iter().all(|&d| d == 0), "{dscp:?}");
    let env = std::fs::read_to_string(dir.join("nccl.env")).expect("env file");
    assert!(env.contains("NCCL_IB_TIMEOUT=") && !env.contains("NCCL_IB_TC"), "{env}");
    let st = status_json(&dir);
    assert!(st["observe_only"].is_null(), "{st}");
    assert!(st["links"][0]["knobs"]["dscp"].is_null(), "{st}");
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A site rolled out as the DaemonSets ship (`LINKPILOT_DRY_RUN=true` in the environment, no
/// flag) decides but changes nothing: DSCP 0 on the wire (tcpdump, tshark), the sysctls as they
/// were (`sysctl -n`), no board or env file, status and metrics saying so. The operator's
/// switch (`LINKPILOT_DRY_RUN=false`, the pod restarted) makes the same policy act: the site's
/// DSCP (18, a lossy class) on the wire, and, its socket buffer maxima "keep", still no sysctl
/// written.
#[test]
fn a_site_rolled_out_observing_acts_only_once_switched() {
    let lab = lab_with("dstage", "delay = \"5ms\"\nrate = \"100Mbit/s\"");
    let (hk, us) = lab.hk_us();
    // Socket buffer maxima kept: once it acts, it marks the site's DSCP but writes no sysctl.
    let peered = DEFAULT
        .replacen(
            "capacity = \"10Gbit/s\"\n",
            "capacity = \"10Gbit/s\"\n[[link.peer]]\nname = \"us\"\ncidrs = [\"198.18.2.0/24\"]\n",
            1,
        )
        .replace("[state.knobs]\n", "[state.knobs]\ntcp_buffers = \"keep\"\n")
        .replace("dscp = \"keep\"", "dscp = 18");
    assert!(!DEFAULT.contains("[host]"), "the default policy sets no host sysctl");
    let before: Vec<String> = SYSCTLS.iter().map(|s| sysctl(&hk.netns, s)).collect();
    let dir = linkpilot_tests::temp_dir("stage");
    let observing = ["env", "LINKPILOT_DRY_RUN=true"];
    let mut d = Daemon::start_under(&hk.netns, &observing, &dir, &peered, &[]);
    let st = unmarked_once_decided(&mut d, &hk, &us, &dir, "observing");
    assert_eq!(st["dry_run"], true, "{st}");
    assert!(st["links"][0]["decision_id"].as_u64().is_some_and(|id| id >= 1), "{st}");
    assert!(linkpilot_tests::daemon::scrape(&hk.netns).contains("linkpilot_dry_run 1"));
    assert_eq!(SYSCTLS.iter().map(|s| sysctl(&hk.netns, s)).collect::<Vec<_>>(), before);
    assert!(!dir.join("knobs").exists() && !dir.join("nccl.env").exists(), "board or env file");
    drop(d);
    // Switched: the same policy, the pod restarted with the variable false.
    let acting = ["env", "LINKPILOT_DRY_RUN=false"];
    let mut d = Daemon::start_under(&hk.netns, &acting, &dir, &peered, &[]);
    d.wait_up();
    let dscp = dscp_seen(&hk, &us, &dir.join("switched.pcap"));
    assert!(dscp.len() > 100 && dscp.iter().all(|&d| d == 18), "{dscp:?}");
    assert_eq!(status_json(&dir)["dry_run"], false);
    assert_eq!(SYSCTLS.iter().map(|s| sysctl(&hk.netns, s)).collect::<Vec<_>>(), before, "kept");
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}
