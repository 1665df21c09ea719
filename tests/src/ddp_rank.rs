//! Training ranks for the lab tests: `linkpilot.ddp_check` in a lab host's namespace, its JSON
//! lines read as they come, and boards fed by `linkpilot board feed` (the daemon's own writer).

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::Duration,
};

use linkpilot_lab::lab::Host;
use serde_json::Value;

/// A board written by the daemon's own writer, saying `codec` on link "wan".
pub struct Feeder {
    child: Child,
    pub path: PathBuf,
}

impl Feeder {
    pub fn new(tag: &str, codec: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("lp-train-{}-{tag}.knobs", std::process::id()));
        let mut child = Command::new(crate::linkpilot_bin())
            .args(["board", "feed", "--board", path.to_str().expect("utf-8")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("linkpilot board feed");
        let line = format!(
            "{{\"links\":[{{\"name\":\"wan\",\"state\":\"test\",\"state_index\":1,\
             \"compression\":\"{codec}\",\"watchdog_s\":300,\"decision_id\":1}}]}}\n"
        );
        child.stdin.as_mut().expect("stdin").write_all(line.as_bytes()).expect("feed");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut published = String::new();
        out.read_line(&mut published).expect("published");
        assert!(published.starts_with("published"), "board feed said {published:?}");
        Self { child, path }
    }
}

impl Drop for Feeder {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.path);
    }
}

pub struct Rank {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    stderr: thread::JoinHandle<String>,
}

/// Rank `r` of `world` of `python -m linkpilot.ddp_check` in `host`'s namespace, following the
/// board at `board`, `steps` steps of 1.2 s of compute; `extra` arguments come last (and win).
#[allow(clippy::too_many_arguments)]
pub fn rank(
    host: &Host,
    master: &Host,
    r: usize,
    world: usize,
    board: &Path,
    steps: u64,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Rank {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/run/netns/{}", host.netns))
        .arg(crate::python())
        .args(["-m", "linkpilot.ddp_check", "--iface", "eth0", "--steps"])
        .arg(steps.to_string())
        .args(["--rank", &r.to_string(), "--world", &world.to_string()])
        .args(["--master", &format!("{}:29500", master.ipv4)])
        .args(["--board", board.to_str().expect("utf-8")])
        .args(["--large-bucket-bytes", "0", "--bucket-mb", "1", "--step-sleep", "1.2"])
        .args(extra)
        .envs(env.iter().copied())
        .env("PYTHONUNBUFFERED", "1");
    Rank::spawn(&mut cmd)
}

impl Rank {
    /// A rank process that prints JSON lines (`PYTHONUNBUFFERED` set by the caller).
    pub fn spawn(cmd: &mut Command) -> Self {
        let (child, lines, stderr) = crate::spawn_piped(cmd, "a rank");
        Rank { child, lines, stderr }
    }

    /// Lines up to the next one that has `key` (returned last); panics with the rank's log if
    /// it does not come in time or the rank exits first.
    pub fn until(&mut self, key: &str, limit: Duration) -> Vec<Value> {
        self.until_where(key, |_| true, limit)
    }

    /// Lines up to the next one whose `key` is there and passes `wanted` (returned last).
    pub fn until_where(
        &mut self,
        key: &str,
        wanted: impl Fn(&Value) -> bool,
        limit: Duration,
    ) -> Vec<Value> {
        let mut seen = Vec::new();
        loop {
            match self.lines.recv_timeout(limit) {
                Ok(line) => {
                    let v: Value = serde_json::from_str(&line).unwrap_or(Value::String(line));
                    let found = v.get(key).is_some_and(&wanted);
                    seen.push(v);
                    if found {
                        return seen;
                    }
                }
                Err(e) => {
                    let log = crate::killed_log(&mut self.child, &mut self.stderr);
                    panic!("rank printed no {key:?} within {limit:?} ({e}); its log:\n{log}");
                }
            }
        }
    }
}

impl Rank {
    /// The lines printed so far and not yet taken, without waiting.
    pub fn drain(&mut self) -> Vec<Value> {
        self.lines
            .try_iter()
            .map(|l| serde_json::from_str(&l).unwrap_or(Value::String(l)))
            .collect()
    }
}

impl Drop for Rank {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
