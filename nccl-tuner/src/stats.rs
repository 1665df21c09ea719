//! The per-process counter area (layout: `linkpilot_common::tuner`): counted in this process's
//! memory with relaxed atomics (each field exact on its own, the set of fields not a snapshot),
//! and copied into a file the daemon reads (`$LINKPILOT_TUNER_STATS/<pid>-<random>`, default
//! under `/run/linkpilot/tuner`) once a second by a thread of the plugin's own.
//!
//! The directory is shared by every training process on the node, of every user and PID
//! namespace (pods often have the same pid), so the file is made so that nobody else can break
//! this process through it: a name no other process has (created with O_EXCL, never truncated),
//! written with `pwrite` (never mapped: a file someone else truncates cannot fault this process,
//! and the next write extends it again), and an exclusive `flock` held while the process lives,
//! by which the daemon tells a live process's file from a dead one's.

use std::{
    ffi::CString,
    sync::{
        atomic::{AtomicU32, AtomicU64, Ordering},
        Condvar, Mutex,
    },
    thread::JoinHandle,
    time::Duration,
};

use linkpilot_common::tuner::{
    size_class, TunerEntry, TunerHeader, TunerStats, COLL_OTHER, COLL_SLOTS, SIZE_CLASSES,
    TUNER_SIZE,
};

use crate::{abi::Logger, log::say};

/// Where the counter files go unless `LINKPILOT_TUNER_STATS` says otherwise.
pub const DEFAULT_DIR: &str = "/run/linkpilot/tuner";
/// How often the file gets the counts.
const WRITE_EVERY: Duration = Duration::from_secs(1);
/// Names tried before giving up on a file (another process holding each random name).
const NAME_TRIES: u32 = 8;

pub struct Header {
    pub communicators: AtomicU32,
    pub own_calls: AtomicU64,
    pub own_chunk_calls: AtomicU64,
    pub adopted_step: AtomicU64,
    pub adoption: AtomicU32,
    pub buffsize_kib: AtomicU32,
    pub adoptions: AtomicU64,
}

pub struct Entry {
    pub choice: AtomicU32,
    pub calls: AtomicU64,
    pub step: AtomicU64,
    pub chunk: AtomicU64,
    pub chunk_calls: AtomicU64,
    pub chunk_step: AtomicU64,
}

pub struct Area {
    pub header: Header,
    entries: [[Entry; SIZE_CLASSES]; COLL_SLOTS],
}

#[expect(
    clippy::declare_interior_mutable_const,
    reason = "the initializer of AREA's arrays (a repeat expression needs a const), never used alone"
)]
const ENTRY: Entry = Entry {
    choice: AtomicU32::new(0),
    calls: AtomicU64::new(0),
    step: AtomicU64::new(0),
    chunk: AtomicU64::new(0),
    chunk_calls: AtomicU64::new(0),
    chunk_step: AtomicU64::new(0),
};
#[expect(clippy::declare_interior_mutable_const, reason = "as ENTRY")]
const ROW: [Entry; SIZE_CLASSES] = [ENTRY; SIZE_CLASSES];

static AREA: Area = Area {
    header: Header {
        communicators: AtomicU32::new(0),
        own_calls: AtomicU64::new(0),
        own_chunk_calls: AtomicU64::new(0),
        adopted_step: AtomicU64::new(0),
        adoption: AtomicU32::new(0),
        buffsize_kib: AtomicU32::new(0),
        adoptions: AtomicU64::new(0),
    },
    entries: [ROW; COLL_SLOTS],
};

/// The area: counted here whether or not a file could be made.
pub fn area() -> &'static Area {
    &AREA
}

impl Area {
    /// The entry of a collective type (`ncclFunc_t`) and size.
    pub fn entry(&self, coll: i32, n_bytes: u64) -> &Entry {
        let slot = usize::try_from(coll).ok().filter(|&c| c < COLL_OTHER).unwrap_or(COLL_OTHER);
        &self.entries[slot][size_class(n_bytes)]
    }

    /// The counts as the file holds them.
    pub fn snapshot(&self, pid: u32) -> TunerStats {
        let h = &self.header;
        let r = Ordering::Relaxed;
        let mut s = TunerStats::new(TunerHeader {
            communicators: h.communicators.load(r),
            own_calls: h.own_calls.load(r),
            own_chunk_calls: h.own_chunk_calls.load(r),
            adopted_step: h.adopted_step.load(r),
            adoption: h.adoption.load(r),
            buffsize_kib: h.buffsize_kib.load(r),
            adoptions: h.adoptions.load(r),
            ..TunerHeader::new(pid)
        });
        for (row, out) in self.entries.iter().zip(s.entries.iter_mut()) {
            for (e, o) in row.iter().zip(out.iter_mut()) {
                *o = TunerEntry {
                    choice: e.choice.load(r),
                    _pad: 0,
                    calls: e.calls.load(r),
                    step: e.step.load(r),
                    chunk: e.chunk.load(r),
                    chunk_calls: e.chunk_calls.load(r),
                    chunk_step: e.chunk_step.load(r),
                };
            }
        }
        s
    }
}

/// The open counter file and its writer thread.
struct File {
    fd: libc::c_int,
    path: CString,
    pid: u32,
    writer: Option<JoinHandle<()>>,
}

/// Set to stop the writer; the condvar wakes it.
static STOP: Mutex<bool> = Mutex::new(false);
static WAKE: Condvar = Condvar::new();
static FILE: Mutex<Option<File>> = Mutex::new(None);

/// Creates this process's file in `dir` and starts writing it (first communicator of the
/// process). Without a file the counts are still kept and the choices still logged.
pub fn open(dir: &str, logger: Option<Logger>) {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    let dir = dir.trim_end_matches('/');
    let (fd, path) = match create(dir, pid) {
        Ok(f) => f,
        Err(e) => {
            return say!(
                logger,
                "no counters for `linkpilot status` (a file in {dir}: {e}); choices are still \
                 logged here"
            )
        }
    };
    FD.store(fd, Ordering::Relaxed);
    static AT_FORK: std::sync::Once = std::sync::Once::new();
    // SAFETY: a handler that only closes a descriptor; glibc drops it if the library is unloaded.
    AT_FORK.call_once(|| unsafe {
        libc::pthread_atfork(None, None, Some(close_in_child));
    });
    *STOP.lock().unwrap_or_else(|e| e.into_inner()) = false;
    let writer = std::thread::Builder::new()
        .name("lp-tuner-stats".into())
        .spawn(move || loop {
            let stop = STOP.lock().unwrap_or_else(|e| e.into_inner());
            // A stop asked for before this thread waited must not wait out a whole interval.
            let stop = if *stop {
                stop
            } else {
                WAKE.wait_timeout(stop, WRITE_EVERY).unwrap_or_else(|e| e.into_inner()).0
            };
            let done = *stop;
            drop(stop);
            write(fd, pid);
            if done {
                return;
            }
        })
        .ok();
    *FILE.lock().unwrap_or_else(|e| e.into_inner()) = Some(File { fd, path, pid, writer });
}

/// A file of a name nobody has, locked and written: `<pid>-<16 hex digits>`.
fn create(dir: &str, pid: u32) -> std::io::Result<(libc::c_int, CString)> {
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let cstr = |s: String| {
        CString::new(s).map_err(|_| std::io::Error::other("a NUL in the directory's name"))
    };
    let mut last = std::io::Error::other("no name tried");
    for _ in 0..NAME_TRIES {
        let name = format!("{pid}-{:016x}", random());
        // The daemon reads only `<pid>-<16 hex digits>`: it never meets the hidden one.
        let (hidden, path) = (cstr(format!("{dir}/.{name}.new"))?, cstr(format!("{dir}/{name}"))?);
        // SAFETY: a NUL-terminated path; the descriptor is kept or closed below.
        let fd = unsafe { libc::open(hidden.as_ptr(), flags, 0o644 as libc::c_uint) };
        if fd < 0 {
            last = std::io::Error::last_os_error();
            if last.raw_os_error() == Some(libc::EEXIST) {
                continue;
            }
            return Err(last);
        }
        let fail = |e: std::io::Error| {
            // SAFETY: removing and closing what was just made.
            unsafe {
                libc::unlink(hidden.as_ptr());
                libc::close(fd);
            }
            e
        };
        // SAFETY: locking the descriptor just opened; nobody else knows its name.
        if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(fail(std::io::Error::last_os_error()));
        }
        write(fd, pid);
        // SAFETY: two NUL-terminated paths in the same directory; never over another file.
        let r = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                hidden.as_ptr(),
                libc::AT_FDCWD,
                path.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if r != 0 {
            last = fail(std::io::Error::last_os_error());
            if last.raw_os_error() == Some(libc::EEXIST) {
                continue;
            }
            return Err(last);
        }
        return Ok((fd, path));
    }
    Err(last)
}

/// The file's descriptor, for a forked child to close (-1: none).
static FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// In a forked child: closes its copy of the file's descriptor, so the lock lasts as long as
/// this process, not its children (a flock belongs to the open file, which both share).
extern "C" fn close_in_child() {
    let fd = FD.swap(-1, Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: the child's own copy of the descriptor; close is async-signal-safe.
        unsafe { libc::close(fd) };
    }
}

/// 64 random bits from the kernel (the clock's as a fallback).
fn random() -> u64 {
    let mut v = 0u64;
    // SAFETY: getrandom fills at most 8 bytes of `v`.
    let n = unsafe { libc::getrandom(std::ptr::addr_of_mut!(v).cast(), 8, libc::GRND_NONBLOCK) };
    if n != 8 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a valid timespec to fill.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        v ^= (ts.tv_sec as u64).rotate_left(32) ^ ts.tv_nsec as u64;
    }
    v
}

/// The whole area at offset 0, in one `pwrite` (a failed write is tried again next second).
fn write(fd: libc::c_int, pid: u32) {
    let s = AREA.snapshot(pid);
    // SAFETY: TunerStats is plain `#[repr(C)]` data of TUNER_SIZE bytes without padding holes
    // that matter (`_pad` is written as 0); pwrite reads exactly that many.
    unsafe {
        libc::pwrite(fd, std::ptr::addr_of!(s).cast(), TUNER_SIZE, 0);
    }
}

/// Stops the writer after a last write, removes the file and lets the lock go (last
/// communicator of the process: NCCL unloads the library after it, so no thread of ours may
/// outlive this).
pub fn teardown() {
    let Some(mut f) = FILE.lock().unwrap_or_else(|e| e.into_inner()).take() else { return };
    *STOP.lock().unwrap_or_else(|e| e.into_inner()) = true;
    WAKE.notify_all();
    match f.writer.take() {
        Some(w) => {
            let _ = w.join();
        }
        None => write(f.fd, f.pid),
    }
    FD.store(-1, Ordering::Relaxed);
    // SAFETY: our own file and descriptor; closing releases the lock.
    unsafe {
        libc::unlink(f.path.as_ptr());
        libc::close(f.fd);
    }
}
