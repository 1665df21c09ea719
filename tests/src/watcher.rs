//! `linkpilot watch --json` run as a child process inside a test namespace.

use std::{
    process::{Child, Command},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};

use crate::{linkpilot_bin, netns::Netns};

pub use linkpilot::cli::watch::{DirTotals, FlowSample, PeerTotals, RttTotals, Sample};
pub use linkpilot_common::IfaceStats;

/// The totals of peer `name` in `sample`; panics if it is not there.
pub fn peer<'a>(sample: &'a Sample, name: &str) -> &'a PeerTotals {
    sample.peer(name).unwrap_or_else(|| panic!("no peer {name}: {sample:?}"))
}

/// A running `linkpilot watch`; killed if dropped without [`Watcher::stop`].
pub struct Watcher {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: thread::JoinHandle<String>,
}

impl Watcher {
    /// Starts watching `ifaces` in `ns` and returns once the first sample is out, i.e. once
    /// every program is attached.
    pub fn start(ns: &Netns, ifaces: &[&str]) -> Self {
        Self::start_in(&ns.name, ifaces, &[])
    }

    /// Like [`Watcher::start`] in namespace `netns`, with extra `watch` arguments.
    pub fn start_in(netns: &str, ifaces: &[&str], extra: &[&str]) -> Self {
        // nsenter, not `ip netns exec`: the latter remounts /sys, hiding tracefs.
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{netns}")).arg(linkpilot_bin()).arg("watch");
        // JSON samples, unless the caller asked for sensors snapshots instead.
        if !extra.contains(&"--snapshots") {
            cmd.arg("--json");
        }
        cmd.args(extra);
        for i in ifaces {
            cmd.args(["--iface", i]);
        }
        let (child, lines, stderr) =
            crate::spawn_piped(cmd.env("RUST_LOG", "debug"), "linkpilot watch");
        let mut w = Self { child, lines, stderr };
        if let Err(e) = w.lines.recv_timeout(Duration::from_secs(20)) {
            let log = crate::killed_log(&mut w.child, &mut w.stderr);
            panic!("linkpilot watch printed no sample within 20 s ({e}); its log:\n{log}");
        }
        w
    }

    /// Sends `signal`, waits for a clean exit, and returns the last sample of each interface.
    pub fn stop_with(self, signal: Signal) -> Vec<Sample> {
        let (raw, log) = self.stop_lines(signal);
        let samples: Vec<Sample> = raw
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
            .collect();
        let last: Vec<Sample> = samples.into_iter().filter(|s| s.last).collect();
        assert!(!last.is_empty(), "linkpilot printed no final sample; its log:\n{log}");
        last
    }

    /// Sends `signal`, waits for a clean exit, and returns every stdout line and the log.
    pub fn stop_lines(mut self, signal: Signal) -> (Vec<String>, String) {
        kill(Pid::from_raw(self.child.id() as i32), signal).expect("signalling linkpilot");
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("waiting for linkpilot") {
                break status;
            }
            assert!(Instant::now() < deadline, "linkpilot did not exit within 10 s of {signal}");
            thread::sleep(Duration::from_millis(20));
        };
        let log = crate::collected(&mut self.stderr);
        assert!(status.success(), "linkpilot exited with {status}; its log:\n{log}");
        // The reader thread ends at EOF, closing the channel; bounded in case it never does.
        let mut raw = Vec::new();
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            raw.push(line);
        }
        (raw, log)
    }

    /// Stops with SIGINT (Ctrl-C) and returns the final totals of `iface`.
    pub fn stop(self, iface: &str) -> IfaceStats {
        let last = self.stop_with(Signal::SIGINT);
        last.iter()
            .find(|s| s.iface == iface)
            .unwrap_or_else(|| panic!("no final sample for {iface}: {last:?}"))
            .totals
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
