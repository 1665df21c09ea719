//! Tracepoints are system-wide and every lab uses the same addresses: a socket must count for the
//! namespace it lives in, not for whichever watched namespace has its address.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    sync::mpsc,
    thread,
    time::Duration,
};

use linkpilot_tests::{
    netns::Pair,
    oracle::nstat,
    watcher::{peer, Sample, Watcher},
};
use nix::sys::signal::Signal;

const A_ADDR: &str = "198.18.210.1";
const B_ADDR: &str = "198.18.210.2";
const BYTES: usize = 1 << 20;

/// `n` connections from `pair.a` to `pair.b`, each sending 1 MiB and closing.
fn connections(pair: &Pair, n: usize) {
    let (ready, bound) = mpsc::channel();
    let server = pair.b.spawn(move || {
        let listener = TcpListener::bind((B_ADDR, 5999)).expect("bind");
        ready.send(()).expect("ready");
        for _ in 0..n {
            let (mut s, _) = listener.accept().expect("accept");
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).expect("read");
            assert_eq!(buf.len(), BYTES);
        }
    });
    bound.recv_timeout(Duration::from_secs(5)).expect("server bound");
    pair.a
        .spawn(move || {
            for _ in 0..n {
                let mut s = TcpStream::connect((B_ADDR, 5999)).expect("connect");
                s.write_all(&vec![7u8; BYTES]).expect("write");
            }
        })
        .join()
        .expect("client");
    server.join().expect("server");
    thread::sleep(Duration::from_millis(300)); // the closing handshakes
}

/// `n` connections in `pair` while `watched.a`'s interface is watched (peer "far" is B): how
/// many nstat counted as opened in `pair`, and the watcher's last sample of the interface.
fn opened_while_watched(watched: &Pair, pair: &Pair, n: usize) -> (u64, Sample) {
    let peer_arg = format!("far={B_ADDR}/32");
    let watcher = Watcher::start_in(&watched.a.name, &[watched.a_if], &["--peer", &peer_arg]);
    let before = nstat(&pair.a, &["TcpActiveOpens"]);
    connections(pair, n);
    let opened = nstat(&pair.a, &["TcpActiveOpens"])[0] - before[0];
    let last = watcher.stop_with(Signal::SIGINT);
    (opened, last.into_iter().find(|s| s.iface == watched.a_if).expect("sample"))
}

#[test]
fn tracepoints_count_only_the_watched_namespace() {
    let watched = Pair::new(A_ADDR, B_ADDR);
    let other = Pair::new(A_ADDR, B_ADDR);

    // Three connections in the other pair: same addresses, another namespace.
    let (opened, s) = opened_while_watched(&watched, &other, 3);
    let far = peer(&s, "far");
    eprintln!("other namespace: nstat active opens {opened}; watched: {far:?}");
    assert_eq!(opened, 3, "nstat saw the other namespace's connections");
    assert_eq!(far.flows.active_opens + far.flows.closes, 0, "{:?}", far.flows);
    assert_eq!(far.rtt.samples, 0, "RTT samples of another namespace: {:?}", far.rtt);
    assert_eq!(far.retrans_segs, 0);
    assert_eq!(s.totals.rx_packets + s.totals.tx_packets, 0, "the TC programs saw no packet");

    // One connection in the watched pair counts (the check above would pass if nothing did).
    let (opened, s) = opened_while_watched(&watched, &watched, 1);
    let far = peer(&s, "far");
    eprintln!("watched namespace: nstat active opens {opened}; watched: {far:?}");
    assert_eq!((far.flows.active_opens, far.flows.closes), (opened, opened));
    assert!(far.rtt.samples > 0, "{:?}", far.rtt);
}
