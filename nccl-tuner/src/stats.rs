//! The per-process counter area (layout: `linkpilot_common::tuner`), in a file the daemon reads
//! (`$LINKPILOT_TUNER_STATS/<pid>`, default `/run/linkpilot/tuner/<pid>`) or, where that cannot
//! be created, in this process's memory. Updated with relaxed atomics: each field is exact on its
//! own, the set of fields is not a snapshot.

use std::{
    ffi::CString,
    ptr::NonNull,
    sync::{
        atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering},
        Mutex,
    },
};

use linkpilot_common::tuner::{
    size_class, TunerEntry, TunerHeader, TunerStats, COLL_OTHER, COLL_SLOTS, SIZE_CLASSES,
    TUNER_MAGIC, TUNER_SIZE, TUNER_VERSION,
};

use crate::{abi::Logger, log::say};

/// Where the counter files go unless `LINKPILOT_TUNER_STATS` says otherwise.
pub const DEFAULT_DIR: &str = "/run/linkpilot/tuner";

#[repr(C)]
pub struct Header {
    magic: [u8; 8],
    version: u32,
    size: u32,
    pid: u32,
    pub communicators: AtomicU32,
    pub own_calls: AtomicU64,
    pub own_chunk_calls: AtomicU64,
    pub decision_id: AtomicU64,
    pub board: AtomicU32,
    pub buffsize_kib: AtomicU32,
    _reserved: u64,
}

#[repr(C)]
pub struct Entry {
    pub choice: AtomicU32,
    _pad: u32,
    pub calls: AtomicU64,
    pub decision_id: AtomicU64,
    pub chunk: AtomicU64,
    pub chunk_calls: AtomicU64,
    pub chunk_decision_id: AtomicU64,
}

#[repr(C)]
pub struct Area {
    pub header: Header,
    entries: [[Entry; SIZE_CLASSES]; COLL_SLOTS],
}

// The atomic view has the bytes of the shared layout.
const _: () = assert!(std::mem::size_of::<Area>() == TUNER_SIZE);
const _: () = assert!(std::mem::size_of::<Header>() == std::mem::size_of::<TunerHeader>());
const _: () = assert!(std::mem::size_of::<Entry>() == std::mem::size_of::<TunerEntry>());
const _: () = assert!(
    std::mem::offset_of!(Header, own_calls) == std::mem::offset_of!(TunerHeader, own_calls)
        && std::mem::offset_of!(Header, board) == std::mem::offset_of!(TunerHeader, board)
        && std::mem::offset_of!(Header, buffsize_kib)
            == std::mem::offset_of!(TunerHeader, buffsize_kib)
        && std::mem::offset_of!(Entry, chunk) == std::mem::offset_of!(TunerEntry, chunk)
        && std::mem::offset_of!(Entry, chunk_decision_id)
            == std::mem::offset_of!(TunerEntry, chunk_decision_id)
        && std::mem::offset_of!(Area, entries) == std::mem::offset_of!(TunerStats, entries)
);

#[expect(
    clippy::declare_interior_mutable_const,
    reason = "the initializer of LOCAL's arrays (a repeat expression needs a const), never used alone"
)]
const ENTRY: Entry = Entry {
    choice: AtomicU32::new(0),
    _pad: 0,
    calls: AtomicU64::new(0),
    decision_id: AtomicU64::new(0),
    chunk: AtomicU64::new(0),
    chunk_calls: AtomicU64::new(0),
    chunk_decision_id: AtomicU64::new(0),
};
#[expect(clippy::declare_interior_mutable_const, reason = "as ENTRY")]
const ROW: [Entry; SIZE_CLASSES] = [ENTRY; SIZE_CLASSES];

/// The area when no file could be made: choices are still logged once, nobody else sees them.
static LOCAL: Area = Area {
    header: Header {
        magic: TUNER_MAGIC,
        version: TUNER_VERSION,
        size: TUNER_SIZE as u32,
        pid: 0,
        communicators: AtomicU32::new(0),
        own_calls: AtomicU64::new(0),
        own_chunk_calls: AtomicU64::new(0),
        decision_id: AtomicU64::new(0),
        board: AtomicU32::new(0),
        buffsize_kib: AtomicU32::new(0),
        _reserved: 0,
    },
    entries: [ROW; COLL_SLOTS],
};

static AREA: AtomicPtr<Area> = AtomicPtr::new(std::ptr::null_mut());
/// The file behind AREA, for teardown.
static FILE: Mutex<Option<(CString, usize)>> = Mutex::new(None);

/// The area in use.
pub fn area() -> &'static Area {
    // SAFETY: a published file mapping stays mapped until teardown (no communicator left).
    unsafe { AREA.load(Ordering::Acquire).as_ref() }.unwrap_or(&LOCAL)
}

impl Area {
    /// The entry of a collective type (`ncclFunc_t`) and size.
    pub fn entry(&self, coll: i32, n_bytes: u64) -> &Entry {
        let slot = usize::try_from(coll).ok().filter(|&c| c < COLL_OTHER).unwrap_or(COLL_OTHER);
        &self.entries[slot][size_class(n_bytes)]
    }
}

/// Creates `DIR/<pid>` and publishes it as the area (first communicator of the process).
pub fn open(dir: &str, logger: Option<Logger>) {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    let path = format!("{}/{pid}", dir.trim_end_matches('/'));
    let Ok(cpath) = CString::new(path.clone()) else { return };
    match create(&cpath, pid) {
        Ok(p) => {
            AREA.store(p.as_ptr(), Ordering::Release);
            *FILE.lock().unwrap_or_else(|e| e.into_inner()) = Some((cpath, p.as_ptr() as usize));
        }
        Err(e) => say!(
            logger,
            "no counters for `linkpilot status` ({path}: {e}); choices are still logged here"
        ),
    }
}

fn create(path: &CString, pid: u32) -> std::io::Result<NonNull<Area>> {
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a NUL-terminated path; the descriptor is closed on every path below.
    let fd = unsafe { libc::open(path.as_ptr(), flags, 0o644 as libc::c_uint) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: sizing and mapping the file just opened; failures checked.
    let p = unsafe {
        if libc::ftruncate(fd, TUNER_SIZE as libc::off_t) != 0 {
            let e = std::io::Error::last_os_error();
            libc::close(fd);
            return Err(e);
        }
        let p = libc::mmap(
            std::ptr::null_mut(),
            TUNER_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        let e = std::io::Error::last_os_error();
        libc::close(fd);
        if p == libc::MAP_FAILED {
            return Err(e);
        }
        p
    };
    let area = NonNull::new(p.cast::<Area>()).ok_or_else(|| std::io::Error::other("mmap: null"))?;
    // SAFETY: the fresh mapping is zeroed (ftruncate of an emptied file) and not yet shared
    // with other threads; the header's plain fields are written once here.
    unsafe {
        let h = std::ptr::addr_of_mut!((*area.as_ptr()).header);
        std::ptr::addr_of_mut!((*h).pid).write(pid);
        std::ptr::addr_of_mut!((*h).size).write(TUNER_SIZE as u32);
        std::ptr::addr_of_mut!((*h).version).write(TUNER_VERSION);
        // The magic last: a reader that sees it sees the rest.
        std::sync::atomic::fence(Ordering::Release);
        std::ptr::addr_of_mut!((*h).magic).write(TUNER_MAGIC);
    }
    Ok(area)
}

/// Removes the file (last communicator of the process): a finished job leaves nothing behind.
pub fn teardown() {
    let file = FILE.lock().unwrap_or_else(|e| e.into_inner()).take();
    AREA.store(std::ptr::null_mut(), Ordering::Release);
    if let Some((path, p)) = file {
        // SAFETY: unlinking our own file and unmapping exactly what `create` mapped; no call
        // runs any more.
        unsafe {
            libc::unlink(path.as_ptr());
            libc::munmap(p as *mut libc::c_void, TUNER_SIZE);
        }
    }
}
