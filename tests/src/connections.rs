//! Tens of thousands of real TCP connections with both ends in one network namespace, held open
//! and churned (closed and opened again at a rate): what fills the daemon's flow table, one entry
//! per end, as real traffic would. Held by Python workers (`connections.py`), each under the
//! descriptor limit a process may have without CAP_SYS_RESOURCE.

use std::{
    io::{BufRead, BufReader, Read, Write},
    process::{Child, ChildStdin, ChildStdout, Stdio},
};

use crate::netns::Netns;

const WORKER: &str = include_str!("connections.py");

/// Connections per worker: two descriptors each, under a hard limit of 20,000 (what some
/// machines give even to root), and one listener's share of the ephemeral ports (~28k).
const PER_WORKER: usize = 9_000;

struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    out: BufReader<ChildStdout>,
}

impl Worker {
    /// The worker's next line, or a panic with what it said on stderr.
    fn line(&mut self, what: &str) -> String {
        let mut line = String::new();
        if self.out.read_line(&mut line).unwrap_or(0) == 0 {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let mut err = String::new();
            if let Some(mut e) = self.child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            panic!("connection worker ended before {what}: {err}");
        }
        line
    }
}

/// Connections held by workers in a namespace; dropping it kills the workers, which closes
/// every socket.
pub struct Connections {
    workers: Vec<Worker>,
    n: usize,
}

impl Connections {
    /// Opens `n` connections from `addr` to `addr` inside `ns`; returns once all are
    /// established.
    pub fn open(ns: &Netns, addr: &str, n: usize) -> Self {
        let count = n.div_ceil(PER_WORKER);
        let mut c = Self { workers: Vec::new(), n };
        for i in 0..count {
            let share = n / count + usize::from(i < n % count);
            let mut child = ns
                .command(&["/usr/bin/python3", "-c", WORKER, addr, &share.to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("python3");
            let (stdin, out) = (child.stdin.take(), BufReader::new(child.stdout.take().unwrap()));
            c.workers.push(Worker { child, stdin, out });
        }
        for w in &mut c.workers {
            let line = w.line("opening its connections");
            assert!(line.starts_with("open "), "{line}");
        }
        c
    }

    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// For `secs`, replaces the oldest connections with new ones, `rate` a second in all (a
    /// reset closes one, a handshake opens the next). Returns how many were replaced.
    pub fn churn(&mut self, rate: u32, secs: f64) -> u64 {
        let share = f64::from(rate) / self.workers.len() as f64;
        for w in &mut self.workers {
            let stdin = w.stdin.as_mut().expect("stdin");
            writeln!(stdin, "churn {share} {secs}").expect("churn command");
            stdin.flush().expect("churn command");
        }
        self.workers
            .iter_mut()
            .map(|w| {
                let line = w.line("churning");
                let k = line.trim().strip_prefix("churned ").and_then(|k| k.parse::<u64>().ok());
                k.unwrap_or_else(|| panic!("a worker answered {line:?}"))
            })
            .sum()
    }

    /// Closes every connection: the workers close their sockets and exit.
    pub fn close(mut self) {
        for w in &mut self.workers {
            drop(w.stdin.take());
            let status = w.child.wait().expect("worker");
            assert!(status.success(), "connection worker exited {status}");
        }
    }
}

impl Drop for Connections {
    fn drop(&mut self) {
        for w in &mut self.workers {
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
    }
}
