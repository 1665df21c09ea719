//! Noticing that the policy file changed: its content read and compared about once a second,
//! which also catches editors that write a new file and rename it over the old one (inotify on
//! the file would lose track of it then). SIGHUP forces a reload either way.
//!
//! The content, not its metadata: two writes within one tick of the kernel's coarse clock can
//! leave size and mtime the same, and a daemon comparing those would miss the last one for good.
//! The bytes compared are the bytes loaded, so a file rewritten between the check and the load
//! cannot leave the daemon running a version it then believes seen.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_writes_and_renames_not_absence() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("policy.toml");
        std::fs::write(&p, "a").unwrap();
        let mut w = PolicyWatch::new(&p, b"a".to_vec());
        w.every = Duration::ZERO;
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
        let p = dir.path().join("policy.toml");
        std::fs::write(&p, "tick = \"100ms\"").unwrap();
        let mut w = PolicyWatch::new(&p, b"tick = \"100ms\"".to_vec());
        w.every = Duration::ZERO;
        let mtime = std::fs::metadata(&p).unwrap().modified().unwrap();
        std::fs::write(&p, "tick = \"200ms\"").unwrap();
        std::fs::File::options().write(true).open(&p).unwrap().set_modified(mtime).unwrap();
        assert_eq!(w.changed().as_deref(), Some(&b"tick = \"200ms\""[..]));
    }
}
