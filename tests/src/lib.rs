//! Helpers for the privileged integration tests: network namespaces torn down by guards, commands
//! whose failures say what failed, and the `linkpilot` binary driven as a user would.
//!
//! Addresses come from the benchmarking range 198.18.0.0/15 (RFC 2544); traffic never leaves the
//! namespaces a test made.

pub mod burst_rtt;
pub mod configmap;
pub mod connections;
pub mod daemon;
pub mod ddp_rank;
pub mod faults;
pub mod grafana;
pub mod marking;
pub mod netns;
pub mod oracle;
pub mod policy;
pub mod prometheus;
pub mod rdma;
pub mod sink;
pub mod tuner;
pub mod watcher;

use std::{
    io::{BufRead as _, BufReader},
    path::PathBuf,
    process::{Child, Command, Output, Stdio},
    sync::mpsc,
    thread,
};

/// A child process killed and reaped when dropped, so a failing test leaves no iperf3, tcpdump or
/// writer behind.
pub struct Reaped(Option<Child>);

impl Reaped {
    pub fn new(child: Child) -> Self {
        Self(Some(child))
    }

    /// The child, no longer killed on drop (to wait for it).
    pub fn take(mut self) -> Child {
        self.0.take().expect("a child")
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A fresh, empty directory for one test's files (`what` names it; the pid keeps runs apart).
/// Left behind when the test fails, for diagnosis.
pub fn temp_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lp-test-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

/// Runs `args` (program first) and returns stdout; panics with the command and its stderr.
pub fn sh(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "command {:?} failed ({}): {}",
        args,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `args` and returns its output whatever the exit status.
pub fn run(args: &[&str]) -> Output {
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("could not start {:?}: {e}", args[0]))
}

/// The `linkpilot` binary under test: `LINKPILOT_BIN` (set by `cargo xtask test`) or the debug
/// build of this workspace.
pub fn linkpilot_bin() -> PathBuf {
    built("LINKPILOT_BIN", "linkpilot", "`cargo build -p linkpilot` or run `cargo xtask test`")
}

/// A build output under test: the path in `env` or this workspace's `target/debug/<file>`;
/// panics, saying how to build it, when it is not there.
pub fn built(env: &str, file: &str, how: &str) -> PathBuf {
    let path = std::env::var_os(env).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug").join(file)
    });
    assert!(path.is_file(), "{} does not exist: build it with {how}", path.display());
    path
}

/// The Python with torch and the `linkpilot` package: `LINKPILOT_PYTHON` or the workspace's
/// `.venv` (made by `cargo xtask setup`).
pub fn python() -> PathBuf {
    std::env::var_os("LINKPILOT_PYTHON").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv/bin/python"))
    })
}

/// The NCCL tuner plugin as shipped, built for glibc 2.28: `LINKPILOT_SHIPPED_TUNER` (set by
/// `cargo xtask test`; `cargo xtask build-tuner` prints its path).
pub fn shipped_tuner() -> PathBuf {
    let path = PathBuf::from(std::env::var_os("LINKPILOT_SHIPPED_TUNER").expect(
        "LINKPILOT_SHIPPED_TUNER: the shipped plugin (`cargo xtask build-tuner` prints it)",
    ));
    assert!(path.is_file(), "{} does not exist", path.display());
    path
}

/// The `linkpilot-lab` binary: `LINKPILOT_LAB_BIN` or the debug build of this workspace.
pub fn lab_bin() -> PathBuf {
    built(
        "LINKPILOT_LAB_BIN",
        "linkpilot-lab",
        "`cargo build -p linkpilot-lab` or run `cargo xtask test`",
    )
}

/// Starts `cmd` with stdout and stderr piped, as [`pipe_output`] reads them; `what` names it
/// in the panic when it cannot start.
pub fn spawn_piped(
    cmd: &mut Command,
    what: &str,
) -> (Child, mpsc::Receiver<String>, thread::JoinHandle<String>) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {what}: {e}"));
    let (lines, log) = pipe_output(&mut child);
    (child, lines, log)
}

/// What a child piped to stderr, once it has exited ([`pipe_output`]'s collector, left empty).
pub fn collected(stderr: &mut thread::JoinHandle<String>) -> String {
    std::mem::replace(stderr, thread::spawn(String::new)).join().unwrap_or_default()
}

/// Kills `child` and returns its stderr: what a test prints when it gives up on the child.
pub fn killed_log(child: &mut Child, stderr: &mut thread::JoinHandle<String>) -> String {
    let _ = child.kill();
    let _ = child.wait();
    collected(stderr)
}

/// A child's piped stdout as a channel of lines, and its piped stderr collected whole (joined
/// when the child has exited), so that a test can wait for a line with a timeout and print the
/// log on failure.
pub fn pipe_output(child: &mut Child) -> (mpsc::Receiver<String>, thread::JoinHandle<String>) {
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, lines) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let log = thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    (lines, log)
}
