//! The NCCL tuner plugin's counter files (one per training process, layout in
//! `linkpilot_common::tuner`), read for `linkpilot status` and the metrics: what each process's
//! NCCL was asked for, per collective and size class, and on which decision.
//!
//! The directory is world-writable (sticky, like /tmp: training processes of any user create
//! their file), so nothing in it is trusted: only regular files named by a pid, read with
//! `read` (never mapped) and exactly the layout's size, at most [`MAX_FILES`] of them.

use std::{
    fs,
    io::{self, Read},
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::Path,
};

use linkpilot_common::{
    board::nccl,
    tuner::{
        board_state, choice, TunerEntry, TunerStats, COLLS, COLL_SLOTS, SIZE_CLASSES, TUNER_MAGIC,
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
    pub pid: u32,
    pub communicators: u32,
    /// getCollInfo calls, and those that followed a fresh board.
    pub calls: u64,
    pub board_calls: u64,
    pub chunk_calls: u64,
    /// The newest decision a call acted on.
    pub decision_id: u64,
    /// The board as the last call found it: fresh, stale, missing, foreign, unreadable.
    pub board: String,
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
    /// Why NCCL kept its own choice, if it did: "no fresh board", "below min_bytes", "not
    /// allowed by NCCL".
    pub own_choice: Option<String>,
    /// Chunk size asked for (0: NCCL's own).
    pub chunk_bytes: u64,
    pub decision_id: u64,
    pub chunk_decision_id: u64,
    pub calls: u64,
    pub chunk_calls: u64,
}

/// One counter file, or why it is not one.
pub fn read_file(path: &Path) -> Result<TunerProcess, String> {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| e.to_string())?;
    let meta = f.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() || meta.len() != TUNER_SIZE as u64 {
        return Err(format!("not a counter file ({} bytes, one has {TUNER_SIZE})", meta.len()));
    }
    let mut bytes = vec![0u8; TUNER_SIZE];
    f.read_exact(&mut bytes).map_err(|e| e.to_string())?;
    parse(&bytes)
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
            let own = if w & choice::BOARD == 0 {
                Some("no fresh board")
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
                decision_id: e.decision_id,
                chunk_decision_id: e.chunk_decision_id,
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
        board_calls: calls.saturating_sub(h.own_calls),
        chunk_calls,
        decision_id: h.decision_id,
        board: board_state::NAMES.get(h.board as usize).unwrap_or(&"?").to_string(),
        buffsize_bytes: u64::from(h.buffsize_kib) << 10,
        choices,
    })
}

/// Whether a process with this pid is running (in our pid namespace).
fn alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else { return false };
    // SAFETY: signal 0 only checks that the process exists.
    pid > 0
        && (unsafe { libc::kill(pid, 0) } == 0
            || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
}

/// The processes of `dir` with the plugin loaded, by pid. Files of processes that are gone (a
/// crash: a clean exit removes its own) are removed when `clean` is set (the daemon owns the
/// directory); unreadable or foreign files are skipped.
pub fn scan(dir: &Path, clean: bool) -> Vec<TunerProcess> {
    // Not through a symlink: files of dead pids are removed, as root.
    if real_dir(dir).is_err() {
        return Vec::new();
    }
    let Ok(entries) = fs::read_dir(dir) else { return Vec::new() };
    let mut out = Vec::new();
    for entry in entries.flatten().take(MAX_FILES) {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if !alive(pid) {
            if clean && entry.file_type().is_ok_and(|t| t.is_file()) {
                let _ = fs::remove_file(entry.path());
            }
            continue;
        }
        if let Ok(p) = read_file(&entry.path()) {
            if p.pid == pid {
                out.push(p);
            }
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

    fn file(dir: &Path, pid: u32, stats: &TunerStats) -> std::path::PathBuf {
        let path = dir.join(pid.to_string());
        // SAFETY: plain integers, written as the plugin's mapping holds them.
        let bytes = unsafe {
            std::slice::from_raw_parts((stats as *const TunerStats).cast::<u8>(), TUNER_SIZE)
        };
        fs::write(&path, bytes).unwrap();
        path
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
        let me = std::process::id();
        let mut s = TunerStats {
            header: TunerHeader {
                magic: TUNER_MAGIC,
                version: TUNER_VERSION,
                size: TUNER_SIZE as u32,
                pid: me,
                communicators: 2,
                own_calls: 1,
                own_chunk_calls: 0,
                decision_id: 42,
                board: board_state::FRESH,
                buffsize_kib: 8192,
                _reserved: 0,
            },
            entries: [[TunerEntry::default(); SIZE_CLASSES]; COLL_SLOTS],
        };
        s.entries[4][23] = TunerEntry {
            choice: choice::pack(0, 2, 4, choice::SEEN | choice::BOARD),
            calls: 9,
            decision_id: 42,
            chunk: 1 << 20,
            chunk_calls: 7,
            chunk_decision_id: 42,
            ..TunerEntry::default()
        };
        s.entries[2][3].choice = choice::pack(255, 255, 0, choice::SEEN);
        s.entries[2][3].calls = 1;
        file(&dir, me, &s);
        // A dead process's file (pid beyond pid_max) goes; junk stays but is not read.
        let dead = file(&dir, 4_194_305, &s);
        fs::write(dir.join("notes"), "x").unwrap();
        let got = scan(&dir, true);
        assert!(!dead.exists());
        assert_eq!(got.len(), 1);
        let p = &got[0];
        assert_eq!((p.pid, p.communicators, p.calls, p.decision_id), (me, 2, 10, 42));
        assert_eq!((p.board.as_str(), p.buffsize_bytes), ("fresh", 8 << 20));
        let c = &p.choices;
        assert_eq!(c.len(), 2);
        assert_eq!(
            (c[0].collective.as_str(), c[0].own_choice.as_deref()),
            ("allgather", Some("no fresh board"))
        );
        assert_eq!(
            (c[1].collective.as_str(), c[1].size_from, c[1].size_to),
            ("allreduce", 8 << 20, Some(16 << 20))
        );
        assert_eq!(
            (c[1].algo.as_deref(), c[1].proto.as_deref(), c[1].channels),
            (Some("tree"), Some("simple"), 4)
        );
        assert_eq!((c[1].chunk_bytes, c[1].own_choice.as_ref()), (1 << 20, None));
        fs::write(dir.join("77"), "short").unwrap();
        assert!(read_file(&dir.join("77")).unwrap_err().contains("not a counter file"));
        let _ = fs::remove_dir_all(&dir);
    }

    /// A symlink planted at the directory's name: neither made world-writable nor cleaned
    /// (cleaning removes files of dead pids, here the victim's).
    #[test]
    fn a_symlinked_directory_is_neither_changed_nor_cleaned() {
        let root = tempfile::tempdir().unwrap();
        let victim = root.path().join("victim");
        fs::create_dir(&victim).unwrap();
        let dead = victim.join("4194305");
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
