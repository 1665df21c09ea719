//! Noticing that the policy file changed: its (device, inode, size, mtime) checked about once a
//! second, which also catches editors that write a new file and rename it over the old one
//! (inotify on the file would lose track of it then). SIGHUP forces a reload either way.

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fingerprint {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

fn fingerprint(path: &Path) -> Option<Fingerprint> {
    let m = std::fs::metadata(path).ok()?;
    Some(Fingerprint {
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
        mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
    })
}

pub struct PolicyWatch {
    path: PathBuf,
    seen: Option<Fingerprint>,
    last_check: Instant,
    every: Duration,
}

impl PolicyWatch {
    /// Starts from the file as it is now (the caller has just loaded it).
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            seen: fingerprint(path),
            last_check: Instant::now(),
            every: Duration::from_secs(1),
        }
    }

    /// Whether the file changed since the last call that said so (checked at most once per
    /// second). A file that disappears is not a change: the running policy stays.
    pub fn changed(&mut self) -> bool {
        if self.last_check.elapsed() < self.every {
            return false;
        }
        self.last_check = Instant::now();
        match fingerprint(&self.path) {
            Some(f) if Some(f) != self.seen => {
                self.seen = Some(f);
                true
            }
            _ => false,
        }
    }

    /// Records the file as it is now (after a SIGHUP reload).
    pub fn mark_seen(&mut self) {
        self.seen = fingerprint(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_writes_and_renames_not_absence() {
        let dir = std::env::temp_dir().join(format!("lp-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("policy.toml");
        std::fs::write(&p, "a").unwrap();
        let mut w = PolicyWatch::new(&p);
        w.every = Duration::ZERO;
        assert!(!w.changed());
        std::fs::write(&p, "ab").unwrap();
        assert!(w.changed());
        assert!(!w.changed(), "reported once");
        let tmp = dir.join("policy.toml.new");
        std::fs::write(&tmp, "ab").unwrap();
        std::fs::rename(&tmp, &p).unwrap();
        assert!(w.changed(), "a rename over the file is a change");
        std::fs::remove_file(&p).unwrap();
        assert!(!w.changed(), "a missing file keeps the running policy");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
