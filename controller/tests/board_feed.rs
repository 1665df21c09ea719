//! `linkpilot board feed` through a pipe, read back with the daemon's own reader.

use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
    time::Duration,
};

use linkpilot::{
    board::{is_stale, name, BoardReader},
    kernel::probes::monotonic_ns,
};
use linkpilot_common::board::compression as code;

#[test]
fn a_fed_board_beats_then_goes_stale_at_end_of_input() {
    let dir = std::env::temp_dir().join(format!("lp-feed-cli-{}", std::process::id()));
    let path = dir.join("knobs");
    let mut child = Command::new(env!("CARGO_BIN_EXE_linkpilot"))
        .args(["board", "feed", "--heartbeat-ms", "20", "--board"])
        .arg(&path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    writeln!(
        stdin,
        r#"{{"links":[{{"name":"hk-us","state":"severe","state_index":3,"compression":"topk:0.01","chunk_bytes":4194304,"tcp_buffer_bytes":1073741824,"watchdog_s":1800,"nccl_ib_timeout":24,"nccl_ib_retry_cnt":5,"dscp":46,"roce_traffic_class":184,"decision_id":42}},{{"name":"eu","compression":"bf16","decision_id":41}}]}}"#
    )
    .unwrap();
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "published 42\n");

    let r = BoardReader::open(&path).unwrap();
    let b = r.read().unwrap();
    assert_eq!((b.header.pid, b.header.n_links, b.header.decision_id), (child.id(), 2, 42));
    assert_eq!(b.header.heartbeat_interval_ms, 20);
    let (l, e) = (b.links[0], b.links[1]);
    assert_eq!(
        (name(&l.name), name(&l.state), l.state_index),
        ("hk-us".into(), "severe".into(), 3)
    );
    assert_eq!((l.compression, l.topk_ratio), (code::TOPK, 0.01));
    assert_eq!((l.chunk_bytes, l.tcp_buffer_bytes, l.watchdog_s), (4 << 20, 1 << 30, 1800));
    assert_eq!(
        (l.nccl_ib_timeout, l.nccl_ib_retry_cnt, l.dscp, l.roce_traffic_class),
        (24, 5, 46, 184)
    );
    assert_eq!((name(&e.name), e.compression, e.decision_id), ("eu".into(), code::BF16, 41));

    // Quiet stdin: the heartbeat goes on.
    let first = b.header.heartbeat_ns;
    std::thread::sleep(Duration::from_millis(100));
    let b = r.read().unwrap();
    assert!(b.header.heartbeat_ns > first && !is_stale(&b, monotonic_ns()));

    drop(stdin);
    let status = child.wait().unwrap();
    let b = r.read().unwrap();
    std::thread::sleep(Duration::from_millis(60));
    let stale = is_stale(&r.read().unwrap(), monotonic_ns());
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "{status}");
    assert_eq!(b.header.decision_id, 42, "the board keeps the last decision");
    assert!(stale, "no beats after the end of input");
}

#[test]
fn a_bad_line_exits_1_naming_it() {
    let dir = std::env::temp_dir().join(format!("lp-feed-bad-{}", std::process::id()));
    let mut child = Command::new(env!("CARGO_BIN_EXE_linkpilot"))
        .args(["board", "feed", "--board"])
        .arg(dir.join("knobs"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"{\"links\":[]}\n{\"links\":[{\"name\":\"a\",\"compression\":\"int3\"}]}\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "published 0\n");
    assert!(err.contains("line 2: link \"a\": invalid compression \"int3\""), "{err}");
}
