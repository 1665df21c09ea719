//! A directory laid out as kubelet mounts a ConfigMap volume, and its atomic update:
//!
//! ```text
//! DIR/..2026_01_01_00_00_00.1/policy.toml   the files of one version
//! DIR/..data -> ..2026_01_01_00_00_00.1     swapped by renaming a new link over it
//! DIR/policy.toml -> ..data/policy.toml     what the pod opens; never changes itself
//! ```
//!
//! An update writes the new version's directory, points `..data_tmp` at it, renames
//! `..data_tmp` over `..data` (one atomic step) and removes the old version, as kubelet's
//! AtomicWriter does.

use std::{
    os::unix::fs::symlink,
    path::{Path, PathBuf},
};

pub struct ConfigMapDir {
    pub dir: PathBuf,
    version: u32,
}

impl ConfigMapDir {
    /// Creates `dir` holding `files` (name, contents) as version 1.
    pub fn create(dir: &Path, files: &[(&str, &str)]) -> Self {
        std::fs::create_dir_all(dir).expect("ConfigMap dir");
        let mut cm = Self { dir: dir.to_owned(), version: 0 };
        cm.update(files);
        for (name, _) in files {
            symlink(Path::new("..data").join(name), dir.join(name)).expect("file link");
        }
        cm
    }

    fn version_dir(&self, version: u32) -> PathBuf {
        self.dir.join(format!("..2026_01_01_00_00_00.{version}"))
    }

    /// Publishes `files` as the next version, the way kubelet does.
    pub fn update(&mut self, files: &[(&str, &str)]) {
        let next = self.version_dir(self.version + 1);
        std::fs::create_dir_all(&next).expect("version dir");
        for (name, contents) in files {
            std::fs::write(next.join(name), contents).expect("ConfigMap file");
        }
        let tmp = self.dir.join("..data_tmp");
        symlink(next.file_name().expect("name"), &tmp).expect("..data_tmp");
        std::fs::rename(&tmp, self.dir.join("..data")).expect("swapping ..data");
        if self.version > 0 {
            std::fs::remove_dir_all(self.version_dir(self.version)).expect("old version");
        }
        self.version += 1;
    }
}
