//! `linkpilot run` keeps going through what it can survive, judged from outside: bpftool breaks
//! and mends its maps, curl scrapes its metrics, the status API and its exit status say the rest.

use linkpilot_tests::policy::PolicyToml;
use std::{
    io::{ErrorKind, Read},
    net::TcpStream,
    path::Path,
    time::{Duration, Instant},
};

use linkpilot_tests::{
    daemon::{sample, scrape, status_json, wait_for, Daemon},
    netns::Pair,
    sh,
};
use nix::sys::signal::Signal;

/// One link on the pair's `a` side with the other end as its peer, ticking every 100 ms.
fn policy(iface: &str, peer: &str) -> String {
    PolicyToml::new()
        .link("wan", iface, "1Gbit/s", Some(("b", &format!("{peer}/32"))))
        .healthy()
        .build()
}

/// The id of the map named `name` that process `pid` holds, found through its fds' fdinfo
/// (other daemons may run with maps of the same name).
fn map_id_of(pid: u32, name: &str) -> u64 {
    for fd in std::fs::read_dir(format!("/proc/{pid}/fdinfo")).expect("fdinfo") {
        let info = std::fs::read_to_string(fd.expect("fd").path()).unwrap_or_default();
        let Some(id) = info.lines().find_map(|l| l.strip_prefix("map_id:")) else { continue };
        let id = id.trim();
        let show: serde_json::Value =
            serde_json::from_str(&sh(&["bpftool", "map", "show", "id", id, "--json"]))
                .expect("bpftool JSON");
        if show["name"] == name {
            return id.parse().expect("map id");
        }
    }
    panic!("process {pid} holds no map named {name}");
}

/// Hex bytes of little-endian u32s, as bpftool takes keys.
fn key(words: &[u32]) -> Vec<String> {
    words.iter().flat_map(|w| w.to_le_bytes()).map(|b| format!("{b:02x}")).collect()
}

fn ifindex(ns: &str, iface: &str) -> u32 {
    let out = sh(&["ip", "-n", ns, "-o", "link", "show", iface]);
    out.split(':').next().expect("index").trim().parse().expect("ifindex")
}

fn bpftool(args: &[&str], key: &[String], value: Option<&[String]>) {
    let mut full: Vec<&str> = [&["bpftool", "map"], args, &["key", "hex"]].concat();
    full.extend(key.iter().map(String::as_str));
    if let Some(value) = value {
        full.push("value");
        full.push("hex");
        full.extend(value.iter().map(String::as_str));
    }
    sh(&full);
}

/// The value at `key` of map `id`, as hex bytes.
fn lookup(id: &str, key: &[String]) -> Vec<String> {
    let mut args = vec!["bpftool", "map", "lookup", "id", id, "key", "hex"];
    args.extend(key.iter().map(String::as_str));
    args.push("--json");
    let v: serde_json::Value = serde_json::from_str(&sh(&args)).expect("bpftool JSON");
    let bytes = v["value"].as_array().expect("value bytes");
    bytes.iter().map(|b| b.as_str().expect("hex").trim_start_matches("0x").to_owned()).collect()
}

#[test]
fn a_failed_sensing_read_skips_a_tick_and_only_a_lasting_failure_stops_the_daemon() {
    let pair = Pair::new("198.18.40.1", "198.18.40.2");
    let dir = linkpilot_tests::temp_dir("survives-sensing");
    let mut d = Daemon::start_with(
        &pair.a.name,
        &dir,
        &policy(pair.a_if, pair.b_addr),
        &["--sensing-give-up-s", "3"],
    );
    d.wait_up();
    // Break what the daemon reads every tick: the configuration of lpa0 that names its counters'
    // slot, deleted under it.
    let pid = d.child.id();
    let id = map_id_of(pid, "LP_IFACE_CONFIG").to_string();
    let k = key(&[ifindex(&pair.a.name, pair.a_if)]);
    let saved = lookup(&id, &k);
    bpftool(&["delete", "id", &id], &k, None);
    wait_for("failed ticks in the status", Duration::from_secs(5), || {
        status_json(&dir)["sensing_failing_ticks"].as_u64() >= Some(3)
    });
    assert!(d.child.try_wait().expect("wait").is_none(), "the daemon stopped: {}", d.log());
    // Mended: the daemon carries on by itself, and says what happened.
    bpftool(&["update", "id", &id], &k, Some(&saved));
    let ticks = status_json(&dir)["ticks"].as_u64().unwrap();
    wait_for("ticks again", Duration::from_secs(5), || {
        let st = status_json(&dir);
        st["sensing_failing_ticks"] == 0 && st["ticks"].as_u64() > Some(ticks + 3)
    });
    let st = status_json(&dir);
    let errors = st["sensing_errors"].as_u64().unwrap();
    assert!(errors >= 3, "{st}");
    let last = st["last_sensing_error"].as_str().unwrap_or_default();
    assert!(last.contains("LP_IFACE_CONFIG"), "the error names the map: {st}");
    let m = scrape(&pair.a.name);
    assert_eq!(sample(&m, "linkpilot_sensing_errors_total"), Some(errors as f64), "{m}");
    assert!(d.log().contains("sensing recovered after"), "{}", d.log());

    // Broken for good: the daemon stops after the limit, with the reason, and cleans up.
    bpftool(&["delete", "id", &id], &k, None);
    let broken = Instant::now();
    let status = loop {
        if let Some(s) = d.child.try_wait().expect("wait") {
            break s;
        }
        assert!(broken.elapsed() < Duration::from_secs(10), "still running: {}", d.log());
        std::thread::sleep(Duration::from_millis(50));
    };
    let lasted = broken.elapsed();
    let log = d.log();
    assert!(!status.success(), "{log}");
    assert!(lasted >= Duration::from_secs(3), "gave up after {lasted:?}: {log}");
    assert!(log.contains("giving up") && log.contains("LP_IFACE_CONFIG"), "{log}");
    assert!(!Path::new(&dir.join("status.sock")).exists(), "cleaned up: {log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_reload_that_renames_a_link_state_and_peer_leaves_no_old_series() {
    let pair = Pair::new("198.18.41.1", "198.18.41.2");
    let dir = linkpilot_tests::temp_dir("survives-series");
    let before = policy(pair.a_if, pair.b_addr);
    let mut d = Daemon::start(&pair.a.name, &dir, &before);
    d.wait_up();
    let m = scrape(&pair.a.name);
    assert_eq!(sample(&m, "linkpilot_link_state{link=\"wan\",state=\"healthy\"}"), Some(1.0));
    assert!(m.contains("peer=\"b\""), "{m}");
    let renamed = before
        .replace("name = \"wan\"", "name = \"lan\"")
        .replace("name = \"healthy\"", "name = \"calm\"")
        .replace("name = \"b\"", "name = \"c\"");
    std::fs::write(dir.join("policy.new"), renamed).expect("policy");
    std::fs::rename(dir.join("policy.new"), dir.join("policy.toml")).expect("rename");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(d.child.id() as i32), Signal::SIGHUP)
        .expect("SIGHUP");
    wait_for("the renamed link's series", Duration::from_secs(5), || {
        sample(&scrape(&pair.a.name), "linkpilot_link_state{link=\"lan\",state=\"calm\"}")
            == Some(1.0)
    });
    let m = scrape(&pair.a.name);
    let samples: Vec<&str> = m.lines().filter(|l| !l.starts_with('#')).collect();
    for old in ["state=\"healthy\"", "link=\"wan\"", "peer=\"b\""] {
        let left: Vec<_> = samples.iter().filter(|l| l.contains(old)).collect();
        assert!(left.is_empty(), "series of the old policy: {left:#?}");
    }
    let on: Vec<_> = samples
        .iter()
        .filter(|l| l.starts_with("linkpilot_link_state{") && l.ends_with(" 1"))
        .collect();
    assert_eq!(on.len(), 1, "one state reads 1: {on:?}");
    assert!(m.contains("linkpilot_peer_bytes_per_second{interface=\"lpa0\",peer=\"c\""), "{m}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Lines of the recorded trace: one per tick that read everything.
fn traced(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("trace.jsonl")).unwrap_or_default().lines().count()
}

/// Opens `n` connections to the metrics port from inside `ns` that never send a request.
fn idle_connections(pair: &Pair, n: usize) -> Vec<TcpStream> {
    pair.a
        .spawn(move || {
            (0..n)
                .map(|_| TcpStream::connect("127.0.0.1:9464").expect("connect to the metrics port"))
                .collect::<Vec<_>>()
        })
        .join()
        .expect("connections")
}

/// Whether the server has closed `s` (EOF or reset), waiting at most `wait` for it to.
fn closed(s: &mut TcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(wait)).expect("timeout");
    match s.read(&mut [0u8; 64]) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
    }
}

#[test]
fn clients_that_never_ask_neither_hold_the_metrics_port_nor_delay_the_tick() {
    let pair = Pair::new("198.18.42.1", "198.18.42.2");
    let dir = linkpilot_tests::temp_dir("survives-scrapers");
    let mut d = Daemon::start(&pair.a.name, &dir, &policy(pair.a_if, pair.b_addr));
    d.wait_up();
    // 64 connections that say nothing: the 16 newest stay (the server's cap), the rest are
    // closed at once.
    let mut idle = idle_connections(&pair, 64);
    let opened = Instant::now();
    let ticks = traced(&dir);
    let held = idle.iter_mut().map(|s| closed(s, Duration::from_millis(20))).filter(|c| !c).count();
    assert_eq!(held, 16, "connections the server keeps open");
    // A scrape still answers, and the loop ticks on (100 ms ticks: 2 s is 20).
    let m = scrape(&pair.a.name);
    assert!(sample(&m, "linkpilot_ticks_total").is_some(), "{m}");
    std::thread::sleep(Duration::from_secs(2));
    let during = traced(&dir) - ticks;
    assert!(during >= 15, "{during} ticks in 2 s beside 16 idle connections");
    // Within 5 s of connecting (the limit per connection), the server has closed them all.
    for s in &mut idle {
        let left = Duration::from_secs(5).saturating_sub(opened.elapsed());
        assert!(closed(s, left + Duration::from_millis(500)), "an idle connection outlived 5 s");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// User + system CPU time of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
}

#[test]
fn out_of_file_descriptors_the_daemon_backs_off_instead_of_spinning() {
    let pair = Pair::new("198.18.43.1", "198.18.43.2");
    let dir = linkpilot_tests::temp_dir("survives-emfile");
    let mut d = Daemon::start(&pair.a.name, &dir, &policy(pair.a_if, pair.b_addr));
    d.wait_up();
    let pid = d.child.id();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).expect("fds").count();
    // Two descriptors to spare, then eight clients: accept fails with EMFILE while the rest
    // wait in the backlog.
    // The soft limit only, which the daemon's owner may raise again.
    let limit = format!("--nofile={}:", fds + 2);
    sh(&["prlimit", "--pid", &pid.to_string(), &limit]);
    let idle = idle_connections(&pair, 8);
    std::thread::sleep(Duration::from_millis(500));
    let accept_lines = |log: &str| log.lines().filter(|l| l.contains("accept:")).count();
    let (lines, cpu, ticks) = (accept_lines(&d.log()), cpu_ticks(pid), traced(&dir));
    std::thread::sleep(Duration::from_secs(3));
    let log = d.log();
    let (lines, cpu, ticks) =
        (accept_lines(&log) - lines, cpu_ticks(pid) - cpu, traced(&dir) - ticks);
    eprintln!("in 3 s out of descriptors: {lines} accept lines, {cpu} CPU ticks, {ticks} ticks");
    assert!(lines <= 1, "one line per 10 s, not a flood: {lines} lines");
    assert!(log.contains("Too many open files"), "{log}");
    assert!(ticks >= 20, "the loop ticks on: {ticks} ticks in 3 s");
    // Descriptors back: a scrape answers within the backoff's 1 s.
    drop(idle);
    sh(&["prlimit", "--pid", &pid.to_string(), "--nofile=1024:"]);
    wait_for("a scrape", Duration::from_secs(2), || {
        linkpilot_tests::run(&[
            "nsenter",
            &format!("--net=/run/netns/{}", pair.a.name),
            "curl",
            "-sf",
            "http://127.0.0.1:9464/metrics",
        ])
        .status
        .success()
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// The decision log is a FIFO whose reader has not come yet (a log shipper still starting):
/// opening it holds the daemon's start for as long as that takes, and the status API answers
/// all the while, saying it is starting, then its ticks once the reader is there.
#[test]
fn the_status_api_answers_while_the_start_waits_on_its_decision_log() {
    let pair = Pair::new("198.18.47.1", "198.18.47.2");
    let dir = linkpilot_tests::temp_dir("survives-fifo");
    let fifo = dir.join("decisions.jsonl");
    sh(&["mkfifo", &fifo.display().to_string()]);
    let mut d = Daemon::start(&pair.a.name, &dir, &policy(pair.a_if, pair.b_addr));
    wait_for("the status socket", Duration::from_secs(20), || {
        if let Some(s) = d.child.try_wait().expect("wait") {
            panic!("linkpilot run exited ({s}): {}", d.log());
        }
        dir.join("status.sock").exists()
    });
    // Nothing reads the FIFO: the start cannot go on, whatever time passes.
    for _ in 0..3 {
        let s = status_json(&dir);
        assert_eq!(s["starting"], true, "{s}");
        assert_eq!(s["ticks"], 0, "{s}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let socket = dir.join("status.sock").display().to_string();
    let text = sh(&[
        &linkpilot_tests::linkpilot_bin().display().to_string(),
        "status",
        "--socket",
        &socket,
    ]);
    assert!(text.contains("starting"), "{text}");
    // The reader comes (and drains the log until the daemon exits).
    let reader = std::thread::spawn(move || {
        let mut lines = String::new();
        std::fs::File::open(&fifo).expect("open the FIFO").read_to_string(&mut lines).ok();
        lines
    });
    d.wait_up();
    drop(d);
    reader.join().expect("the reader");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_file_at_the_status_socket_path_is_refused_not_removed() {
    let pair = Pair::new("198.18.44.1", "198.18.44.2");
    let dir = linkpilot_tests::temp_dir("survives-socket");
    std::fs::write(dir.join("status.sock"), "someone's data").expect("file");
    let mut d = Daemon::start(&pair.a.name, &dir, &policy(pair.a_if, pair.b_addr));
    let mut status = None;
    wait_for("linkpilot run to refuse", Duration::from_secs(20), || {
        status = d.child.try_wait().expect("wait");
        status.is_some()
    });
    let (status, log) = (status.expect("exited"), d.log());
    assert!(!status.success(), "{log}");
    assert!(log.contains("status.sock: exists and is not a socket (a file)"), "{log}");
    assert_eq!(std::fs::read_to_string(dir.join("status.sock")).expect("kept"), "someone's data");
    let _ = std::fs::remove_dir_all(&dir);
}

/// [`policy`] with 10 more peers of 25 prefixes each, in 10.`net`.0.0/16: 250 prefixes with
/// the pair's peer, of the programs' 256.
fn near_full(iface: &str, peer: &str, net: u8) -> String {
    let mut p = policy(iface, peer);
    let at = p.find("[[state]]").expect("states");
    let peers: String = (0..10)
        .map(|i| {
            let cidrs: Vec<String> =
                (0..25).map(|j| format!("\"10.{net}.{}.0/24\"", i * 25 + j)).collect();
            format!("[[link.peer]]\nname = \"n{i}\"\ncidrs = [{}]\n", cidrs.join(", "))
        })
        .collect();
    p.insert_str(at, &peers);
    p
}

#[test]
fn a_reload_swaps_a_near_full_peer_set_for_another() {
    let pair = Pair::new("198.18.45.1", "198.18.45.2");
    let dir = linkpilot_tests::temp_dir("survives-peers");
    let mut d = Daemon::start(&pair.a.name, &dir, &near_full(pair.a_if, pair.b_addr, 1));
    d.wait_up();
    std::fs::write(dir.join("policy.new"), near_full(pair.a_if, pair.b_addr, 2)).expect("policy");
    std::fs::rename(dir.join("policy.new"), dir.join("policy.toml")).expect("rename");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(d.child.id() as i32), Signal::SIGHUP)
        .expect("SIGHUP");
    wait_for("the reload", Duration::from_secs(5), || {
        let st = status_json(&dir);
        st["reloads_applied"].as_u64() > Some(0) || st["reloads_rejected"].as_u64() > Some(0)
    });
    let st = status_json(&dir);
    assert_eq!(st["reloads_rejected"], 0, "{}", st["last_reload_error"]);
    // The programs' trie, as bpftool dumps it: the new set and nothing of the old.
    let id = map_id_of(d.child.id(), "LP_PEERS").to_string();
    let dump: serde_json::Value =
        serde_json::from_str(&sh(&["bpftool", "map", "dump", "id", &id, "--json"])).unwrap();
    let keys: Vec<Vec<u64>> = dump
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| {
            let key = e["key"].as_array().expect("key bytes");
            key.iter()
                .map(|b| {
                    u64::from_str_radix(b.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
                })
                .collect()
        })
        .collect();
    assert_eq!(keys.len(), 251, "250 prefixes and the pair's peer");
    // Key: prefix length (u32), then the IPv4-mapped address, whose IPv4 part is bytes 16..20.
    let ten: Vec<u64> = keys.iter().filter(|k| k[16] == 10).map(|k| k[17]).collect();
    let new = ten.iter().filter(|&&o| o == 2).count();
    assert_eq!((ten.len(), new), (250, 250), "prefixes in 10/8, and of them in 10.2/16");
    let _ = std::fs::remove_dir_all(&dir);
}
