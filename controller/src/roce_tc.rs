//! The RoCE default traffic class of RDMA ports, through the kernel's rdma_cm configfs
//! (`/sys/kernel/config/rdma_cm/<device>/ports/<port>/default_roce_tos`, Linux 5.2+): the TOS
//! byte RDMA-CM QPs get unless the application sets one. NCCL creates its QPs with verbs and
//! takes its class from NCCL_IB_TC (the env file); this covers everything else on the port.
//! Originals are put back on restore; a device directory we had to create is removed again.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use tracing::info;

/// Where the kernel exposes rdma_cm's configfs.
pub const CONFIGFS_ROOT: &str = "/sys/kernel/config/rdma_cm";

#[derive(Debug, thiserror::Error)]
pub enum RoceTcError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path}: not a TOS value: {value:?}")]
    Format { path: String, value: String },
}

/// Traffic classes linkpilot set, and how to undo them.
pub struct RoceTc {
    root: PathBuf,
    /// (file, value before our first write).
    originals: Vec<(PathBuf, u8)>,
    /// Device directories mkdir'ed here (configfs shows a device only once asked for).
    created: Vec<PathBuf>,
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

impl RoceTc {
    pub fn new(root: &Path) -> Self {
        Self { root: root.to_owned(), originals: Vec::new(), created: Vec::new() }
    }

    /// Sets the default TOS of `device` port `port`; returns the change, if any.
    pub fn set(&mut self, device: &str, port: u32, tos: u8) -> Result<Option<String>, RoceTcError> {
        let dir = self.root.join(device);
        let create = !dir.exists();
        if create {
            fs::create_dir(&dir).map_err(io_err(&dir))?;
        }
        let file = dir.join("ports").join(port.to_string()).join("default_roce_tos");
        let now = match read_tos(&file) {
            Ok(v) => v,
            Err(e) => {
                if create {
                    let _ = fs::remove_dir(&dir).or_else(|_| fs::remove_dir_all(&dir));
                }
                return Err(e);
            }
        };
        if create {
            self.created.push(dir.clone());
        }
        if now == tos {
            return Ok(None);
        }
        if !self.originals.iter().any(|(f, _)| *f == file) {
            self.originals.push((file.clone(), now));
        }
        fs::write(&file, tos.to_string()).map_err(io_err(&file))?;
        info!(device, port, from = now, to = tos, "RoCE default TOS set");
        Ok(Some(format!("{device}/{port} default_roce_tos {now} -> {tos}")))
    }

    /// Puts every original back and removes the directories we created. A failure does not
    /// stop the rest; what failed is kept for another try, and the first error returned.
    pub fn restore(&mut self) -> Result<(), RoceTcError> {
        let mut first = None;
        self.originals.retain(|(file, value)| match fs::write(file, value.to_string()) {
            Ok(()) => false,
            Err(e) => {
                first.get_or_insert(io_err(file)(e));
                true
            }
        });
        let mut created = std::mem::take(&mut self.created);
        created.reverse();
        // configfs removes the subtree it made with the directory.
        created.retain(|dir| match fs::remove_dir(dir).or_else(|_| fs::remove_dir_all(dir)) {
            Ok(()) => false,
            Err(e) => {
                first.get_or_insert(io_err(dir)(e));
                true
            }
        });
        created.reverse();
        self.created = created;
        first.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An rdma_cm configfs look-alike where mlx5_0 was already configured (TOS 0 on port 1).
    fn tree(name: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("lp-rocetc-{}-{name}", std::process::id()));
        let port = root.join("mlx5_0/ports/1");
        fs::create_dir_all(&port).unwrap();
        fs::write(port.join("default_roce_tos"), "0\n").unwrap();
        root
    }

    #[test]
    fn set_and_restore() {
        let root = tree("set");
        let mut tc = RoceTc::new(&root);
        let change = tc.set("mlx5_0", 1, 106).unwrap();
        assert_eq!(change.as_deref(), Some("mlx5_0/1 default_roce_tos 0 -> 106"));
        assert_eq!(read_tos(&root.join("mlx5_0/ports/1/default_roce_tos")).unwrap(), 106);
        assert_eq!(tc.set("mlx5_0", 1, 106).unwrap(), None, "no change the second time");
        tc.set("mlx5_0", 1, 184).unwrap();
        tc.restore().unwrap();
        assert_eq!(read_tos(&root.join("mlx5_0/ports/1/default_roce_tos")).unwrap(), 0);
        assert!(root.join("mlx5_0").exists(), "a directory we did not create stays");
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn errors_name_the_file_and_change_nothing() {
        let root = tree("err");
        fs::write(root.join("mlx5_0/ports/1/default_roce_tos"), "lots\n").unwrap();
        let mut tc = RoceTc::new(&root);
        let err = tc.set("mlx5_0", 1, 106).unwrap_err().to_string();
        assert!(err.contains("default_roce_tos") && err.contains("not a TOS"), "{err}");
        let tos = root.join("mlx5_0/ports/1/default_roce_tos");
        assert_eq!(fs::read_to_string(&tos).unwrap(), "lots\n", "left as it was");
        // A device configfs does not know: the directory made to ask is removed at once.
        let err = tc.set("mlx5_9", 1, 106).unwrap_err().to_string();
        assert!(err.contains("mlx5_9/ports/1/default_roce_tos"), "{err}");
        assert!(!root.join("mlx5_9").exists());
        let _ = fs::remove_dir_all(&root);
    }
}
