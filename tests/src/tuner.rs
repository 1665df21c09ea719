//! A training process as the NCCL tuner plugin sees it: nccl-tuner's C harness (built here with
//! the system's `cc`) loads the real plugin as NCCL does, creates a communicator and asks for
//! one AllReduce, so that the plugin writes its counter file for the daemon to read.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
};

const HARNESS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../nccl-tuner/tests/harness.c");
/// NCCL's costs for a multi-node AllReduce (Tree and Ring, every protocol), as nccl.rs uses.
const TABLE: &str = "30 25 20 5 15 10 -1 -1 -1 -1 -1 -1 -1 -1 -1 -1 -1 -1 -1 -1 -1";

/// The plugin under test: `LINKPILOT_TUNER_PLUGIN` or this workspace's debug build
/// (`cargo build -p linkpilot-nccl-tuner`).
pub fn plugin() -> PathBuf {
    crate::built(
        "LINKPILOT_TUNER_PLUGIN",
        "libnccl_tuner_linkpilot.so",
        "`cargo build -p linkpilot-nccl-tuner`",
    )
}

/// nccl-tuner's C harness, built in `work` with the system's `cc`: it loads a plugin as NCCL
/// does and drives it from commands on stdin.
pub fn harness(work: &Path) -> PathBuf {
    std::fs::create_dir_all(work).expect("work dir");
    let bin = work.join("nccl-tuner-harness");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    crate::sh(&[
        &cc,
        "-std=c11",
        "-O1",
        "-pthread",
        HARNESS,
        "-o",
        bin.to_str().expect("utf-8"),
        "-ldl",
    ]);
    bin
}

pub struct TrainingProcess {
    child: Child,
    _stdin: ChildStdin,
}

impl TrainingProcess {
    /// Starts one reading `board` and counting into `stats` (its harness built in `work`).
    pub fn start(work: &Path, board: &Path, stats: &Path) -> Self {
        let bin = harness(work);
        let mut child = Command::new(&bin)
            .arg(plugin())
            .env("LINKPILOT_BOARD", board)
            .env("LINKPILOT_TUNER_STATS", stats)
            .env("NCCL_BUFFSIZE", (8 << 20).to_string())
            .env_remove("LINKPILOT_LINK")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("the tuner harness");
        let mut stdin = child.stdin.take().expect("stdin");
        // Communicator slot 0, then one 64 MiB AllReduce; the harness then waits on stdin.
        writeln!(stdin, "init 6 4660 16 2\ncoll 0 6 4 67108864 0 {TABLE}").expect("harness stdin");
        Self { child, _stdin: stdin }
    }
}

impl Drop for TrainingProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
