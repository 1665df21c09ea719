//! The plugin as NCCL meets it: a C harness (tests/harness.c, built here with the system's `cc`)
//! dlopens the .so, looks the symbols up v6 -> v5 -> v4, checks the layout from C and drives
//! init / getCollInfo / getChunkSize / finalize with NCCL-like cost tables, while this test
//! writes healthy, congested and stale boards with the daemon's own writer. And the
//! libnccl.so.2 of the `nvidia-nccl-cu13` wheel must name the symbols the plugin exports.

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::{mpsc, OnceLock},
    time::{Duration, Instant},
};

use linkpilot::{
    board::tuner_stats,
    board::{board_link, set_nccl, BoardWriter},
    control::{policy::NcclRule, Compression, Knobs},
    kernel::probes::monotonic_ns,
};
use linkpilot_common::board::{nccl, BoardLink};

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
/// NCCL_BUFFSIZE the harness runs with.
const BUFFSIZE: u64 = 8 << 20;
/// A multi-node AllReduce's costs as NCCL hands them over: Tree and Ring with every protocol
/// (Ring/LL cheapest), the other algorithms not allowed (-1).
const TABLE: [f32; 21] = [
    30., 25., 20., 5., 15., 10., -1., -1., -1., -1., -1., -1., -1., -1., -1., -1., -1., -1., -1.,
    -1., -1.,
];
const ALLREDUCE: i32 = 4;

/// The .so cargo built with this test: target/debug/deps/ (`cargo test` builds the cdylib
/// there; only `cargo build` copies it up to target/debug/, which may be older).
fn plugin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps, deps.parent().unwrap()]
        .iter()
        .map(|d| d.join("libnccl_tuner_linkpilot.so"))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("no libnccl_tuner_linkpilot.so next to {}", exe.display()))
}

/// The harness, compiled once per test run.
fn harness_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nccl-tuner-harness");
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/harness.c");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let status = Command::new(&cc)
            .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread", src, "-o"])
            .arg(&out)
            .arg("-ldl")
            .status()
            .unwrap_or_else(|e| {
                panic!("running the C compiler {cc:?}: {e} (install gcc or set CC)")
            });
        assert!(status.success(), "{cc} could not build {src}");
        out
    })
}

struct Harness {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    /// Every log line so far ("log LEVEL FLAGS message").
    logs: Vec<String>,
}

impl Harness {
    fn start(dir: &Path) -> Self {
        std::fs::create_dir_all(dir.join("stats")).unwrap();
        let mut child = Command::new(harness_bin())
            .arg(plugin())
            .env("LINKPILOT_BOARD", dir.join("knobs"))
            .env("LINKPILOT_TUNER_STATS", dir.join("stats"))
            .env("NCCL_BUFFSIZE", BUFFSIZE.to_string())
            .env_remove("LINKPILOT_LINK")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        // Drained all the time: the plugin logs from the worker threads too.
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if tx.send(line.unwrap()).is_err() {
                    return;
                }
            }
        });
        let mut h = Self { child, stdin, lines, logs: Vec::new() };
        assert_eq!(h.answer(), ["loaded v6"], "NCCL would take the newest: v6");
        h
    }

    fn answer(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|e| panic!("the harness stopped answering ({e}); so far {out:?}"));
            if line == "." {
                return out;
            }
            if line.starts_with("log ") {
                self.logs.push(line);
            } else {
                out.push(line);
            }
        }
    }

    fn ask(&mut self, cmd: &str) -> Vec<String> {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.answer()
    }

    /// The one answer line of `cmd`, split in words.
    fn one(&mut self, cmd: &str) -> Vec<String> {
        let a = self.ask(cmd);
        assert_eq!(a.len(), 1, "{cmd}: {a:?}");
        a[0].split_whitespace().map(str::to_owned).collect()
    }

    /// Creates a communicator; returns (slot, NET latencies after init).
    fn init(&mut self, version: u32) -> (usize, Vec<f64>) {
        let a = self.one(&format!("init {version} 4660 16 2"));
        assert_eq!((a[0].as_str(), a[2].as_str(), a[3].as_str()), ("ctx", "rc", "0"), "{a:?}");
        assert_eq!(a[5], "0", "init left no context: {a:?}");
        (a[1].parse().unwrap(), a[7..].iter().map(|v| v.parse().unwrap()).collect())
    }

    /// getCollInfo: (rc, channels out, table out).
    fn coll(
        &mut self,
        slot: usize,
        version: u32,
        coll: i32,
        bytes: u64,
        table: &[f32; 21],
    ) -> (i32, i32, Vec<f32>) {
        let t: Vec<String> = table.iter().map(|v| v.to_string()).collect();
        let a = self.one(&format!("coll {slot} {version} {coll} {bytes} 0 {}", t.join(" ")));
        let table = a[5..].iter().map(|v| v.parse().unwrap()).collect();
        (a[1].parse().unwrap(), a[3].parse().unwrap(), table)
    }

    /// getChunkSize: (rc, chunk out).
    fn chunk(
        &mut self,
        slot: usize,
        coll: i32,
        bytes: u64,
        algo: u8,
        proto: u8,
        incoming: u64,
    ) -> (i32, u64) {
        let a = self.one(&format!("chunk {slot} {coll} {bytes} {algo} {proto} 8 {incoming}"));
        (a[1].parse().unwrap(), a[3].parse().unwrap())
    }

    fn logged(&self, words: &str) -> usize {
        self.logs.iter().filter(|l| l.contains(words)).count()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lp-nccl-tuner-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A link slot as the daemon publishes it: `rule` and 1 MiB min_bytes, RTT 180 ms.
fn slot(state: &str, index: u32, id: u64, rule: NcclRule, chunk: u64) -> BoardLink {
    let k = Knobs {
        compression: Compression::None,
        chunk_bytes: chunk,
        nccl_ib_timeout: 22,
        nccl_ib_retry_cnt: 7,
        watchdog_s: 600,
        dscp: 26,
        roce_traffic_class: 106,
        tcp_buffer_bytes: 128 << 20,
    };
    let mut l = board_link("hk-us", state, index, &k, id);
    set_nccl(&mut l, rule, 1 << 20, Some(180.0));
    l
}

fn healthy(id: u64) -> BoardLink {
    slot("healthy", 0, id, NcclRule::default(), 8 << 20)
}

fn congested(id: u64) -> BoardLink {
    let rule =
        NcclRule { algo: Some(nccl::ALGO_TREE), proto: Some(nccl::PROTO_SIMPLE), max_channels: 4 };
    slot("congested", 1, id, rule, 2 << 20)
}

fn severe(id: u64) -> BoardLink {
    let rule =
        NcclRule { algo: Some(nccl::ALGO_RING), proto: Some(nccl::PROTO_LL), max_channels: 2 };
    slot("severe", 2, id, rule, 1 << 20)
}

fn at(algo: u8, proto: u8) -> usize {
    usize::from(algo) * 3 + usize::from(proto)
}

fn with(table: [f32; 21], i: usize, v: f32) -> Vec<f32> {
    let mut t = table.to_vec();
    t[i] = v;
    t
}

#[test]
fn abi_from_c_and_symbol_lookup_order() {
    let dir = temp_dir("abi");
    let mut h = Harness::start(&dir);
    // The C side's static asserts held (it compiled); the exported objects have the sizes of
    // ncclTuner_v6_t, v5 and v4, and members at the same offsets are the same functions.
    assert_eq!(
        h.one("abi").join(" "),
        "abi name linkpilot linkpilot linkpilot sizes 40 32 32 shared ok"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn choices_follow_healthy_congested_and_stale_boards() {
    let dir = temp_dir("rules");
    let mut w =
        BoardWriter::create(&dir.join("knobs"), Duration::from_secs(60), monotonic_ns()).unwrap();
    w.publish(&[healthy(1)], monotonic_ns());
    let mut h = Harness::start(&dir);

    // Init: NCCL's network latencies (every algorithm/protocol that has one) + half the RTT.
    let (c, net) = h.init(6);
    let defaults = [
        5.0, 8.5, 14.0, 2.7, 4.0, 14.0, 0., 0., 31., 0., 0., 30., 0., 0., 18., 0., 0., 20.9, 0.,
        0., 14.,
    ];
    for (got, d) in net.iter().zip(defaults) {
        let want = if d > 0.0 { d + 90_000.0 } else { 0.0 };
        assert!((got - want).abs() < 1e-6, "NET latencies {net:?}");
    }
    assert_eq!(
        h.logged(
            "NCCL network latency + 90000 us: half the RTT baseline of link hk-us (decision 1)"
        ),
        1
    );

    // Healthy, no preference: NCCL's table and channels as they were; NCCL's chunk (the board's
    // 8 MiB chunk is NCCL_BUFFSIZE).
    assert_eq!(h.coll(c, 6, ALLREDUCE, 64 << 20, &TABLE), (0, 0, TABLE.to_vec()));
    assert_eq!(
        h.chunk(c, ALLREDUCE, 64 << 20, nccl::ALGO_RING, nccl::PROTO_SIMPLE, 4 << 20),
        (0, 4 << 20)
    );

    // Congested: Tree/Simple preferred (cost 0, nothing else moves), at most 4 channels, chunk
    // scaled to the board's 2 MiB: Ring 4 MiB -> 1 MiB, Tree 1 MiB -> 256 KiB.
    w.publish(&[congested(2)], monotonic_ns());
    for _ in 0..3 {
        let tree_simple = with(TABLE, at(nccl::ALGO_TREE, nccl::PROTO_SIMPLE), 0.0);
        assert_eq!(h.coll(c, 6, ALLREDUCE, 64 << 20, &TABLE), (0, 4, tree_simple));
    }
    assert_eq!(
        h.chunk(c, ALLREDUCE, 64 << 20, nccl::ALGO_RING, nccl::PROTO_SIMPLE, 4 << 20),
        (0, 1 << 20)
    );
    assert_eq!(
        h.chunk(c, ALLREDUCE, 64 << 20, nccl::ALGO_TREE, nccl::PROTO_SIMPLE, 1 << 20),
        (0, 256 << 10)
    );
    // Each change is logged once, with the decision behind it.
    assert_eq!(
        h.logged("allreduce 64MiB-128MiB: tree/simple, at most 4 channels (link hk-us congested, decision 2)"),
        1,
        "{:#?}",
        h.logs
    );
    assert_eq!(h.logged("allreduce 64MiB-128MiB ring/simple: chunk 1MiB (board chunk 2MiB, NCCL_BUFFSIZE 8MiB; link hk-us congested, decision 2)"), 1);
    // An entry NCCL did not allow (-1) is never touched: NCCL's own choice among the rest.
    let no_tree_simple: [f32; 21] =
        with(TABLE, at(nccl::ALGO_TREE, nccl::PROTO_SIMPLE), -1.0).try_into().unwrap();
    assert_eq!(h.coll(c, 6, ALLREDUCE, 64 << 20, &no_tree_simple), (0, 4, no_tree_simple.to_vec()));
    // Nothing allowed stays nothing allowed (no channel cap for an algorithm NCCL cannot run).
    assert_eq!(h.coll(c, 6, ALLREDUCE, 64 << 20, &[-1.0; 21]), (0, 0, vec![-1.0; 21]));
    // Below min_bytes, and collective types the plugin does not know: NCCL's own choices.
    assert_eq!(h.coll(c, 6, ALLREDUCE, 512 << 10, &TABLE), (0, 0, TABLE.to_vec()));
    assert_eq!(h.coll(c, 6, 9, 64 << 20, &TABLE), (0, 0, TABLE.to_vec()));
    assert_eq!(h.chunk(c, 9, 64 << 20, nccl::ALGO_RING, nccl::PROTO_SIMPLE, 4 << 20), (0, 4 << 20));
    // LL, LL128 and the algorithms NCCL_BUFFSIZE does not size keep NCCL's chunk.
    assert_eq!(
        h.chunk(c, ALLREDUCE, 64 << 20, nccl::ALGO_RING, nccl::PROTO_LL, 1 << 19),
        (0, 1 << 19)
    );
    assert_eq!(
        h.chunk(c, ALLREDUCE, 64 << 20, nccl::ALGO_NVLS, nccl::PROTO_SIMPLE, 1 << 17),
        (0, 1 << 17)
    );
    // A board chunk above NCCL_BUFFSIZE: NCCL's largest (its buffer), not more.
    w.publish(&[slot("congested", 1, 3, NcclRule::default(), 32 << 20)], monotonic_ns());
    assert_eq!(
        h.chunk(c, ALLREDUCE, 64 << 20, nccl::ALGO_RING, nccl::PROTO_SIMPLE, 4 << 20),
        (0, 4 << 20)
    );
    assert_eq!(h.logged("is above NCCL_BUFFSIZE 8MiB: NCCL's largest"), 1);

    // What the counter file shows `linkpilot status` (read with the daemon's reader).
    w.publish(&[congested(4)], monotonic_ns());
    h.coll(c, 6, ALLREDUCE, 64 << 20, &TABLE);
    h.chunk(c, ALLREDUCE, 64 << 20, nccl::ALGO_RING, nccl::PROTO_SIMPLE, 4 << 20);
    let file = dir.join("stats").join(h.child.id().to_string());
    let p = tuner_stats::read_file(&file).unwrap();
    assert_eq!(
        (p.pid, p.communicators, p.board.as_str(), p.decision_id),
        (h.child.id(), 1, "fresh", 4)
    );
    assert_eq!((p.calls, p.board_calls, p.buffsize_bytes), (9, 9, BUFFSIZE));
    let row =
        p.choices.iter().find(|r| r.collective == "allreduce" && r.size_from == 64 << 20).unwrap();
    assert_eq!(
        (row.algo.as_deref(), row.proto.as_deref(), row.channels, row.chunk_bytes, row.decision_id),
        (Some("tree"), Some("simple"), 4, 1 << 20, 4)
    );

    // Stale (the daemon missed two heartbeats): NCCL's own choices, said once, still success.
    w.publish(&[congested(5)], monotonic_ns() - 200_000_000_000);
    for _ in 0..3 {
        assert_eq!(h.coll(c, 6, ALLREDUCE, 64 << 20, &TABLE), (0, 0, TABLE.to_vec()));
        assert_eq!(
            h.chunk(c, ALLREDUCE, 64 << 20, nccl::ALGO_RING, nccl::PROTO_SIMPLE, 4 << 20),
            (0, 4 << 20)
        );
    }
    assert_eq!(h.logged("stale (the daemon missed two heartbeats)"), 1, "{:#?}", h.logs);
    assert_eq!(tuner_stats::read_file(&file).unwrap().board, "stale");
    // A beat brings it back.
    w.heartbeat(monotonic_ns());
    let tree_simple = with(TABLE, at(nccl::ALGO_TREE, nccl::PROTO_SIMPLE), 0.0);
    assert_eq!(h.coll(c, 6, ALLREDUCE, 64 << 20, &TABLE), (0, 4, tree_simple));
    assert_eq!(h.logged("following link hk-us (congested, decision 5)"), 1);

    // The last communicator's finalize removes the counter file.
    assert_eq!(h.one(&format!("fin {c} 6")), ["rc", "0"]);
    assert!(!file.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn missing_foreign_and_unreadable_boards_mean_nccls_choice() {
    let dir = temp_dir("unusable");
    let board = dir.join("knobs");
    let mut h = Harness::start(&dir);
    let (c, net) = h.init(6);
    assert_eq!(net[..3], [5.0, 8.5, 14.0], "no board: NCCL's latency model as is");
    let untouched = |h: &mut Harness| {
        assert_eq!(h.coll(c, 6, ALLREDUCE, 64 << 20, &TABLE), (0, 0, TABLE.to_vec()));
        assert_eq!(
            h.chunk(c, ALLREDUCE, 64 << 20, nccl::ALGO_RING, nccl::PROTO_SIMPLE, 4 << 20),
            (0, 4 << 20)
        );
    };
    untouched(&mut h);
    assert_eq!(h.logged("no such file"), 1, "{:#?}", h.logs);
    // The path is tried again at most once a second, from the call path.
    let wait = || std::thread::sleep(Duration::from_millis(1100));
    std::fs::write(&board, vec![0x5a; 1080]).unwrap();
    wait();
    untouched(&mut h);
    untouched(&mut h);
    assert_eq!(h.logged("not a knob board"), 1, "{:#?}", h.logs);
    // A board of the previous layout (another release of the daemon).
    let mut v1 = b"LPKNOBS\0".to_vec();
    v1.extend(1u32.to_le_bytes());
    v1.extend(952u32.to_le_bytes());
    v1.resize(952, 0);
    std::fs::write(&board, v1).unwrap();
    wait();
    untouched(&mut h);
    assert_eq!(
        h.logged("layout version 1 (952 bytes), this plugin reads version 2 (1080 bytes)"),
        1,
        "{:#?}",
        h.logs
    );
    std::fs::remove_file(&board).unwrap();
    std::fs::create_dir(&board).unwrap();
    wait();
    untouched(&mut h);
    assert_eq!(h.logged("not a regular file"), 1, "{:#?}", h.logs);
    // Bad arguments NCCL could pass: every call still succeeds and garbles nothing.
    assert_eq!(h.one(&format!("null {c}")).join(" "), "rcs 0 0 0 0 0 0 0 0 chunk 4096 garbled 0");
    // A daemon starts: followed within a second.
    std::fs::remove_dir(&board).unwrap();
    let mut w = BoardWriter::create(&board, Duration::from_secs(60), monotonic_ns()).unwrap();
    w.publish(&[congested(7)], monotonic_ns());
    wait();
    let tree_simple = with(TABLE, at(nccl::ALGO_TREE, nccl::PROTO_SIMPLE), 0.0);
    assert_eq!(h.coll(c, 6, ALLREDUCE, 64 << 20, &TABLE), (0, 4, tree_simple));
    // The daemon dies (its beats stop) and a new one replaces the file: the old mapping goes
    // stale, the new file is mapped.
    w.set_heartbeat_interval(Duration::from_millis(20), monotonic_ns());
    drop(w);
    let mut w = BoardWriter::create(&board, Duration::from_millis(20), monotonic_ns()).unwrap();
    w.publish(&[severe(1)], monotonic_ns());
    let deadline = Instant::now() + Duration::from_secs(5);
    let ring_ll = with(TABLE, at(nccl::ALGO_RING, nccl::PROTO_LL), 0.0);
    loop {
        w.heartbeat(monotonic_ns());
        if h.coll(c, 6, ALLREDUCE, 64 << 20, &TABLE) == (0, 2, ring_ll.clone()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new daemon's board was not followed: {:#?}",
            h.logs
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(h.one(&format!("fin {c} 6")), ["rc", "0"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn v5_and_v4_communicators_work_alongside() {
    let dir = temp_dir("versions");
    let mut w =
        BoardWriter::create(&dir.join("knobs"), Duration::from_secs(60), monotonic_ns()).unwrap();
    w.publish(&[congested(3)], monotonic_ns());
    let mut h = Harness::start(&dir);
    let (c5, net5) = h.init(5);
    let (c4, net4) = h.init(4);
    assert_eq!((net5[2], net4[2]), (90_014.0, 14.0), "v4 has no constants to change");
    let tree_simple = with(TABLE, at(nccl::ALGO_TREE, nccl::PROTO_SIMPLE), 0.0);
    assert_eq!(h.coll(c5, 5, ALLREDUCE, 64 << 20, &TABLE), (0, 4, tree_simple.clone()));
    assert_eq!(h.coll(c4, 4, ALLREDUCE, 64 << 20, &TABLE), (0, 4, tree_simple));
    let file = dir.join("stats").join(h.child.id().to_string());
    assert_eq!(tuner_stats::read_file(&file).unwrap().communicators, 2);
    assert_eq!(h.one(&format!("fin {c5} 5")), ["rc", "0"]);
    assert_eq!(tuner_stats::read_file(&file).unwrap().communicators, 1);
    assert_eq!(h.one(&format!("fin {c4} 4")), ["rc", "0"]);
    assert!(!file.exists());
    // NCCL unloads the library after the last communicator and loads it again for the next.
    assert_eq!(h.one("reload").join(" "), "reloaded v6 dlclose 0");
    let (c6, _) = h.init(6);
    let tree_simple = with(TABLE, at(nccl::ALGO_TREE, nccl::PROTO_SIMPLE), 0.0);
    assert_eq!(h.coll(c6, 6, ALLREDUCE, 64 << 20, &TABLE), (0, 4, tree_simple));
    assert!(file.exists());
    assert_eq!(h.one(&format!("fin {c6} 6")), ["rc", "0"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn eight_threads_while_the_board_is_rewritten_10000_times() {
    let dir = temp_dir("threads");
    let mut w =
        BoardWriter::create(&dir.join("knobs"), Duration::from_secs(60), monotonic_ns()).unwrap();
    w.publish(&[healthy(1)], monotonic_ns());
    let mut h = Harness::start(&dir);
    let (c, _) = h.init(6);
    assert_eq!(h.one(&format!("threads 8 {c}")), ["started", "8"]);
    // Healthy here sets a 6 MiB chunk but min_bytes 128 MiB: its 64 MiB collectives keep
    // NCCL's chunk. A read that tore between chunk_bytes and nccl_min_bytes (different words
    // of the slot) would scale by 6 MiB: a 3 MiB chunk no board asks for.
    let calm = |id| BoardLink { chunk_bytes: 6 << 20, nccl_min_bytes: 128 << 20, ..healthy(id) };
    let states: [&dyn Fn(u64) -> BoardLink; 3] = [&calm, &congested, &severe];
    for i in 0..10_000u64 {
        w.publish(&[states[(i % 3) as usize](i + 2)], monotonic_ns());
        // Spread the rewrites over the workers' calls.
        let t = Instant::now();
        while t.elapsed() < Duration::from_micros(20) {
            std::hint::spin_loop();
        }
    }
    let out = h.ask("stop");
    // Every outcome is one board state's. getCollInfo: (entry set to 0, channels), from one
    // read of the board; a torn read would pair one state's preference with another's cap.
    // getChunkSize (a separate call, maybe of another board): Ring/Simple's 4 MiB at
    // NCCL_BUFFSIZE 8 MiB scaled to the state's chunk.
    let allowed = [
        "c:-1:0".to_owned(),                                        // healthy
        format!("c:{}:4", at(nccl::ALGO_TREE, nccl::PROTO_SIMPLE)), // congested
        format!("c:{}:2", at(nccl::ALGO_RING, nccl::PROTO_LL)),     // severe
        format!("k:{}", 4 << 20),
        format!("k:{}", 1 << 20),
        format!("k:{}", 512 << 10),
    ];
    let mut seen = 0;
    for line in &out {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w[0] {
            "sig" => {
                assert!(
                    allowed.contains(&w[1].to_owned()),
                    "outcome {} is no board's: {out:?}",
                    w[1]
                );
                seen += usize::from(w[1].starts_with("c:"));
            }
            "calls" => {
                assert_eq!(
                    (w[3], w[5]),
                    ("0", "0"),
                    "overflowing outcomes or failed calls: {line}"
                );
                assert!(
                    w[1].parse::<u64>().unwrap() > 1000,
                    "too few calls to say anything: {line}"
                );
            }
            _ => panic!("{line}"),
        }
    }
    assert!(seen >= 2, "the workers should have seen the board change: {out:?}");
    assert_eq!(h.one(&format!("fin {c} 6")), ["rc", "0"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The libnccl.so.2 of the `nvidia-nccl-cu13` wheel (torch's NCCL) in the repository's .venv.
fn wheel_libnccl() -> PathBuf {
    let lib = Path::new(REPO).join(".venv/lib");
    let found = std::fs::read_dir(&lib).ok().and_then(|d| {
        d.flatten()
            .map(|e| e.path().join("site-packages/nvidia/nccl/lib/libnccl.so.2"))
            .find(|p| p.exists())
    });
    found.unwrap_or_else(|| {
        panic!(
            "no site-packages/nvidia/nccl/lib/libnccl.so.2 under {}: `cargo xtask setup` makes \
             the venv (torch pulls nvidia-nccl-cu13)",
            lib.display()
        )
    })
}

#[test]
fn nccls_own_binary_looks_up_the_symbols_we_export() {
    let nccl = std::fs::read(wheel_libnccl()).unwrap();
    // NUL-terminated strings "ncclTunerPlugin_vN" (the names NCCL hands to dlsym).
    let names = |prefix: &[u8]| -> Vec<String> {
        let mut v: Vec<String> = nccl
            .windows(prefix.len() + 2)
            .filter(|w| {
                w.starts_with(prefix)
                    && w[prefix.len()].is_ascii_digit()
                    && w[prefix.len() + 1] == 0
            })
            .map(|w| String::from_utf8_lossy(&w[..prefix.len() + 1]).into_owned())
            .collect();
        v.sort();
        v.dedup();
        v
    };
    let looked_up = names(b"ncclTunerPlugin_v");
    // What we export: the .so's dynamic symbols, as the dynamic linker sees them.
    let out = Command::new("nm").args(["-D", "--defined-only"]).arg(plugin()).output().unwrap();
    let ours: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter(|s| s.starts_with("ncclTuner"))
        .map(str::to_owned)
        .collect();
    assert_eq!(ours, ["ncclTunerPlugin_v4", "ncclTunerPlugin_v5", "ncclTunerPlugin_v6"]);
    for s in &ours {
        assert!(
            looked_up.contains(s),
            "NCCL's binary does not name {s}: it looks up {looked_up:?}"
        );
    }
    // And NCCL knows no newer version than ours.
    assert_eq!(looked_up.last().map(String::as_str), Some("ncclTunerPlugin_v6"), "{looked_up:?}");
}
