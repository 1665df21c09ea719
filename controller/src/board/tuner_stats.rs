//! The NCCL tuner plugin's counter files (one per training process, layout in
//! `linkpilot_common::tuner`), read for `linkpilot status` and the metrics: which processes have
//! the plugin loaded, and what each one's NCCL was asked for, per collective and size class,
//! from which adopted decision.
//!
//! The directory is a [`drop_dir`]: nothing in it is trusted; the plugin rewrites its file once
//! a second.

use std::{io, path::Path};

use linkpilot_common::{
    board::nccl,
    tuner::{
        adoption, choice, TunerEntry, TunerStats, COLLS, COLL_SLOTS, SIZE_CLASSES, TUNER_MAGIC,
        TUNER_SIZE, TUNER_VERSION,
    },
};
use serde::{Deserialize, Serialize};

use super::drop_dir::{self, Held};

/// Where the plugin writes unless `LINKPILOT_TUNER_STATS` says otherwise.
pub const DEFAULT_DIR: &str = "/run/linkpilot/tuner";

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

/// One counter file, or why it is not one.
pub fn read_file(path: &Path) -> Result<Counted, String> {
    match drop_dir::read_file(path, TUNER_SIZE, "counter file")? {
        Held::Live(bytes) => parse(&bytes).map(Counted::Live),
        Held::Dead => Ok(Counted::Dead),
    }
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

/// The processes of `dir` with the plugin loaded, by pid. Files of processes that are gone are
/// removed when `clean` is set (the daemon owns the directory); unreadable or foreign files
/// (one whose pid is not its name's) are skipped.
pub fn scan(dir: &Path, clean: bool) -> Vec<TunerProcess> {
    let parse = |pid, bytes: &[u8]| {
        parse(bytes).and_then(|p| {
            (p.pid == pid).then_some(p).ok_or_else(|| "another process's name".to_owned())
        })
    };
    let mut out: Vec<TunerProcess> =
        drop_dir::scan(dir, clean, TUNER_SIZE, "counter file", parse, |_, _| {})
            .into_iter()
            .map(|(_, p)| p)
            .collect();
    out.sort_by_key(|p| p.pid);
    out
}

/// Creates the directory for the plugin's files (see [`drop_dir::create_dir`]).
pub fn create_dir(dir: &Path) -> io::Result<()> {
    drop_dir::create_dir(dir)
}

#[cfg(test)]
mod tests {
    use std::{
        fs,
        os::unix::{fs::PermissionsExt, io::AsRawFd},
        path::PathBuf,
    };

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
        let mut s = TunerStats::new(TunerHeader {
            communicators: 2,
            own_calls: 1,
            adopted_step: 42,
            adoption: adoption::ADOPTED,
            buffsize_kib: 8192,
            adoptions: 3,
            ..TunerHeader::new(pid)
        });
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
