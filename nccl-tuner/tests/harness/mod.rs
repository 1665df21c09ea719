//! The C harness (tests/harness.c) as the NCCL tests drive it: building it, starting it on the
//! plugin, its commands, and the cost tables and decisions the tests feed it.

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::{mpsc, OnceLock},
    time::{Duration, Instant},
};

use linkpilot::{
    board::tuner_stats::{self, Counted, TunerProcess},
    board::{board_link, set_nccl, BoardWriter},
    control::{policy::NcclRule, Compression, Knobs},
    kernel::probes::monotonic_ns,
};
use linkpilot_common::board::nccl;

pub const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
/// NCCL_BUFFSIZE the harness runs with.
pub const BUFFSIZE: u64 = 8 << 20;
/// A multi-node AllReduce's costs as NCCL hands them over: Tree and Ring with every protocol
/// (Ring/LL cheapest), the other algorithms not allowed (-1).
pub const TABLE: [f32; 21] = [
    30., 25., 20., 5., 15., 10., -1., -1., -1., -1., -1., -1., -1., -1., -1., -1., -1., -1., -1.,
    -1., -1.,
];
pub const ALLREDUCE: i32 = 4;

/// The .so cargo built with this test: target/debug/deps/ (`cargo test` builds the cdylib
/// there; only `cargo build` copies it up to target/debug/, which may be older).
pub fn plugin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps, deps.parent().unwrap()]
        .iter()
        .map(|d| d.join("libnccl_tuner_linkpilot.so"))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("no libnccl_tuner_linkpilot.so next to {}", exe.display()))
}

/// The harness, compiled once per test process. Test runners that run each test in a process
/// of its own (nextest) start several at once: each compiles to a name of its own and renames
/// it into place, so that no process executes a file another is still writing (ETXTBSY, or a
/// half-written binary).
pub fn harness_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nccl-tuner-harness");
        let building = out.with_extension(format!("building-{}", std::process::id()));
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/harness.c");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let status = Command::new(&cc)
            .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread", src, "-o"])
            .arg(&building)
            .arg("-ldl")
            .status()
            .unwrap_or_else(|e| {
                panic!("running the C compiler {cc:?}: {e} (install gcc or set CC)")
            });
        assert!(status.success(), "{cc} could not build {src}");
        std::fs::rename(&building, &out).unwrap_or_else(|e| {
            panic!("renaming {} to {}: {e}", building.display(), out.display())
        });
        out
    })
}

pub struct Harness {
    pub child: Child,
    pub stdin: ChildStdin,
    pub lines: mpsc::Receiver<String>,
    /// Every log line so far ("log LEVEL FLAGS message").
    pub logs: Vec<String>,
}

impl Harness {
    pub fn start(dir: &Path) -> Self {
        Self::start_with(dir, &[])
    }

    pub fn start_with(dir: &Path, env: &[(&str, &str)]) -> Self {
        std::fs::create_dir_all(dir.join("stats")).unwrap();
        let mut child = Command::new(harness_bin())
            .arg(plugin())
            .env("LINKPILOT_BOARD", dir.join("knobs"))
            .env("LINKPILOT_TUNER_STATS", dir.join("stats"))
            .env("NCCL_BUFFSIZE", BUFFSIZE.to_string())
            .env_remove("LINKPILOT_LINK")
            .env_remove("LINKPILOT_NCCL_NET_LATENCY_US")
            .envs(env.iter().copied())
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

    pub fn answer(&mut self) -> Vec<String> {
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

    pub fn ask(&mut self, cmd: &str) -> Vec<String> {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.answer()
    }

    /// The one answer line of `cmd`, split in words.
    pub fn one(&mut self, cmd: &str) -> Vec<String> {
        let a = self.ask(cmd);
        assert_eq!(a.len(), 1, "{cmd}: {a:?}");
        a[0].split_whitespace().map(str::to_owned).collect()
    }

    /// Creates a communicator; returns (slot, NET latencies after init).
    pub fn init(&mut self, version: u32) -> (usize, Vec<f64>) {
        let a = self.one(&format!("init {version} 4660 16 2"));
        assert_eq!((a[0].as_str(), a[2].as_str(), a[3].as_str()), ("ctx", "rc", "0"), "{a:?}");
        assert_eq!(a[5], "0", "init left no context: {a:?}");
        (a[1].parse().unwrap(), a[7..].iter().map(|v| v.parse().unwrap()).collect())
    }

    /// getCollInfo: (rc, channels out, table out).
    pub fn coll(
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
    pub fn chunk(
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

    pub fn logged(&self, words: &str) -> usize {
        self.logs.iter().filter(|l| l.contains(words)).count()
    }

    /// Adopts `rule` ("ALGO PROTO CHANNELS STATE MIN_BYTES CHUNK") from `step` on.
    pub fn adopt(&mut self, rule: &str, step: u64) {
        assert_eq!(self.one(&format!("adopt {rule} {step}")), ["rc", "0"]);
    }

    /// The counter file of this process (`<pid>-<16 hex digits>` under `dir/stats`).
    pub fn counter_file(&self, dir: &Path) -> Option<PathBuf> {
        let prefix = format!("{}-", self.child.id());
        std::fs::read_dir(dir.join("stats"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(&prefix))
    }

    /// The counter file as the daemon reads it, once it shows what `want` checks (the plugin
    /// writes it once a second).
    pub fn counters(&self, dir: &Path, want: impl Fn(&TunerProcess) -> bool) -> TunerProcess {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let file = self.counter_file(dir).expect("a counter file");
            let got = tuner_stats::read_file(&file);
            if let Ok(Counted::Live(p)) = &got {
                if want(p) {
                    return p.clone();
                }
            }
            assert!(Instant::now() < deadline, "the counter file never showed it: {got:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A directory of the test's own, removed when the returned guard goes.
pub fn temp_dir(name: &str) -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::Builder::new().prefix(&format!("lp-nccl-tuner-{name}-")).tempdir().unwrap();
    let path = d.path().to_owned();
    (d, path)
}

/// What the training code adopts, as "ALGO PROTO CHANNELS STATE MIN_BYTES CHUNK": a congested
/// link's Tree/Simple from 1 MiB with at most 4 channels and 2 MiB chunks; a severe one's
/// Ring/LL with 2 channels and 1 MiB chunks; a calm one's rule that only sets a 6 MiB chunk, from
/// 128 MiB on.
pub const CONGESTED: &str = "0 2 4 1 1048576 2097152";
pub const SEVERE: &str = "1 0 2 2 1048576 1048576";
pub const CALM: &str = "255 255 0 0 134217728 6291456";

/// A fresh knob board saying "congested, Tree/Simple, 4 channels, 2 MiB", as the daemon of the
/// host would write it: the plugin must not follow it (ranks on other hosts see others).
pub fn hosts_own_board(path: &Path) -> BoardWriter {
    let k = Knobs {
        compression: Compression::None,
        chunk_bytes: 2 << 20,
        nccl_ib_timeout: 22,
        nccl_ib_retry_cnt: 7,
        watchdog_s: 600,
        dscp: Some(26),
        roce_traffic_class: Some(106),
        tcp_buffer_bytes: 128 << 20,
        sync: Default::default(),
        transport: None,
    };
    let mut l = board_link("hk-us", "congested", 1, &k, 5);
    let rule =
        NcclRule { algo: Some(nccl::ALGO_TREE), proto: Some(nccl::PROTO_SIMPLE), max_channels: 4 };
    set_nccl(&mut l, rule, 1 << 20, Some(180.0));
    let mut w = BoardWriter::create(path, Duration::from_secs(60), monotonic_ns()).unwrap();
    w.publish(&[l], monotonic_ns());
    w
}

pub fn at(algo: u8, proto: u8) -> usize {
    usize::from(algo) * 3 + usize::from(proto)
}

pub fn with(table: [f32; 21], i: usize, v: f32) -> Vec<f32> {
    let mut t = table.to_vec();
    t[i] = v;
    t
}

pub const NET_DEFAULTS: [f64; 21] = [
    5.0, 8.5, 14.0, 2.7, 4.0, 14.0, 0., 0., 31., 0., 0., 30., 0., 0., 18., 0., 0., 20.9, 0., 0.,
    14.,
];
