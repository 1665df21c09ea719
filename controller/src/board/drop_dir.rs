//! A directory where training processes of any user leave one file each for the daemon (the
//! tuner plugin's counters, the job reports): world-writable and sticky, like /tmp, so nothing
//! in it is trusted. Only regular files named `<pid>-<16 hex digits>` are read, with `read`
//! (never mapped, never through a symlink), of exactly the format's size, at most
//! [`MAX_FILES`] a scan. A file is a live process's while that process holds its `flock`: that
//! works across PID namespaces, where the pid in the name means nothing here. Writers rewrite
//! their file in place, so a read is taken twice and kept only when both agree.

use std::{
    fs,
    io::{self, Read, Seek},
    os::unix::{
        fs::{OpenOptionsExt, PermissionsExt},
        io::AsRawFd,
    },
    path::Path,
};

/// Files read at most per scan.
pub const MAX_FILES: usize = 256;

/// A file as read: a live process's bytes, or nobody's (its process is gone).
#[derive(Debug)]
pub enum Held {
    Live(Vec<u8>),
    Dead,
}

/// Reads tried before a file that changes under every read is skipped for this scan.
const READ_TRIES: usize = 3;

/// One file of exactly `size` bytes (`what` names the format in errors), or why it is not one.
pub fn read_file(path: &Path, size: usize, what: &str) -> Result<Held, String> {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| e.to_string())?;
    let meta = f.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    // Taken only if no process holds it: then the file is a dead one's. Released at once.
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        // SAFETY: as above.
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) };
        return Ok(Held::Dead);
    }
    if meta.len() != size as u64 {
        return Err(format!("not a {what} ({} bytes, one has {size})", meta.len()));
    }
    let mut last = vec![0u8; size];
    f.read_exact(&mut last).map_err(|e| e.to_string())?;
    for _ in 0..READ_TRIES {
        let mut again = vec![0u8; size];
        f.rewind().map_err(|e| e.to_string())?;
        f.read_exact(&mut again).map_err(|e| e.to_string())?;
        if again == last {
            return Ok(Held::Live(last));
        }
        last = again;
    }
    Err("rewritten during every read".into())
}

/// The pid a file's name gives: `<pid>-<16 hex digits>`.
pub fn named_pid(name: &str) -> Option<u32> {
    let (pid, tag) = name.split_once('-')?;
    (tag.len() == 16 && tag.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| pid.parse().ok())
        .flatten()
}

/// Every live file of `dir` whose bytes `parse` accepts, with its name (in directory order); `refused` is
/// told why each other file was not taken. Files of processes that are gone (a crash: a clean
/// exit removes its own) are removed when `clean` is set (the daemon owns the directory).
pub fn scan<T>(
    dir: &Path,
    clean: bool,
    size: usize,
    what: &str,
    mut parse: impl FnMut(u32, &[u8]) -> Result<T, String>,
    mut refused: impl FnMut(&str, String),
) -> Vec<(String, T)> {
    // Not through a symlink: files of dead processes are removed, as root.
    if real_dir(dir).is_err() {
        return Vec::new();
    }
    let Ok(entries) = fs::read_dir(dir) else { return Vec::new() };
    let mut out = Vec::new();
    for entry in entries.flatten().take(MAX_FILES) {
        let name = entry.file_name();
        let Some((name, pid)) = name.to_str().and_then(|n| Some((n, named_pid(n)?))) else {
            continue;
        };
        match read_file(&entry.path(), size, what) {
            Ok(Held::Live(bytes)) => match parse(pid, &bytes) {
                Ok(t) => out.push((name.to_owned(), t)),
                Err(e) => refused(name, e),
            },
            Ok(Held::Dead) if clean && entry.file_type().is_ok_and(|t| t.is_file()) => {
                let _ = fs::remove_file(entry.path());
            }
            Ok(Held::Dead) => {}
            Err(e) => refused(name, e),
        }
    }
    out
}

/// Creates the directory: world-writable and sticky (as /tmp), so training processes of every
/// user can create (and only remove) their own files. A directory that exists already keeps its
/// owner's permissions; anything else there (a symlink, a file) is refused, and [`scan`] will
/// not read it.
pub fn create_dir(dir: &Path) -> io::Result<()> {
    if let Some(parent) = dir.parent() {
        fs::create_dir_all(parent)?;
    }
    match fs::create_dir(dir) {
        // Through a descriptor of the directory just made, not its name.
        Ok(()) => fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(dir)?
            .set_permissions(fs::Permissions::from_mode(0o1777)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => real_dir(dir),
        Err(e) => Err(e),
    }
}

/// `dir` is a directory itself, not a symlink to one.
fn real_dir(dir: &Path) -> io::Result<()> {
    let t = fs::symlink_metadata(dir)?.file_type();
    if t.is_dir() {
        return Ok(());
    }
    let what = if t.is_symlink() { "a symbolic link" } else { "not a directory" };
    Err(io::Error::other(format!("{} is {what}; refusing to use it", dir.display())))
}
