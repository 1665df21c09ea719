//! The RoCE default traffic class of RDMA ports, through the kernel's rdma_cm configfs
//! (`/sys/kernel/config/rdma_cm/<device>/ports/<port>/default_roce_tos`, Linux 5.2+): the TOS
//! byte RDMA-CM QPs get unless the application sets one. NCCL creates its QPs with verbs and
//! takes its class from NCCL_IB_TC (the env file); this covers everything else on the port.
//! Originals (and the device directories we had to create) are kept crash-safe in a state file
//! the way the sysctls' are (`crash_state`): put back on restore or, after a crash, at the next
//! start; a class someone else changed (neither ours nor the original) is theirs.

use std::{
    collections::BTreeMap,
    fs, io,
    path::{Path, PathBuf},
};

use tracing::{info, warn};

use crate::actuate::crash_state::{CrashState, StateError};

/// Where the kernel exposes rdma_cm's configfs.
pub const CONFIGFS_ROOT: &str = "/sys/kernel/config/rdma_cm";
/// Where the originals are kept while linkpilot manages them.
pub const DEFAULT_STATE: &str = "/run/linkpilot/roce-tc-originals.json";

#[derive(Debug, thiserror::Error)]
pub enum RoceTcError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path}: not a TOS value: {value:?}")]
    Format { path: String, value: String },
    #[error("{device:?} is not an RDMA device name")]
    Device { device: String },
    #[error(transparent)]
    State(#[from] StateError),
}

/// Traffic classes linkpilot set, and how to undo them.
pub struct RoceTc {
    root: PathBuf,
    /// Originals and created device directories, crash-safe. Keys are relative to `root`.
    state: CrashState,
    /// What we last wrote (or found as asked), per key.
    written: BTreeMap<String, u8>,
    /// Keys an administrator took over.
    released: Vec<String>,
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> RoceTcError + '_ {
    move |source| RoceTcError::Io { path: path.display().to_string(), source }
}

fn read_tos(path: &Path) -> Result<u8, RoceTcError> {
    let text = fs::read_to_string(path).map_err(io_err(path))?;
    text.trim().parse().map_err(|_| RoceTcError::Format {
        path: path.display().to_string(),
        value: text.trim().to_owned(),
    })
}

/// An RDMA device name as one path component: `mlx5_0`, `rxe0`, `irdma-1.2`.
fn device_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s != "."
        && s != ".."
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
}

fn key(device: &str, port: u32) -> String {
    format!("{device}/ports/{port}/default_roce_tos")
}

/// A state-file key: a device directory or a port's class under the root, nothing else.
fn managed_key(k: &str) -> Result<(), String> {
    let ok = match k.split('/').collect::<Vec<_>>().as_slice() {
        [device] => device_name(device),
        [device, "ports", port, "default_roce_tos"] => {
            device_name(device) && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err("neither DEVICE nor DEVICE/ports/N/default_roce_tos".to_owned())
    }
}

impl RoceTc {
    /// Opens rdma_cm's configfs at `root` with originals kept in `state`. If a state file is
    /// left from a run that died, its originals are restored first; a file naming anything but
    /// a port's class or a device directory is refused, with nothing changed.
    pub fn open(root: &Path, state: &Path) -> Result<Self, RoceTcError> {
        let left = state.exists();
        let mut tc = Self {
            root: root.to_owned(),
            state: CrashState::load(state, managed_key)?,
            written: BTreeMap::new(),
            released: Vec::new(),
        };
        if left {
            warn!(state = %state.display(), "a previous run left RoCE traffic classes changed; restoring them");
            tc.restore()?;
        }
        Ok(tc)
    }

    /// Sets the default TOS of `device` port `port`; returns the change, if any. A class
    /// someone else set since our last write is left alone from then on.
    pub fn set(&mut self, device: &str, port: u32, tos: u8) -> Result<Option<String>, RoceTcError> {
        if !device_name(device) {
            return Err(RoceTcError::Device { device: device.to_owned() });
        }
        let key = key(device, port);
        if self.released.contains(&key) {
            return Ok(None);
        }
        let dir = self.root.join(device);
        let create = !dir.exists();
        if create {
            // Saved first: a crash right after the mkdir must not leave it unknown.
            self.state.created(device)?;
            if let Err(e) = fs::create_dir(&dir) {
                self.state.uncreated(device)?;
                return Err(io_err(&dir)(e));
            }
        }
        let file = self.root.join(&key);
        let now = match read_tos(&file) {
            Ok(v) => v,
            Err(e) => {
                if create {
                    let _ = fs::remove_dir(&dir).or_else(|_| fs::remove_dir_all(&dir));
                    self.state.uncreated(device)?;
                }
                return Err(e);
            }
        };
        let original = self.state.original(&key).and_then(|o| o.parse::<u8>().ok());
        if self.written.get(&key).is_some_and(|w| *w != now) && original != Some(now) {
            warn!(device, port, now, "RoCE default TOS changed by someone else; no longer managed");
            self.written.remove(&key);
            self.released.push(key.clone());
            self.state.forget(&key)?;
            return Ok(None);
        }
        if now == tos {
            self.written.insert(key, tos);
            return Ok(None);
        }
        self.state.before_write(&key, &now.to_string(), &tos.to_string())?;
        fs::write(&file, tos.to_string()).map_err(io_err(&file))?;
        let back = read_tos(&file)?;
        self.state.after_write(&key, &back.to_string())?;
        self.written.insert(key, back);
        info!(device, port, from = now, to = back, "RoCE default TOS set");
        Ok(Some(format!("{device}/{port} default_roce_tos {now} -> {back}")))
    }

    /// Puts every original back (those still ours) and removes the directories we created. A
    /// failure does not stop the rest; what failed stays in the state file for another try, and
    /// the first error is returned.
    pub fn restore(&mut self) -> Result<(), RoceTcError> {
        let root = self.root.clone();
        let r = self.state.restore(
            |key| match read_tos(&root.join(key)) {
                Ok(v) => Ok(Some(v.to_string())),
                Err(RoceTcError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                    Ok(None)
                }
                Err(e) => Err(e),
            },
            |key, value| {
                let file = root.join(key);
                fs::write(&file, value).map_err(io_err(&file))
            },
        );
        for (key, value) in &r.restored {
            info!(file = %key, to = %value, "RoCE default TOS restored");
        }
        for key in &r.gone {
            warn!(file = %key, "RoCE port gone; nothing to restore");
        }
        for key in r.released {
            warn!(file = %key, "RoCE default TOS changed by someone else; left as it is");
            self.released.push(key);
        }
        let mut first = r.error;
        // configfs removes the subtree it made with the directory.
        for device in self.state.take_created() {
            let dir = root.join(&device);
            match fs::remove_dir(&dir).or_else(|_| fs::remove_dir_all(&dir)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    first.get_or_insert(io_err(&dir)(e));
                    self.state.keep_created(device);
                }
            }
        }
        self.written.clear();
        self.state.finish()?;
        first.map_or(Ok(()), Err)
    }

    /// Port classes (`DEVICE/ports/N/default_roce_tos`) an administrator took over.
    pub fn released(&self) -> &[String] {
        &self.released
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An rdma_cm configfs look-alike where mlx5_0 was already configured (TOS 0 on port 1),
    /// and the state file's path beside it; both go with the returned directory.
    fn tree(name: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::Builder::new().prefix(&format!("lp-rocetc-{name}-")).tempdir().unwrap();
        let root = dir.path().join("rdma_cm");
        let port = root.join("mlx5_0/ports/1");
        fs::create_dir_all(&port).unwrap();
        fs::write(port.join("default_roce_tos"), "0\n").unwrap();
        let state = dir.path().join("roce-tc.json");
        (dir, root, state)
    }

    fn tos(root: &Path) -> u8 {
        read_tos(&root.join("mlx5_0/ports/1/default_roce_tos")).unwrap()
    }

    #[test]
    fn set_and_restore() {
        let (_dir, root, state) = tree("set");
        let mut tc = RoceTc::open(&root, &state).unwrap();
        let change = tc.set("mlx5_0", 1, 106).unwrap();
        assert_eq!(change.as_deref(), Some("mlx5_0/1 default_roce_tos 0 -> 106"));
        assert_eq!(tos(&root), 106);
        assert!(state.exists(), "the original saved before the write");
        assert_eq!(tc.set("mlx5_0", 1, 106).unwrap(), None, "no change the second time");
        tc.set("mlx5_0", 1, 184).unwrap();
        tc.restore().unwrap();
        assert_eq!(tos(&root), 0);
        assert!(root.join("mlx5_0").exists(), "a directory we did not create stays");
        assert!(!state.exists());
    }

    #[test]
    fn errors_name_the_file_and_change_nothing() {
        let (_dir, root, state) = tree("err");
        fs::write(root.join("mlx5_0/ports/1/default_roce_tos"), "lots\n").unwrap();
        let mut tc = RoceTc::open(&root, &state).unwrap();
        let err = tc.set("mlx5_0", 1, 106).unwrap_err().to_string();
        assert!(err.contains("default_roce_tos") && err.contains("not a TOS"), "{err}");
        let file = root.join("mlx5_0/ports/1/default_roce_tos");
        assert_eq!(fs::read_to_string(&file).unwrap(), "lots\n", "left as it was");
        // A device configfs does not know: the directory made to ask is removed at once.
        let err = tc.set("mlx5_9", 1, 106).unwrap_err().to_string();
        assert!(err.contains("mlx5_9/ports/1/default_roce_tos"), "{err}");
        assert!(!root.join("mlx5_9").exists());
        assert!(!state.exists(), "nothing to remember");
        let err = tc.set("../x", 1, 106).unwrap_err().to_string();
        assert!(err.contains("not an RDMA device name"), "{err}");
    }

    #[test]
    fn a_crashed_runs_classes_are_restored_at_the_next_start() {
        let (_dir, root, state) = tree("crash");
        let mut tc = RoceTc::open(&root, &state).unwrap();
        tc.set("mlx5_0", 1, 106).unwrap();
        tc.set("mlx5_0", 1, 184).unwrap();
        std::mem::forget(tc); // SIGKILL: no restore
                              // The next start finds our value in place and the true original in the file.
        let mut tc = RoceTc::open(&root, &state).unwrap();
        assert_eq!(tos(&root), 0, "the original from before the first run");
        assert!(!state.exists());
        tc.set("mlx5_0", 1, 106).unwrap();
        tc.restore().unwrap();
        assert_eq!(tos(&root), 0);
    }

    #[test]
    fn an_administrators_class_is_left_alone() {
        let (_dir, root, state) = tree("admin");
        let file = root.join("mlx5_0/ports/1/default_roce_tos");
        // Changed between our write and the stop.
        let mut tc = RoceTc::open(&root, &state).unwrap();
        tc.set("mlx5_0", 1, 106).unwrap();
        fs::write(&file, "184\n").unwrap();
        tc.restore().unwrap();
        assert_eq!(tos(&root), 184, "not our original 0");
        assert_eq!(tc.released(), ["mlx5_0/ports/1/default_roce_tos"]);
        // Changed before our next write: not overwritten, not restored.
        fs::write(&file, "0\n").unwrap();
        let mut tc = RoceTc::open(&root, &state).unwrap();
        tc.set("mlx5_0", 1, 106).unwrap();
        fs::write(&file, "32\n").unwrap();
        assert_eq!(tc.set("mlx5_0", 1, 42).unwrap(), None);
        assert_eq!(tos(&root), 32);
        tc.restore().unwrap();
        assert_eq!(tos(&root), 32);
        // Changed while a killed run was gone.
        fs::write(&file, "0\n").unwrap();
        let mut tc = RoceTc::open(&root, &state).unwrap();
        tc.set("mlx5_0", 1, 106).unwrap();
        std::mem::forget(tc);
        fs::write(&file, "8\n").unwrap();
        let tc = RoceTc::open(&root, &state).unwrap();
        assert_eq!((tos(&root), tc.released().len()), (8, 1));
        assert!(!state.exists());
    }

    #[test]
    fn a_state_file_is_checked_before_anything_is_touched() {
        let (_dir, root, state) = tree("keys");
        let outside = root.parent().unwrap().join("outside");
        fs::create_dir_all(&outside).unwrap();
        for key in [
            "../outside",
            "/etc",
            "mlx5_0/ports/1/../../../outside",
            "mlx5_0/ports/x/default_roce_tos",
        ] {
            let text = serde_json::json!({
                "values": { "mlx5_0/ports/1/default_roce_tos": "5" },
                "created": [key],
            });
            fs::write(&state, text.to_string()).unwrap();
            let err = RoceTc::open(&root, &state).err().expect("refused").to_string();
            assert!(err.contains("roce-tc.json") && err.contains(&format!("{key:?}")), "{err}");
            assert_eq!(tos(&root), 0, "nothing restored");
            assert!(outside.exists() && Path::new("/etc").exists());
        }
        // A directory a killed run created is removed at the next start.
        fs::create_dir_all(root.join("mlx5_7/ports/1")).unwrap();
        fs::write(&state, r#"{"values": {}, "created": ["mlx5_7"]}"#).unwrap();
        RoceTc::open(&root, &state).unwrap();
        assert!(!root.join("mlx5_7").exists() && !state.exists());
    }
}
