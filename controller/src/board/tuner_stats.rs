//! The NCCL tuner plugin's counter files (one per training process, layout in
//! `linkpilot_common::tuner`), read for `linkpilot status` and the metrics: which processes have
//! the plugin loaded, and what each one's NCCL was asked for, per collective and size class,
//! from which adopted decision.
//!
//! The directory is world-writable (sticky, like /tmp: training processes of any user create
//! their file), so nothing in it is trusted: only regular files named `<pid>-<16 hex digits>`,
//! read with `read` (never mapped) and exactly the layout's size, at most [`MAX_FILES`] of them.
//! A file is a live process's while that process holds its `flock`: that works across PID
//! namespaces, where the pid in the name means nothing here. The plugin rewrites its file once
//! a second, so a read is taken twice and kept only when both agree.

use std::{
    fs,
    io::{self, Read, Seek},
    os::unix::{
        fs::{OpenOptionsExt, PermissionsExt},
        io::AsRawFd,
    },
    path::Path,
};

use linkpilot_common::{
    board::nccl,
    tuner::{
        adoption, choice, TunerEntry, TunerStats, COLLS, COLL_SLOTS, SIZE_CLASSES, TUNER_MAGIC,
        TUNER_SIZE, TUNER_VERSION,
    },
};
use serde::{Deserialize, Serialize};

/// Where the plugin writes unless `LINKPILOT_TUNER_STATS` says otherwise.
pub const DEFAULT_DIR: &str = "/run/linkpilot/tuner";
/// Files read at most per scan.
pub const MAX_FILES: usize = 256;

/// One training process with the plugin loaded.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TunerProcess {
    /// The pid the process has in its own PID namespace.
    pub pid: u32,
    pub communicators: u32,
    /// getCollInfo calls, and those that followed an adopted decision.
    pub calls: u64,
    pub adopted_calls: u64,
    pub chunk_calls: u64,
    /// What the calls follow: "none yet" (NCCL's own: no training code adopted a decision),
    /// "adopted", "withdrawn".
    pub adoption: String,
    /// The training step from which the adopted decision applies.
    pub adopted_step: u64,
    /// Adoptions and withdrawals so far.
    pub adoptions: u64,
    /// NCCL_BUFFSIZE as the plugin read it.
    pub buffsize_bytes: u64,
    /// The (collective, size class) rows it was called for.
    pub choices: Vec<TunerChoice>,
}

/// What the plugin asked NCCL for, for one collective type and size class.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TunerChoice {
    pub collective: String,
    /// Collectives of `size_from` bytes up to (not including) `size_to`; `None`: no limit.
    pub size_from: u64,
    pub size_to: Option<u64>,
    /// Preferred algorithm and protocol (`None`: NCCL's own).
    pub algo: Option<String>,
    pub proto: Option<String>,
    /// Channel cap (0: NCCL's count).
    pub channels: u8,
    /// Why NCCL kept its own choice, if it did: "no decision adopted", "below min_bytes", "not
    /// allowed by NCCL".
    pub own_choice: Option<String>,
    /// Chunk size asked for (0: NCCL's own).
    pub chunk_bytes: u64,
    /// The adopted steps behind the latest changes of the choice and of the chunk.
    pub step: u64,
    pub chunk_step: u64,
    pub calls: u64,
    pub chunk_calls: u64,
}

/// A counter file as read: its process, or nobody's (its process is gone), or why it is not one.
#[derive(Debug)]
pub enum Counted {
    Live(TunerProcess),
    Dead,
}

/// Reads tried before a file that changes under every read is skipped for this scan.
const READ_TRIES: usize = 3;

/// One counter file, or why it is not one.
pub fn read_file(path: &Path) -> Result<Counted, String> {
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
        return Ok(Counted::Dead);
    }
    if meta.len() != TUNER_SIZE as u64 {
        return Err(format!("not a counter file ({} bytes, one has {TUNER_SIZE})", meta.len()));
    }
    let mut last = vec![0u8; TUNER_SIZE];
    f.read_exact(&mut last).map_err(|e| e.to_string())?;
    for _ in 0..READ_TRIES {
        let mut again = vec![0u8; TUNER_SIZE];
        f.rewind().map_err(|e| e.to_string())?;
        f.read_exact(&mut again).map_err(|e| e.to_string())?;
        if again == last {
            return parse(&last).map(Counted::Live);
        }
        last = again;
    }
    Err("rewritten during every read".into())
}

/// A counter file's bytes (anyone's: checked, never trusted), or why they are not one.
pub fn parse(bytes: &[u8]) -> Result<TunerProcess, String> {
    if bytes.len() != TUNER_SIZE {
        return Err(format!("not a counter file ({} bytes, one has {TUNER_SIZE})", bytes.len()));
    }
    // SAFETY: TunerStats is repr(C) plain integers (any bytes are a value), read unaligned from
    // a buffer of exactly its size.
    let s: TunerStats = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    let h = s.header;
    if h.magic != TUNER_MAGIC || h.version != TUNER_VERSION || h.size as usize != TUNER_SIZE {
        return Err(format!("not a version-{TUNER_VERSION} counter file"));
    }
    let mut choices = Vec::new();
    for (coll, row) in s.entries.iter().enumerate().take(COLL_SLOTS) {
        for (class, e) in row.iter().enumerate() {
            if e.calls == 0 && e.chunk_calls == 0 {
                continue;
            }
            let w = e.choice;
            let own = if w & choice::ADOPTED == 0 {
                Some("no decision adopted")
            } else if w & choice::SMALL != 0 {
                Some("below min_bytes")
            } else if w & choice::NOT_ALLOWED != 0 {
                Some("not allowed by NCCL")
            } else {
                None
            };
            let name = |code: u8, names: &[&str]| {
                (code != nccl::ANY)
                    .then(|| names.get(usize::from(code)).unwrap_or(&"?").to_string())
            };
            choices.push(TunerChoice {
                collective: COLLS[coll].to_owned(),
                size_from: 1 << class,
                size_to: (class + 1 < SIZE_CLASSES).then(|| 1 << (class + 1)),
                algo: name(choice::algo(w), &nccl::ALGOS),
                proto: name(choice::proto(w), &nccl::PROTOS),
                channels: choice::channels(w),
                own_choice: own.map(str::to_owned),
                chunk_bytes: e.chunk,
                step: e.step,
                chunk_step: e.chunk_step,
                calls: e.calls,
                chunk_calls: e.chunk_calls,
            });
        }
    }
    // Anyone's counts: summed without overflowing.
    let sum =
        |f: fn(&TunerEntry) -> u64| s.entries.iter().flatten().map(f).fold(0, u64::saturating_add);
    let (calls, chunk_calls) = (sum(|e| e.calls), sum(|e| e.chunk_calls));
    Ok(TunerProcess {
        pid: h.pid,
        communicators: h.communicators,
        calls,
        adopted_calls: calls.saturating_sub(h.own_calls),
        chunk_calls,
        adoption: adoption::NAMES.get(h.adoption as usize).unwrap_or(&"?").to_string(),
        adopted_step: h.adopted_step,
        adoptions: h.adoptions,
        buffsize_bytes: u64::from(h.buffsize_kib) << 10,
        choices,
    })
}

/// The pid a counter file's name gives: `<pid>-<16 hex digits>`.
fn named_pid(name: &str) -> Option<u32> {
    let (pid, tag) = name.split_once('-')?;
    (tag.len() == 16 && tag.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| pid.parse().ok())
        .flatten()
}

/// The processes of `dir` with the plugin loaded, by pid. Files of processes that are gone (a
/// crash: a clean exit removes its own) are removed when `clean` is set (the daemon owns the
/// directory); unreadable or foreign files are skipped.
pub fn scan(dir: &Path, clean: bool) -> Vec<TunerProcess> {
    // Not through a symlink: files of dead processes are removed, as root.
    if real_dir(dir).is_err() {
        return Vec::new();
    }
    let Ok(entries) = fs::read_dir(dir) else { return Vec::new() };
    let mut out = Vec::new();
    for entry in entries.flatten().take(MAX_FILES) {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(named_pid) else { continue };
        match read_file(&entry.path()) {
            Ok(Counted::Live(p)) if p.pid == pid => out.push(p),
            Ok(Counted::Dead) if clean && entry.file_type().is_ok_and(|t| t.is_file()) => {
                let _ = fs::remove_file(entry.path());
            }
            _ => {}
        }
    }
    out.sort_by_key(|p| p.pid);
    out
}

/// Creates the directory for the plugin's files: world-writable and sticky (as /tmp), so
/// training processes of every user can create (and only remove) their own. A directory that
/// exists already keeps its owner's permissions; anything else there (a symlink, a file) is
/// refused, and [`scan`] will not read it.
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use linkpilot_common::tuner::TunerHeader;

    /// Found by the `tuner_stats` fuzz target: counts whose sum overflows (anyone may write a
    /// counter file) panicked the daemon's scan; they add up to the most a u64 holds.
    #[test]
    fn counts_that_overflow_saturate() {
        let mut bytes = vec![0u8; TUNER_SIZE];
        bytes[..8].copy_from_slice(&TUNER_MAGIC);
        bytes[8..12].copy_from_slice(&TUNER_VERSION.to_ne_bytes());
        bytes[12..16].copy_from_slice(&(TUNER_SIZE as u32).to_ne_bytes());
        // Two entries (48 bytes each after the 64-byte header) with u64::MAX calls and chunk
        // calls.
        for entry in [0, 1] {
            let at = 64 + entry * 48;
            bytes[at..at + 4].copy_from_slice(&choice::SEEN.to_ne_bytes());
            bytes[at + 8..at + 16].copy_from_slice(&u64::MAX.to_ne_bytes());
            bytes[at + 32..at + 40].copy_from_slice(&u64::MAX.to_ne_bytes());
        }
        let p = parse(&bytes).unwrap();
        assert_eq!((p.calls, p.chunk_calls, p.choices.len()), (u64::MAX, u64::MAX, 2));
        assert!(parse(&bytes[1..]).unwrap_err().contains("not a counter file"));
    }

    /// A counter file as the plugin leaves it, and the descriptor holding its lock (`None`:
    /// unlocked, a dead process's).
    fn file(dir: &Path, name: &str, stats: &TunerStats, live: bool) -> (PathBuf, Option<fs::File>) {
        let path = dir.join(name);
        // SAFETY: plain integers, written as the plugin writes them.
        let bytes = unsafe {
            std::slice::from_raw_parts((stats as *const TunerStats).cast::<u8>(), TUNER_SIZE)
        };
        fs::write(&path, bytes).unwrap();
        let lock = live.then(|| {
            let f = fs::File::open(&path).unwrap();
            // SAFETY: flock on a descriptor of this test.
            assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
            f
        });
        (path, lock)
    }

    #[test]
    fn reads_what_the_plugin_writes_and_drops_the_dead() {
        let dir = std::env::temp_dir().join(format!("lp-tuner-stats-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        create_dir(&dir).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().permissions().mode() & 0o7777, 0o1777);
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        create_dir(&dir).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().permissions().mode() & 0o7777, 0o755, "kept");
        // In another PID namespace a process may have any pid, ours included: liveness is the
        // lock, not the pid.
        let pid = 1;
        let mut s = TunerStats {
            header: TunerHeader {
                magic: TUNER_MAGIC,
                version: TUNER_VERSION,
                size: TUNER_SIZE as u32,
                pid,
                communicators: 2,
                own_calls: 1,
                own_chunk_calls: 0,
                adopted_step: 42,
                adoption: adoption::ADOPTED,
                buffsize_kib: 8192,
                adoptions: 3,
            },
            entries: [[TunerEntry::default(); SIZE_CLASSES]; COLL_SLOTS],
        };
        s.entries[4][23] = TunerEntry {
            choice: choice::pack(0, 2, 4, choice::SEEN | choice::ADOPTED),
            calls: 9,
            step: 42,
            chunk: 1 << 20,
            chunk_calls: 7,
            chunk_step: 42,
            ..TunerEntry::default()
        };
        s.entries[2][3].choice = choice::pack(255, 255, 0, choice::SEEN);
        s.entries[2][3].calls = 1;
        let (_, _held) = file(&dir, "1-00000000deadbeef", &s, true);
        // The same pid in another namespace, alive too, and a dead process's file.
        let (_, _also) = file(&dir, "1-0123456789abcdef", &s, true);
        let (dead, _) = file(&dir, "1-fedcba9876543210", &s, false);
        // Junk, a name without the tag, a name whose pid is not the file's: not read.
        fs::write(dir.join("notes"), "x").unwrap();
        let (_, _old) = file(&dir, "1", &s, true);
        let (_, _other) = file(&dir, "2-00000000deadbeef", &s, true);
        let got = scan(&dir, true);
        assert!(!dead.exists(), "a dead process's file is removed");
        assert_eq!(got.len(), 2);
        let p = &got[0];
        assert_eq!((p.pid, p.communicators, p.calls, p.adopted_calls), (1, 2, 10, 9));
        assert_eq!((p.adoption.as_str(), p.adopted_step, p.adoptions), ("adopted", 42, 3));
        assert_eq!(p.buffsize_bytes, 8 << 20);
        let c = &p.choices;
        assert_eq!(c.len(), 2);
        assert_eq!(
            (c[0].collective.as_str(), c[0].own_choice.as_deref()),
            ("allgather", Some("no decision adopted"))
        );
        assert_eq!(
            (c[1].collective.as_str(), c[1].size_from, c[1].size_to),
            ("allreduce", 8 << 20, Some(16 << 20))
        );
        assert_eq!(
            (c[1].algo.as_deref(), c[1].proto.as_deref(), c[1].channels),
            (Some("tree"), Some("simple"), 4)
        );
        assert_eq!((c[1].chunk_bytes, c[1].own_choice.as_ref(), c[1].step), (1 << 20, None, 42));
        let (short, _lock) = {
            let path = dir.join("77-00000000deadbeef");
            fs::write(&path, "short").unwrap();
            let f = fs::File::open(&path).unwrap();
            // SAFETY: flock on a descriptor of this test.
            unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
            (path, f)
        };
        assert!(read_file(&short).unwrap_err().contains("not a counter file"));
        let _ = fs::remove_dir_all(&dir);
    }

    /// A symlink planted at the directory's name: neither made world-writable nor cleaned
    /// (cleaning removes files of dead pids, here the victim's).
    #[test]
    fn a_symlinked_directory_is_neither_changed_nor_cleaned() {
        let root = tempfile::tempdir().unwrap();
        let victim = root.path().join("victim");
        fs::create_dir(&victim).unwrap();
        let dead = victim.join("4194305-00000000deadbeef");
        fs::write(&dead, "precious").unwrap();
        let dir = root.path().join("tuner");
        std::os::unix::fs::symlink(&victim, &dir).unwrap();
        let e = create_dir(&dir).unwrap_err().to_string();
        assert!(e.ends_with("tuner is a symbolic link; refusing to use it"), "{e}");
        assert!(scan(&dir, true).is_empty());
        assert_eq!(fs::read_to_string(&dead).unwrap(), "precious");
        assert_eq!(fs::metadata(&victim).unwrap().permissions().mode() & 0o7777, 0o755);
    }
}
