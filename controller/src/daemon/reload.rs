//! Noticing that the policy file changed: its content read and compared about once a second,
//! which also catches editors that write a new file and rename it over the old one (inotify on
//! the file would lose track of it then). SIGHUP forces a reload either way.
//!
//! The content, not its metadata: two writes within one tick of the kernel's coarse clock can
//! leave size and mtime the same, and a daemon comparing those would miss the last one for good.
//! The bytes compared are the bytes loaded, so a file rewritten between the check and the load
//! cannot leave the daemon running a version it then believes seen.
//!
//! Then the reload itself: checked against what cannot change while running, and switched to
//! only as a whole.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::Context;
use tracing::{error, info};

use super::{
    interfaces, load_policy,
    metrics::Metrics,
    peer_table,
    transport::{self, TransportPath},
    Daemon,
};
use crate::{control::policy::sha256_hex, kernel::probes::monotonic_ns};

pub struct PolicyWatch {
    path: PathBuf,
    /// The content last loaded (or the start's).
    seen: Option<Vec<u8>>,
    last_check: Instant,
    every: Duration,
}

impl PolicyWatch {
    /// Starts from `loaded`, the bytes the running policy came from.
    pub fn new(path: &Path, loaded: Vec<u8>) -> Self {
        Self {
            path: path.to_owned(),
            seen: Some(loaded),
            last_check: Instant::now(),
            every: Duration::from_secs(1),
        }
    }

    /// The file's content when it differs from the last content seen (checked at most once per
    /// second), recorded as seen. A file that disappears or cannot be read is not a change:
    /// the running policy stays.
    pub fn changed(&mut self) -> Option<Vec<u8>> {
        if self.last_check.elapsed() < self.every {
            return None;
        }
        self.last_check = Instant::now();
        let now = std::fs::read(&self.path).ok()?;
        if self.seen.as_ref() == Some(&now) {
            return None;
        }
        self.seen = Some(now.clone());
        Some(now)
    }

    /// The file's content now, recorded as seen (a SIGHUP reload).
    pub fn read_now(&mut self) -> std::io::Result<Vec<u8>> {
        let now = std::fs::read(&self.path)?;
        self.seen = Some(now.clone());
        Ok(now)
    }
}

impl Daemon {
    /// Loads the policy file again. An invalid one (or one that changes the interfaces, which
    /// needs a restart to re-attach) is rejected: logged with its errors, counted, and the
    /// running policy stays. Returns the new tick if it changed.
    pub(super) fn reload(&mut self, bytes: std::io::Result<Vec<u8>>) -> Option<Duration> {
        let rejected = |d: &mut Self, why: String| {
            error!("policy reload rejected, keeping the running policy:\n{why}");
            Metrics::count(&d.report.metrics.reloads, "result", "rejected");
            if let Ok(mut st) = d.report.status.lock() {
                st.last_reload_error = Some(why);
            }
            None
        };
        let loaded = bytes
            .with_context(|| format!("reading the policy {}", self.o.policy.display()))
            .and_then(|b| Ok((load_policy(&self.o.policy, &b)?, sha256_hex(&b))));
        let (policy, sha256) = match loaded {
            Ok(p) => p,
            Err(e) => return rejected(self, format!("{e:#}")),
        };
        if policy.names_peers() != self.decider.policy().names_peers() && !self.o.dry_run {
            let now = if self.observe_only { "observing only" } else { "acting" };
            return rejected(
                self,
                format!(
                    "{}: the new policy {} peers and the running one {}; linkpilot is {now}: \
                     restart it to {}",
                    self.o.policy.display(),
                    if policy.names_peers() { "names" } else { "names no" },
                    if self.observe_only { "names none" } else { "names some" },
                    if policy.names_peers() { "act on them" } else { "observe only" }
                ),
            );
        }
        if let Err(e) = transport::check_algorithms(&policy, &self.o.sysctl_root) {
            return rejected(self, format!("{e:#}"));
        }
        if policy.has_transport()
            && !self.o.dry_run
            && !self.observe_only
            && self.transport_path == TransportPath::Unneeded
        {
            return rejected(
                self,
                format!(
                    "{}: the new policy has [state.transport] profiles and the running one has \
                     none, so the sock_ops program is not attached: restart linkpilot to apply \
                     them",
                    self.o.policy.display()
                ),
            );
        }
        let (old, new) = (interfaces(self.decider.policy()), interfaces(&policy));
        if old != new {
            return rejected(
                self,
                format!(
                    "{}: interfaces {new:?} differ from the running {old:?}; restart linkpilot \
                     to watch other interfaces",
                    self.o.policy.display()
                ),
            );
        }
        let peers = match peer_table(&policy) {
            Ok(p) => p,
            Err(e) => return rejected(self, format!("{}: {e:#}", self.o.policy.display())),
        };
        let running = self.decider.policy();
        let window = Duration::from_nanos(policy.estimator.window.0);
        let window_changed = policy.estimator.window != running.estimator.window;
        let tick = (policy.tick != running.tick).then(|| Duration::from_nanos(policy.tick.0));
        if let Err(why) = self.sense.set_peers(peers, window_changed, window) {
            return rejected(self, why);
        }
        if let (Some(t), Some(b)) = (tick, &mut self.act.board) {
            // Readers judge staleness by the interval on the board.
            b.set_heartbeat_interval(t.max(Duration::from_millis(100)), monotonic_ns());
        }
        self.decider.reload(policy, sha256.clone());
        self.forget_series();
        Metrics::count(&self.report.metrics.reloads, "result", "applied");
        self.report.metrics.policy(&sha256);
        info!("policy reloaded from {} (sha256 {sha256})", self.o.policy.display());
        tick
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A watch on `policy.toml` in `dir`, written with `bytes`, that looks at every call.
    fn watching(dir: &std::path::Path, bytes: &[u8]) -> (std::path::PathBuf, PolicyWatch) {
        let p = dir.join("policy.toml");
        std::fs::write(&p, bytes).unwrap();
        let mut w = PolicyWatch::new(&p, bytes.to_vec());
        w.every = Duration::ZERO;
        (p, w)
    }

    #[test]
    fn notices_writes_and_renames_not_absence() {
        let dir = tempfile::tempdir().unwrap();
        let (p, mut w) = watching(dir.path(), b"a");
        assert_eq!(w.changed(), None);
        std::fs::write(&p, "ab").unwrap();
        assert_eq!(w.changed().as_deref(), Some(&b"ab"[..]));
        assert_eq!(w.changed(), None, "reported once");
        let tmp = dir.path().join("policy.toml.new");
        std::fs::write(&tmp, "ac").unwrap();
        std::fs::rename(&tmp, &p).unwrap();
        assert_eq!(w.changed().as_deref(), Some(&b"ac"[..]), "a rename over the file");
        std::fs::remove_file(&p).unwrap();
        assert_eq!(w.changed(), None, "a missing file keeps the running policy");
    }

    #[test]
    fn same_size_and_mtime_with_other_bytes_is_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let (p, mut w) = watching(dir.path(), b"tick = \"100ms\"");
        let mtime = std::fs::metadata(&p).unwrap().modified().unwrap();
        std::fs::write(&p, "tick = \"200ms\"").unwrap();
        std::fs::File::options().write(true).open(&p).unwrap().set_modified(mtime).unwrap();
        assert_eq!(w.changed().as_deref(), Some(&b"tick = \"200ms\""[..]));
    }
}
