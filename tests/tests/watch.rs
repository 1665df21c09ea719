//! `linkpilot watch` against real TCP traffic in two namespaces, judged by the kernel's own
//! counters (nstat) and by the byte count the test sent.
//!
//! These tests need root and run one at a time (`cargo xtask test` does both).

use std::{
    io::{Read, Write},
    net::{Shutdown, TcpListener, TcpStream},
    thread,
    time::{Duration, Instant},
};

use linkpilot_tests::{
    netns::Pair,
    oracle::{
        attached_programs, links_of, loaded_after_exit, nstat, ours_loaded, ours_loaded_since,
    },
    run,
    watcher::Watcher,
};
use nix::sys::signal::Signal;

const PORT: u16 = 5201;
/// Ethernet (14) + IPv4 without options (20) + TCP with the timestamp option (32): the headers of
/// every segment of an established Linux-to-Linux connection.
const SEGMENT_HEADERS: u64 = 66;
/// A SYN or SYN-ACK carries 8 option bytes more than that (MSS 4, SACK-permitted and timestamps
/// 12, window scale 4 = 20, against 12 for timestamps alone).
const SYN_EXTRA: u64 = 8;

/// Receives everything on one connection in `pair.b` and returns the byte count.
fn receiver(pair: &Pair) -> thread::JoinHandle<u64> {
    let addr = format!("{}:{PORT}", pair.b_addr);
    let listener = pair
        .b
        .spawn(move || TcpListener::bind(&addr).unwrap_or_else(|e| panic!("bind {addr}: {e}")))
        .join()
        .expect("bind thread");
    thread::spawn(move || {
        let (mut conn, _) = listener.accept().expect("accept");
        let mut buf = vec![0u8; 1 << 16];
        let mut total = 0u64;
        loop {
            match conn.read(&mut buf).expect("read") {
                0 => break total,
                n => total += n as u64,
            }
        }
    })
}

/// Sends `total` bytes from `pair.a` in `chunk`-byte writes spaced by `gap`, closes, and waits
/// until the peer has closed too.
fn send(pair: &Pair, total: usize, chunk: usize, gap: Duration) {
    let addr = format!("{}:{PORT}", pair.b_addr);
    pair.a
        .spawn(move || {
            let mut s = TcpStream::connect(&addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
            let data = vec![0x5au8; chunk];
            let mut left = total;
            while left > 0 {
                let n = left.min(chunk);
                s.write_all(&data[..n]).expect("write");
                left -= n;
                if !gap.is_zero() {
                    thread::sleep(gap);
                }
            }
            s.shutdown(Shutdown::Write).expect("shutdown");
            let mut rest = Vec::new();
            s.read_to_end(&mut rest).expect("read until the peer closes");
        })
        .join()
        .expect("sender thread");
}

/// Bytes counted beyond `expected`; panics unless they are whole 4-byte option words that at most
/// 1% of `packets` (at least 4) could carry as 36-byte SACK options.
fn options_beyond(counted: u64, expected: u64, packets: u64) -> u64 {
    assert!(counted >= expected, "counted {counted} bytes, fewer than the {expected} sent");
    let extra = counted - expected;
    assert_eq!(extra % 4, 0, "{extra} extra bytes are not whole TCP option words");
    assert!(extra <= 36 * (packets / 100).max(4), "{extra} extra bytes for {packets} packets");
    extra
}

#[test]
fn counters_match_tcp_traffic_of_known_size() {
    // The byte oracle needs a transfer without retransmissions. A veth drops only when the
    // receiving CPU's backlog overflows, which a loaded shared machine occasionally causes: such
    // an attempt proves nothing either way, so it is repeated (at most three times, each on a
    // fresh pair and watcher).
    for attempt in 1..=3 {
        let pair = Pair::new("198.18.1.1", "198.18.1.2");
        let watcher = Watcher::start(&pair.a, &[pair.a_if]);
        let counters = ["TcpOutSegs", "TcpInSegs", "TcpRetransSegs"];
        let before = nstat(&pair.a, &counters);

        let payload: u64 = 8 * 1024 * 1024 + 12_345;
        let rx = receiver(&pair);
        send(&pair, payload as usize, 256 * 1024, Duration::ZERO);
        assert_eq!(rx.join().expect("receiver"), payload);
        // Let the last ACK of the close reach the counters, then take one more sample.
        thread::sleep(Duration::from_millis(300));
        let after = nstat(&pair.a, &counters);
        let t = watcher.stop(pair.a_if);

        let (out_segs, in_segs, retrans) =
            (after[0] - before[0], after[1] - before[1], after[2] - before[2]);
        // Segments, counted per GSO/GRO segment, agree with the TCP stack's own counters
        // whether or not the kernel retransmitted: TcpOutSegs leaves retransmissions out (RFC
        // 1213's tcpOutSegs), the wire carries them too.
        assert_eq!(
            t.tx_packets,
            out_segs + retrans,
            "tx packets vs nstat TcpOutSegs + TcpRetransSegs: {t:?}"
        );
        assert_eq!(t.rx_packets, in_segs, "rx packets vs nstat TcpInSegs: {t:?}");
        if retrans > 0 {
            eprintln!("attempt {attempt}: the kernel retransmitted {retrans} segments on the veth");
            continue;
        }
        // Bytes: the payload plus the headers every segment carries, plus the SYN's extra
        // options, plus option words that only some segments carry (a SACK or D-SACK block).
        let tx_extra = options_beyond(
            t.tx_bytes,
            payload + t.tx_packets * SEGMENT_HEADERS + SYN_EXTRA,
            t.tx_packets,
        );
        let rx_extra =
            options_beyond(t.rx_bytes, t.rx_packets * SEGMENT_HEADERS + SYN_EXTRA, t.rx_packets);
        eprintln!("option bytes beyond timestamps: tx {tx_extra}, rx {rx_extra}; {t:?}");
        assert!(t.tx_packets as f64 >= payload as f64 / 1448.0, "{t:?}");
        return;
    }
    panic!("every attempt retransmitted: the byte oracle needs one lossless transfer");
}

#[test]
fn retransmissions_match_tcp_retrans_segs() {
    let pair = Pair::new("198.18.2.1", "198.18.2.2");
    // Drop 20% of the data segments at the receiver for a moment, in the receiver's namespace.
    pair.b.exec(&["nft", "add", "table", "inet", "lpt"]);
    pair.b.exec(&[
        "nft",
        "add",
        "chain",
        "inet",
        "lpt",
        "input",
        "{ type filter hook input priority 0 ; policy accept ; }",
    ]);
    let watcher = Watcher::start(&pair.a, &[pair.a_if]);
    let counters = ["TcpRetransSegs", "TcpExtTCPRetransFail"];
    let before = nstat(&pair.a, &counters);

    let payload = 24 * 1024 * 1024;
    let rx = receiver(&pair);
    let b = pair.b.name.clone();
    let dropper = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        let rule = format!("ip daddr 198.18.2.2 tcp dport {PORT} numgen random mod 100 < 20 drop");
        let add = ["ip", "netns", "exec", &b, "nft", "add", "rule", "inet", "lpt", "input"];
        let out = run(&[&add[..], &rule.split(' ').collect::<Vec<_>>()[..]].concat());
        assert!(out.status.success(), "nft add rule: {out:?}");
        thread::sleep(Duration::from_millis(1500));
        let out =
            run(&["ip", "netns", "exec", &b, "nft", "flush", "chain", "inet", "lpt", "input"]);
        assert!(out.status.success(), "nft flush: {out:?}");
    });
    // About 3 s of paced sending, so the loss window falls inside the transfer.
    let start = Instant::now();
    send(&pair, payload, 128 * 1024, Duration::from_millis(15));
    dropper.join().expect("dropper");
    assert_eq!(rx.join().expect("receiver"), payload as u64);
    assert!(start.elapsed() > Duration::from_secs(2), "transfer ended before the loss window");
    thread::sleep(Duration::from_millis(300));
    let after = nstat(&pair.a, &counters);
    // The kernel's own account of runs it skipped (bpftool shows `recursion_misses` when there
    // were any): what a shortfall below would need to be told from a counting error.
    let programs = run(&["bpftool", "prog", "show", "name", "lp_tcp_retrans"]);
    let programs = String::from_utf8_lossy(&programs.stdout).into_owned();
    let t = watcher.stop(pair.a_if);

    let (retrans_segs, retrans_fail) = (after[0] - before[0], after[1] - before[1]);
    assert!(retrans_segs > 0, "the loss window caused no retransmission; the test proves nothing");
    // TcpRetransSegs counts every attempted segment, TCPRetransFail those the stack could not send.
    assert_eq!(
        t.retrans_segs,
        retrans_segs - retrans_fail,
        "retransmitted segments vs nstat (TcpRetransSegs {retrans_segs}, TCPRetransFail {retrans_fail}): {t:?}\n{programs}"
    );
    eprintln!(
        "retransmitted segments: {} (nstat {retrans_segs}, failed {retrans_fail})",
        t.retrans_segs
    );
}

#[test]
fn detaches_everything_on_sigterm() {
    let pair = Pair::new("198.18.3.1", "198.18.3.2");
    let before = ours_loaded();
    let watcher = Watcher::start(&pair.a, &[pair.a_if]);
    let loaded = ours_loaded_since(&before);
    let during = links_of(&loaded);
    for (ty, prog) in attached_programs() {
        assert!(
            during.iter().any(|(t, p)| t == ty && p == prog),
            "no {ty} link for {prog} while watching: {during:?}"
        );
    }

    watcher.stop_with(Signal::SIGTERM);
    let after = links_of(&loaded);
    assert!(after.is_empty(), "links left after exit: {after:?}");
    // The links go at exit; their programs a little later (see `loaded_after_exit`).
    let left = loaded_after_exit(|p| loaded.contains(p));
    assert!(left.is_empty(), "still loaded 10 s after exit: {left:?}");
}

#[test]
fn watches_two_interfaces_independently() {
    let p1 = Pair::new("198.18.4.1", "198.18.4.2");
    // A second interface in the same namespace as p1.a, pinging a peer in its own namespace.
    let peer = linkpilot_tests::netns::Netns::new("c");
    linkpilot_tests::sh(&[
        "ip", "-n", &p1.a.name, "link", "add", "lpc0", "type", "veth", "peer", "name", "lpd0",
        "netns", &peer.name,
    ]);
    p1.a.exec(&["ip", "addr", "add", "198.18.5.1/24", "dev", "lpc0"]);
    p1.a.exec(&["ip", "link", "set", "lpc0", "up"]);
    peer.exec(&["ip", "addr", "add", "198.18.5.2/24", "dev", "lpd0"]);
    peer.exec(&["ip", "link", "set", "lpd0", "up"]);

    let watcher = Watcher::start(&p1.a, &[p1.a_if, "lpc0"]);
    p1.a.exec(&["ping", "-c", "5", "-i", "0.05", "-s", "1000", "198.18.5.2"]);
    let last = watcher.stop_with(Signal::SIGINT);
    let get = |i: &str| last.iter().find(|s| s.iface == i).expect("sample").totals;
    let (quiet, busy) = (get(p1.a_if), get("lpc0"));
    assert_eq!(
        (quiet.rx_packets, quiet.tx_packets),
        (0, 0),
        "no traffic crossed {}: {quiet:?}",
        p1.a_if
    );
    // 5 echo requests out and 5 replies in, 1000 bytes of data + 8 ICMP + 20 IP + 14 Ethernet,
    // plus one ARP exchange (42-byte frames) on this interface, which has no static neighbour.
    assert_eq!(busy.tx_packets, 6, "{busy:?}");
    assert_eq!(busy.rx_packets, 6, "{busy:?}");
    assert_eq!(busy.tx_bytes, 5 * 1042 + 42, "{busy:?}");
    assert_eq!(busy.rx_bytes, 5 * 1042 + 42, "{busy:?}");
}

/// tracefs entries in this process's mount table.
fn tracefs_mounts() -> usize {
    let table = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    table.lines().filter(|l| l.contains(" - tracefs ")).count()
}

#[test]
fn ip_netns_exec_watch_mounts_its_own_tracefs_and_counts() {
    let pair = Pair::new("198.18.46.1", "198.18.46.2");
    let mounts = tracefs_mounts();
    let receiving = receiver(&pair);
    // `ip netns exec` gives the command a fresh /sys without tracefs.
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", &pair.a.name])
        .arg(linkpilot_tests::linkpilot_bin())
        .args(["watch", "--iface", pair.a_if, "--json", "--count", "3"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("ip netns exec linkpilot watch");
    let (lines, log) = linkpilot_tests::pipe_output(&mut child);
    let first = lines.recv_timeout(Duration::from_secs(20));
    if first.is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("no sample: {}", log.join().unwrap_or_default());
    }
    send(&pair, 200_000, 20_000, Duration::ZERO);
    assert_eq!(receiving.join().expect("receiver"), 200_000);
    let status = child.wait().expect("watch");
    let log = log.join().unwrap_or_default();
    assert!(status.success(), "{status}: {log}");
    assert!(log.contains("mounted it at /sys/kernel/tracing for this process"), "{log}");
    let samples: Vec<linkpilot_tests::watcher::Sample> = lines
        .try_iter()
        .map(|l| serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let last = samples.iter().find(|s| s.last).expect("the last line");
    assert!(last.totals.tx_packets >= 5, "the data segments were counted: {last:?}");
    assert_eq!(tracefs_mounts(), mounts, "the mount stayed in linkpilot's own namespace");
}
