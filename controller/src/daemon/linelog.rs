//! The decision log and the record: JSON lines appended to files that may fill up (a full disk,
//! a quota). The loop keeps deciding when a line cannot be written: these files are an audit
//! trail, not the control path, and stopping would take the board and the actuators down over
//! a log (a restart would meet the same full disk). Instead each line is one write, and a line
//! the disk took only part of is cut off again, so the file holds whole lines only and
//! readers (`replay`, jq) never meet a torn one; lost lines are counted
//! (`linkpilot_log_write_errors_total`), said once when the losses start and once when writing
//! works again, with how many were lost.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
};

use anyhow::Context;
use tracing::{info, warn};

use super::metrics::Metrics;
use crate::control::Decision;

/// A decision as the decision log keeps it: the decision and the wall-clock time it was taken
/// (`unix_ms`), so that it can be set beside a training job's own timestamps; its `at_ms`
/// counts from the daemon's start.
pub fn decision_line(d: &Decision) -> serde_json::Result<String> {
    #[derive(serde::Serialize)]
    struct Logged<'a> {
        unix_ms: u64,
        #[serde(flatten)]
        decision: &'a Decision,
    }
    let unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    serde_json::to_string(&Logged { unix_ms, decision: d })
}

pub struct LineLog {
    file: fs::File,
    path: PathBuf,
    /// The metric's label: "decision_log" or "record".
    what: &'static str,
    /// Lines lost since writing last worked.
    lost: u64,
}

impl LineLog {
    pub fn open(path: &Path, what: &'static str) -> anyhow::Result<Self> {
        // Not through a symlink: lines are appended as root.
        let file = crate::actuate::files::open_nofollow(
            path,
            fs::OpenOptions::new().create(true).append(true),
        )
        .with_context(|| format!("opening {}", path.display()))?;
        Ok(Self { file, path: path.to_owned(), what, lost: 0 })
    }

    /// Appends `line` and a newline, whole or not at all.
    pub fn append(&mut self, line: &str, metrics: &Metrics) {
        match self.write(line) {
            Ok(()) => {
                if self.lost > 0 {
                    info!(
                        "{}: writing again; {} line(s) were lost",
                        self.path.display(),
                        self.lost
                    );
                    self.lost = 0;
                }
            }
            Err(e) => {
                if self.lost == 0 {
                    warn!(
                        "{}: {e:#}; its lines are lost (counted in \
                         linkpilot_log_write_errors_total) until it can be written again; \
                         decisions go on",
                        self.path.display()
                    );
                }
                self.lost += 1;
                Metrics::count(&metrics.log_write_errors, "file", self.what);
            }
        }
    }

    fn write(&mut self, line: &str) -> anyhow::Result<()> {
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
        // Appends go to the end: where a torn line would start.
        let end = self.file.metadata().context("stat")?.len();
        if let Err(e) = self.file.write_all(&buf) {
            if let Err(cut) = self.file.set_len(end) {
                warn!("{}: cutting off a torn line: {cut}", self.path.display());
            }
            return Err(e.into());
        }
        Ok(())
    }
}

/// [`LineLog::open`] for an optional path.
pub fn open(path: &Option<PathBuf>, what: &'static str) -> anyhow::Result<Option<LineLog>> {
    path.as_deref().map(|p| LineLog::open(p, what)).transpose()
}

pub fn append(log: &mut Option<LineLog>, line: &str, metrics: &Metrics) {
    if let Some(l) = log {
        l.append(line, metrics);
    }
}
