//! Files the daemon writes as root, possibly in directories others can write to: temporary
//! files get unpredictable names and are created exclusively (O_EXCL: nothing planted at the
//! name is followed), and files opened in place refuse to follow a symbolic link.

use std::{
    fs, io,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::Path,
};

/// A new temporary file next to `path` (`.NAME.XXXXXX.tmp`), mode 0644 before the umask (the
/// board and env file are read by training processes), to be persisted over `path`: a rename,
/// which replaces a symlink at `path` instead of writing through it.
pub fn temp_beside(path: &Path) -> io::Result<tempfile::NamedTempFile> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("linkpilot");
    tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .permissions(fs::Permissions::from_mode(0o644))
        .tempfile_in(dir)
}

/// Opens `path` with `options`, refusing a symbolic link there with an error that says so.
pub fn open_nofollow(path: &Path, options: &mut fs::OpenOptions) -> io::Result<fs::File> {
    options.custom_flags(libc::O_NOFOLLOW).open(path).map_err(|e| {
        if e.raw_os_error() == Some(libc::ELOOP) {
            io::Error::other(format!(
                "{} is a symbolic link; refusing to follow it (remove it, or pass another path)",
                path.display()
            ))
        } else {
            e
        }
    })
}

/// What a hostile user plants where the daemon writes: a file `target` in `dir` holding
/// "precious" and a symbolic link to it at `name`. Returns (target, link).
#[cfg(test)]
pub(crate) fn planted_symlink(dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let target = dir.join("target");
    fs::write(&target, "precious").unwrap();
    let link = dir.join(name);
    std::os::unix::fs::symlink(&target, &link).unwrap();
    (target, link)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinks_are_refused_and_temporary_names_are_fresh() {
        let dir = tempfile::tempdir().unwrap();
        let (target, link) = planted_symlink(dir.path(), "link");
        let e = open_nofollow(&link, fs::OpenOptions::new().write(true).truncate(true))
            .unwrap_err()
            .to_string();
        assert!(e.contains("link is a symbolic link; refusing to follow it"), "{e}");
        assert_eq!(fs::read_to_string(&target).unwrap(), "precious");
        let (a, b) = (temp_beside(&link).unwrap(), temp_beside(&link).unwrap());
        assert_ne!(a.path(), b.path());
        assert!(a.path().file_name().unwrap().to_str().unwrap().starts_with(".link."));
    }

    /// What each writer of ours does with a symlink planted where it writes: the old fixed
    /// temporary names (`.nccl.env.tmp`, `knobs.tmp`) and the sysctl state file.
    #[test]
    fn writers_never_write_through_a_planted_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let precious = dir.path().join("precious");
        fs::write(&precious, "precious").unwrap();
        for name in [".nccl.env.tmp", "knobs.tmp", "sysctl.json"] {
            std::os::unix::fs::symlink(&precious, dir.path().join(name)).unwrap();
        }
        let env = dir.path().join("nccl.env");
        crate::actuate::envfile::write_atomic(&env, "A=1\n").unwrap();
        let board = dir.path().join("knobs");
        crate::board::BoardWriter::create(&board, std::time::Duration::from_secs(1), 1).unwrap();
        let e = crate::actuate::sysctl::Sysctls::open(dir.path(), &dir.path().join("sysctl.json"))
            .err()
            .expect("a symlinked state file is refused")
            .to_string();
        assert!(e.contains("sysctl.json is a symbolic link; refusing to follow it"), "{e}");
        assert_eq!(fs::read_to_string(&precious).unwrap(), "precious");
        assert_eq!(fs::read_to_string(&env).unwrap(), "A=1\n");
        assert_eq!(
            fs::metadata(&board).unwrap().len() as usize,
            std::mem::size_of::<linkpilot_common::board::Board>()
        );
        // Written files are readable by training processes; no temporary file is left.
        assert_eq!(fs::metadata(&env).unwrap().permissions().mode() & 0o444, 0o444);
        let left: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| {
                n.ends_with(".tmp") && ![".nccl.env.tmp", "knobs.tmp"].contains(&n.as_str())
            })
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
