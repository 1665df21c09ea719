//! Crash-safe originals of what linkpilot changes outside itself (sysctls, RoCE traffic
//! classes): a JSON state file written (atomically) before each change, holding each key's value
//! before our first change and the values of ours that may be in place. A clean stop restores
//! and removes the file; a run that dies leaves it, and the next start restores from it. A key
//! whose value is neither ours nor its original was changed by someone else: it is theirs, left
//! as it is and forgotten ("released").

use std::{
    collections::BTreeMap,
    fs, io,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::actuate::envfile::write_atomic;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path}: {source}")]
    Json { path: String, source: serde_json::Error },
    #[error(
        "{path}: key {key:?} is not one linkpilot manages ({why}); nothing was changed: check \
         the file and remove it"
    )]
    Key { path: String, key: String, why: String },
}

/// The file's contents. `values` alone is the format of earlier versions (sysctls only).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Saved {
    /// Each key's value before our first change.
    values: BTreeMap<String, String>,
    /// Values of ours that may be in place at each key: the last one written and, while a write
    /// is under way, the one being written (a crash can come between the two).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    ours: BTreeMap<String, Vec<String>>,
    /// Directories we created (removed on restore, after the values).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    created: Vec<String>,
}

/// What a restore did.
pub struct Restored<E> {
    /// (key, original) put back.
    pub restored: Vec<(String, String)>,
    /// Keys someone else changed: left as they are.
    pub released: Vec<String>,
    /// Keys no longer there (nothing to restore).
    pub gone: Vec<String>,
    /// The first failure; what failed stays in the file for the next start.
    pub error: Option<E>,
}

/// The originals of one kind of setting, kept in one state file.
pub struct CrashState {
    path: PathBuf,
    saved: Saved,
}

impl CrashState {
    /// Loads `path` (absent: nothing saved). Every key must pass `check` (which returns why
    /// not): a key from a file is a path under a root we write to, so an unexpected one
    /// (absolute, `..`) is refused before anything is touched.
    pub fn load(
        path: &Path,
        check: impl Fn(&str) -> Result<(), String>,
    ) -> Result<Self, StateError> {
        let p = || path.display().to_string();
        // Not through a symlink: what the file holds is written back to the system.
        let text = crate::actuate::files::open_nofollow(path, fs::OpenOptions::new().read(true))
            .and_then(|mut f| {
                let mut text = String::new();
                io::Read::read_to_string(&mut f, &mut text).map(|_| text)
            });
        let saved: Saved = match text {
            Ok(text) => serde_json::from_str(&text)
                .map_err(|source| StateError::Json { path: p(), source })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Saved::default(),
            Err(source) => return Err(StateError::Io { path: p(), source }),
        };
        let keys = saved.values.keys().chain(saved.ours.keys()).chain(&saved.created);
        for key in keys {
            check(key).map_err(|why| StateError::Key { path: p(), key: key.clone(), why })?;
        }
        Ok(Self { path: path.to_owned(), saved })
    }

    /// Nothing to restore.
    pub fn is_empty(&self) -> bool {
        self.saved.values.is_empty() && self.saved.created.is_empty()
    }

    /// `key`'s value before our first change, while we manage it.
    pub fn original(&self, key: &str) -> Option<&str> {
        self.saved.values.get(key).map(String::as_str)
    }

    /// Before writing `next` over `now` at `key` (checked by the caller to be ours or the
    /// original): `now` becomes the original if this is our first change, and both are saved as
    /// possibly ours, in the file before this returns.
    pub fn before_write(&mut self, key: &str, now: &str, next: &str) -> Result<(), StateError> {
        self.saved.values.entry(key.to_owned()).or_insert_with(|| now.to_owned());
        let mut ours = vec![now.to_owned()];
        if next != now {
            ours.push(next.to_owned());
        }
        self.saved.ours.insert(key.to_owned(), ours);
        self.save()
    }

    /// After a write that read back as `value`: the one value of ours in place.
    pub fn after_write(&mut self, key: &str, value: &str) -> Result<(), StateError> {
        if self.saved.ours.get(key).is_some_and(|o| o.len() == 1 && o[0] == value) {
            return Ok(());
        }
        self.saved.ours.insert(key.to_owned(), vec![value.to_owned()]);
        self.save()
    }

    /// No longer ours to restore (given back, or put back by the caller).
    pub fn forget(&mut self, key: &str) -> Result<(), StateError> {
        let had = self.saved.values.remove(key).is_some();
        if self.saved.ours.remove(key).is_some() || had {
            self.save()?;
        }
        Ok(())
    }

    /// Before creating directory `dir`: saved, so that a crash cannot leave it unknown.
    pub fn created(&mut self, dir: &str) -> Result<(), StateError> {
        if !self.saved.created.iter().any(|d| d == dir) {
            self.saved.created.push(dir.to_owned());
            self.save()?;
        }
        Ok(())
    }

    /// A created directory removed again (or never made).
    pub fn uncreated(&mut self, dir: &str) -> Result<(), StateError> {
        let before = self.saved.created.len();
        self.saved.created.retain(|d| d != dir);
        if self.saved.created.len() != before {
            self.save()?;
        }
        Ok(())
    }

    /// The directories to remove on restore, newest first; what is not handed back with
    /// [`Self::keep_created`] counts as removed.
    pub fn take_created(&mut self) -> Vec<String> {
        let mut dirs = std::mem::take(&mut self.saved.created);
        dirs.reverse();
        dirs
    }

    pub fn keep_created(&mut self, dir: String) {
        self.saved.created.insert(0, dir);
    }

    /// Puts every original back through `read` (`None`: the key is gone) and `write`, except
    /// where the value now is neither ours nor the original (someone else's: released). Every
    /// key is tried; what failed stays. Call [`Self::finish`] after.
    pub fn restore<E>(
        &mut self,
        mut read: impl FnMut(&str) -> Result<Option<String>, E>,
        mut write: impl FnMut(&str, &str) -> Result<(), E>,
    ) -> Restored<E> {
        let mut r =
            Restored { restored: Vec::new(), released: Vec::new(), gone: Vec::new(), error: None };
        let values = std::mem::take(&mut self.saved.values);
        let mut ours = std::mem::take(&mut self.saved.ours);
        for (key, original) in values {
            let now = match read(&key) {
                Ok(Some(v)) => v,
                Ok(None) => {
                    r.gone.push(key);
                    continue;
                }
                Err(e) => {
                    r.error.get_or_insert(e);
                    self.keep(key, original, &mut ours);
                    continue;
                }
            };
            if now == original {
                continue;
            }
            // A file of an earlier version says nothing of ours: restore as it did.
            if ours.get(&key).is_some_and(|o| !o.contains(&now)) {
                r.released.push(key);
                continue;
            }
            match write(&key, &original) {
                Ok(()) => r.restored.push((key, original)),
                Err(e) => {
                    r.error.get_or_insert(e);
                    self.keep(key, original, &mut ours);
                }
            }
        }
        r
    }

    fn keep(&mut self, key: String, original: String, ours: &mut BTreeMap<String, Vec<String>>) {
        if let Some(o) = ours.remove(&key) {
            self.saved.ours.insert(key.clone(), o);
        }
        self.saved.values.insert(key, original);
    }

    /// After a restore: removes the file when nothing is left to restore, else saves what is.
    pub fn finish(&mut self) -> Result<(), StateError> {
        if self.is_empty() {
            self.saved = Saved::default();
        }
        self.save()
    }

    /// Writes the file; with nothing to restore, there is no file.
    fn save(&self) -> Result<(), StateError> {
        let path = || self.path.display().to_string();
        if self.saved == Saved::default() {
            return match fs::remove_file(&self.path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    Err(StateError::Io { path: path(), source: e })
                }
                _ => Ok(()),
            };
        }
        let text = serde_json::to_string_pretty(&self.saved)
            .map_err(|source| StateError::Json { path: path(), source })?;
        write_atomic(&self.path, &text).map_err(|source| StateError::Io { path: path(), source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// A state file's path in a directory of its own, which goes with the returned guard.
    fn temp(name: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::Builder::new().prefix(&format!("lp-crash-{name}-")).tempdir().unwrap();
        let path = dir.path().join("state.json");
        (dir, path)
    }

    fn any(_: &str) -> Result<(), String> {
        Ok(())
    }

    /// Restores against an in-memory map of current values.
    fn restore(s: &mut CrashState, now: &RefCell<BTreeMap<String, String>>) -> Restored<String> {
        s.restore(
            |k| Ok::<_, String>(now.borrow().get(k).cloned()),
            |k, v| {
                now.borrow_mut().insert(k.to_owned(), v.to_owned());
                Ok(())
            },
        )
    }

    #[test]
    fn saved_before_each_write_and_restored_from_the_file_after_a_crash() {
        let (_dir, path) = temp("crash");
        let mut s = CrashState::load(&path, any).unwrap();
        s.before_write("a", "1", "5").unwrap();
        s.after_write("a", "5").unwrap();
        s.before_write("a", "5", "9").unwrap();
        // Killed before the write of 9 happened: 5 is still in place, and still ours.
        drop(s);
        let now = RefCell::new(BTreeMap::from([("a".to_owned(), "5".to_owned())]));
        let mut s = CrashState::load(&path, any).unwrap();
        let r = restore(&mut s, &now);
        assert_eq!(r.restored, [("a".to_owned(), "1".to_owned())], "the first original");
        s.finish().unwrap();
        assert!(!path.exists());
    }

    #[test]
    fn a_value_neither_ours_nor_the_original_is_left_alone() {
        let (_dir, path) = temp("admin");
        let mut s = CrashState::load(&path, any).unwrap();
        for (k, orig) in [("a", "1"), ("b", "1"), ("c", "1")] {
            s.before_write(k, orig, "5").unwrap();
            s.after_write(k, "5").unwrap();
        }
        // a: ours; b: an administrator's 7; c: already back to the original.
        let now = RefCell::new(BTreeMap::from(
            [("a", "5"), ("b", "7"), ("c", "1")].map(|(k, v)| (k.to_owned(), v.to_owned())),
        ));
        let mut s = CrashState::load(&path, any).unwrap();
        let r = restore(&mut s, &now);
        assert_eq!(r.restored, [("a".to_owned(), "1".to_owned())]);
        assert_eq!(r.released, ["b"]);
        assert_eq!(now.borrow()["b"], "7");
        s.finish().unwrap();
        assert!(!path.exists());
    }

    #[test]
    fn failures_stay_for_the_next_start() {
        let (_dir, path) = temp("fail");
        let mut s = CrashState::load(&path, any).unwrap();
        s.before_write("a", "1", "5").unwrap();
        s.before_write("b", "2", "6").unwrap();
        s.created("dev").unwrap();
        let r = s.restore(
            |k| Ok(Some(if k == "a" { "5" } else { "6" }.to_owned())),
            |k, _| if k == "a" { Err("no") } else { Ok(()) },
        );
        assert_eq!(r.error, Some("no"));
        s.finish().unwrap();
        let s = CrashState::load(&path, any).unwrap();
        assert_eq!((s.original("a"), s.original("b")), (Some("1"), None));
        assert_eq!(s.saved.ours["a"], ["1", "5"]);
        assert_eq!(s.saved.created, ["dev"]);
    }

    #[test]
    fn earlier_files_still_restore_and_unexpected_keys_are_refused() {
        let (_dir, path) = temp("keys");
        fs::write(&path, r#"{"values": {"a": "1"}}"#).unwrap();
        let mut s = CrashState::load(&path, any).unwrap();
        let now = RefCell::new(BTreeMap::from([("a".to_owned(), "3".to_owned())]));
        assert_eq!(restore(&mut s, &now).restored.len(), 1);
        let only_a = |k: &str| if k == "a" { Ok(()) } else { Err("not a".to_owned()) };
        fs::write(&path, r#"{"values": {"a": "1", "../../etc/x": "y"}}"#).unwrap();
        let err = CrashState::load(&path, only_a).err().unwrap().to_string();
        assert!(err.contains("state.json") && err.contains("\"../../etc/x\""), "{err}");
        fs::write(&path, r#"{"values": {}, "created": ["/"]}"#).unwrap();
        let err = CrashState::load(&path, only_a).err().unwrap().to_string();
        assert!(err.contains("key \"/\" is not one linkpilot manages (not a)"), "{err}");
    }
}
