//! RDMA fixtures for machines without RDMA hardware: the recorded sysfs tree of a ConnectX NIC
//! (controller/tests/fixtures/sysfs-infiniband) with its ports moved onto a lab interface, and an
//! rdma_cm configfs look-alike, so that the daemon's NIC counters and RoCE class have real files
//! to read and write.

use std::path::{Path, PathBuf};

/// The recorded sysfs tree of a ConnectX NIC (`mlx5_0`, counters included).
pub const SYSFS_FIXTURE: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../controller/tests/fixtures/sysfs-infiniband");

/// A copy of [`SYSFS_FIXTURE`] at `root` whose port 1 sits on `iface`; returns port 1's folder.
pub fn sysfs_on(root: &Path, iface: &str) -> PathBuf {
    crate::sh(&["cp", "-r", SYSFS_FIXTURE, root.to_str().expect("utf-8")]);
    let port = root.join("mlx5_0/ports/1");
    for entry in std::fs::read_dir(port.join("gid_attrs/ndevs")).expect("ndevs") {
        std::fs::write(entry.expect("entry").path(), format!("{iface}\n")).expect("ndev");
    }
    port
}

/// The sysfs copy (port 1 on an interface) and the rdma_cm configfs look-alike, in one folder.
pub struct RdmaFixture {
    pub sysfs: PathBuf,
    pub cm_root: PathBuf,
    /// Port 1's `default_roce_tos`, which the daemon sets to the state's RoCE class; starts at 0.
    pub tos: PathBuf,
}

impl RdmaFixture {
    /// Both fixtures under `dir` (`sysfs/`, `rdma_cm/`), port 1 on `iface`.
    pub fn create(dir: &Path, iface: &str) -> Self {
        let sysfs = dir.join("sysfs");
        sysfs_on(&sysfs, iface);
        let cm_root = dir.join("rdma_cm");
        let tos = cm_root.join("mlx5_0/ports/1/default_roce_tos");
        std::fs::create_dir_all(tos.parent().expect("dir")).expect("configfs fixture");
        std::fs::write(&tos, "0\n").expect("tos");
        Self { sysfs, cm_root, tos }
    }

    /// The `linkpilot run` flags that point the daemon at them.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--rdma-root".into(),
            self.sysfs.display().to_string(),
            "--rdma-cm-root".into(),
            self.cm_root.display().to_string(),
        ]
    }
}
