//! The knob board, mapped once per process and read lock-free on every call: a seqlock copy of
//! the header and one link slot, and the clock (vDSO, no system call). While the board is
//! missing, stale or foreign, at most one call a second (whichever thread gets there) maps the
//! path afresh; a replaced board's old mapping stays until the last communicator is finalized,
//! since another thread may still be copying from it.

use std::{
    ffi::CStr,
    ptr::NonNull,
    sync::{
        atomic::{fence, AtomicPtr, AtomicU32, AtomicU64, Ordering},
        Mutex,
    },
};

use linkpilot_common::{
    board::{
        offsets, Board, BoardHeader, BoardLink, BOARD_MAGIC, BOARD_MAX_LINKS, BOARD_NAME_LEN,
        BOARD_VERSION,
    },
    tuner::board_state,
};

use crate::log::say;

const SIZE: usize = std::mem::size_of::<Board>();
/// Seqlock copies tried before a call gives up (keeps NCCL's choice) on a busy board.
const TRIES: u32 = 64;
/// How often a call may try to map an unusable board afresh.
const REOPEN_EVERY_NS: u64 = 1_000_000_000;

/// What a call found.
pub enum Read {
    /// A fresh board's slot for the link followed.
    Link(BoardLink),
    /// A fresh board without links.
    NoLink,
    /// The board cannot be followed: a [`board_state`] (MISSING, STALE, FOREIGN, UNREADABLE).
    Unusable(u32),
    /// The daemon kept writing through every try: this call keeps NCCL's choice.
    Busy,
}

struct Mapping {
    base: NonNull<u8>,
    dev: u64,
    ino: u64,
}

impl Mapping {
    fn seq(&self) -> &AtomicU64 {
        // SAFETY: `seq` is an 8-byte aligned u64 at a fixed offset of a live, page-aligned
        // mapping of at least SIZE bytes.
        unsafe { &*self.base.as_ptr().add(offsets::SEQ).cast::<AtomicU64>() }
    }
}

/// A mapping no longer current, kept until teardown.
struct Retired(*mut Mapping);
// SAFETY: only moved between threads to be unmapped at teardown, when no call runs.
unsafe impl Send for Retired {}

static CURRENT: AtomicPtr<Mapping> = AtomicPtr::new(std::ptr::null_mut());
static RETIRED: Mutex<Vec<Retired>> = Mutex::new(Vec::new());
static NEXT_REOPEN_NS: AtomicU64 = AtomicU64::new(0);
/// The state the last open found (NEVER_READ before the first).
static LAST_PROBLEM: AtomicU32 = AtomicU32::new(board_state::NEVER_READ);
/// A hash of the last problem's message, so each is logged once.
static LAST_MESSAGE: AtomicU64 = AtomicU64::new(0);

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// CLOCK_MONOTONIC at the kernel tick's resolution (a few ms): the board is stale after two
/// heartbeats of at least 100 ms, and the coarse clock costs a few ns where the fine one reads
/// the TSC (glibc answers both from the vDSO, without entering the kernel).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill; the clock exists on every Linux since 2.6.32.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

/// The slot of `want` (a NUL-padded link name; empty: the link in the worst state) on the
/// current board, judged fresh at `now_ns`.
pub fn read(want: &[u8; BOARD_NAME_LEN], now_ns: u64) -> Read {
    let m = CURRENT.load(Ordering::Acquire);
    // SAFETY: a published mapping stays mapped until teardown (no communicator left).
    let Some(m) = (unsafe { m.as_ref() }) else {
        return match LAST_PROBLEM.load(Ordering::Relaxed) {
            board_state::NEVER_READ => Read::Unusable(board_state::MISSING),
            p => Read::Unusable(p),
        };
    };
    let base = m.base.as_ptr();
    let links = base.wrapping_add(offsets::LINKS).cast::<BoardLink>();
    for _ in 0..TRIES {
        let s1 = m.seq().load(Ordering::Acquire);
        if s1 & 1 == 1 {
            std::hint::spin_loop();
            continue;
        }
        // SAFETY: the mapping holds a whole board; a copy a write overlapped is detected by the
        // sequence number below and dropped.
        let (beat, interval_ms, slot) = unsafe {
            let header = base.cast::<BoardHeader>();
            let beat = std::ptr::read_volatile(std::ptr::addr_of!((*header).heartbeat_ns));
            let interval_ms =
                std::ptr::read_volatile(std::ptr::addr_of!((*header).heartbeat_interval_ms));
            let n = std::ptr::read_volatile(std::ptr::addr_of!((*header).n_links)) as usize;
            let n = n.min(BOARD_MAX_LINKS);
            let mut pick = None;
            if want[0] != 0 {
                pick = (0..n).find(|&i| {
                    std::ptr::read_volatile(std::ptr::addr_of!((*links.add(i)).name)) == *want
                });
            }
            if pick.is_none() {
                let mut worst: Option<(usize, u32)> = None;
                for i in 0..n {
                    let s =
                        std::ptr::read_volatile(std::ptr::addr_of!((*links.add(i)).state_index));
                    if worst.is_none_or(|(_, w)| s > w) {
                        worst = Some((i, s));
                    }
                }
                pick = worst.map(|(i, _)| i);
            }
            (beat, interval_ms, pick.map(|i| std::ptr::read_volatile(links.add(i))))
        };
        fence(Ordering::Acquire);
        if m.seq().load(Ordering::Relaxed) != s1 {
            continue;
        }
        let interval = u64::from(interval_ms.max(1)) * 1_000_000;
        if now_ns.saturating_sub(beat) > 2 * interval {
            return Read::Unusable(board_state::STALE);
        }
        return slot.map_or(Read::NoLink, Read::Link);
    }
    Read::Busy
}

/// Whether this call should try to map the board afresh (at most one call a second).
pub fn reopen_due(now_ns: u64) -> bool {
    let next = NEXT_REOPEN_NS.load(Ordering::Relaxed);
    now_ns >= next
        && NEXT_REOPEN_NS
            .compare_exchange(next, now_ns + REOPEN_EVERY_NS, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

/// Why a board file cannot be followed.
enum Problem {
    Missing,
    Unreadable(std::io::Error),
    Foreign(String),
}

/// Maps the board at `path` unless it is the file already mapped; a problem is logged when it
/// differs from the last one. Not on the call path's fast side: open, fstat, pread, mmap.
pub fn reopen(path: &CStr, logger: Option<crate::abi::Logger>) {
    let state = match try_open(path) {
        Ok(()) => board_state::FRESH,
        Err(p) => {
            let (state, why) = match &p {
                Problem::Missing => (
                    board_state::MISSING,
                    "no such file (is `linkpilot run` running? LINKPILOT_BOARD names another \
                     path)"
                        .to_owned(),
                ),
                Problem::Unreadable(e) => (board_state::UNREADABLE, e.to_string()),
                Problem::Foreign(why) => (board_state::FOREIGN, why.clone()),
            };
            LAST_PROBLEM.store(state, Ordering::Relaxed);
            let h = fnv(&why);
            if LAST_MESSAGE.swap(h, Ordering::Relaxed) != h {
                say!(
                    logger,
                    "knob board {}: {why}; NCCL makes its own choices until it can be read",
                    path.to_string_lossy()
                );
            }
            return;
        }
    };
    LAST_PROBLEM.store(state, Ordering::Relaxed);
    LAST_MESSAGE.store(0, Ordering::Relaxed);
}

fn try_open(path: &CStr) -> Result<(), Problem> {
    // SAFETY: a NUL-terminated path; the descriptor is closed below on every path.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::ENOENT) => Problem::Missing,
            _ => Problem::Unreadable(e),
        });
    }
    let r = map_fd(fd);
    // SAFETY: closing the descriptor opened above; a mapping outlives it.
    unsafe { libc::close(fd) };
    r
}

fn map_fd(fd: i32) -> Result<(), Problem> {
    // SAFETY: fstat fills a zeroed stat of an open descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(Problem::Unreadable(std::io::Error::last_os_error()));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(Problem::Unreadable(std::io::Error::other("not a regular file")));
    }
    let (dev, ino) = (st.st_dev as u64, st.st_ino as u64);
    // SAFETY: a published mapping stays mapped until teardown.
    if let Some(m) = unsafe { CURRENT.load(Ordering::Acquire).as_ref() } {
        if (m.dev, m.ino) == (dev, ino) {
            return Ok(());
        }
    }
    let mut head = [0u8; 16];
    // SAFETY: reading at most 16 bytes into a 16-byte buffer.
    let n = unsafe { libc::pread(fd, head.as_mut_ptr().cast(), head.len(), 0) };
    if n < 16 || head[..8] != BOARD_MAGIC {
        return Err(Problem::Foreign("not a knob board".into()));
    }
    let word = |at: usize| u32::from_le_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    let (version, size) = (word(8), word(12));
    if version != BOARD_VERSION || size as usize != SIZE || (st.st_size as u64) < SIZE as u64 {
        return Err(Problem::Foreign(format!(
            "layout version {version} ({} bytes), this plugin reads version {BOARD_VERSION} \
             ({SIZE} bytes): the daemon and the plugin come from different releases",
            st.st_size
        )));
    }
    // SAFETY: a fresh read-only shared mapping of SIZE bytes of an open regular file at least
    // that long; checked for failure below.
    let p =
        unsafe { libc::mmap(std::ptr::null_mut(), SIZE, libc::PROT_READ, libc::MAP_SHARED, fd, 0) };
    if p == libc::MAP_FAILED {
        return Err(Problem::Unreadable(std::io::Error::last_os_error()));
    }
    let Some(base) = NonNull::new(p.cast::<u8>()) else {
        return Err(Problem::Unreadable(std::io::Error::other("mmap returned null")));
    };
    let new = Box::into_raw(Box::new(Mapping { base, dev, ino }));
    let old = CURRENT.swap(new, Ordering::AcqRel);
    if !old.is_null() {
        RETIRED.lock().unwrap_or_else(|e| e.into_inner()).push(Retired(old));
    }
    Ok(())
}

/// Unmaps every board mapping: only when no communicator is left (no call can be running).
pub fn teardown() {
    let mut all = std::mem::take(&mut *RETIRED.lock().unwrap_or_else(|e| e.into_inner()));
    all.push(Retired(CURRENT.swap(std::ptr::null_mut(), Ordering::AcqRel)));
    for Retired(m) in all {
        if m.is_null() {
            continue;
        }
        // SAFETY: `m` came from Box::into_raw in map_fd and was unpublished above.
        let m = unsafe { Box::from_raw(m) };
        // SAFETY: unmapping exactly what map_fd mapped; nobody reads it any more.
        unsafe { libc::munmap(m.base.as_ptr().cast(), SIZE) };
    }
    NEXT_REOPEN_NS.store(0, Ordering::Relaxed);
    LAST_PROBLEM.store(board_state::NEVER_READ, Ordering::Relaxed);
    LAST_MESSAGE.store(0, Ordering::Relaxed);
}

/// A NUL-padded board name as text: a policy's name (letters, digits, '.', '_', '-'), or "?"
/// for anything else, so that a corrupt board cannot put control characters or lines of its
/// own into NCCL's log.
pub fn text(bytes: &[u8; BOARD_NAME_LEN]) -> &str {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(BOARD_NAME_LEN);
    let name = &bytes[..end];
    if !name.iter().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(b)) {
        return "?";
    }
    std::str::from_utf8(name).unwrap_or("?")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{
        os::fd::AsRawFd,
        sync::{atomic::AtomicBool, Arc},
        time::Duration,
    };

    /// Found by the `tuner_board` fuzz target: a board whose link name held newlines and
    /// control bytes put them into NCCL's log line.
    #[test]
    fn names_that_are_not_a_policys_are_not_logged() {
        let name = |s: &[u8]| {
            let mut b = [0u8; BOARD_NAME_LEN];
            b[..s.len()].copy_from_slice(s);
            b
        };
        assert_eq!(text(&name(b"hk-us_1.2")), "hk-us_1.2");
        assert_eq!(text(&name(b"wan\n\nlinkpilot: forged")), "?");
        assert_eq!(text(&name(b"\x12\x12")), "?");
        assert_eq!(text(&name("w\u{e4}n".as_bytes())), "?");
    }

    /// The daemon's writer copies a whole board in well under a microsecond, so a tear is rare
    /// in any test that uses it. Here a writer that follows the same seqlock protocol writes a
    /// slot byte by byte, slowly, while readers copy it with [`read`]: every copy must still
    /// be one write's.
    #[test]
    fn a_slow_writer_never_tears_a_read() {
        let dir = std::env::temp_dir().join(format!("lp-tuner-seqlock-{}", std::process::id()));
        let path = dir.join("knobs");
        let slot = |i: u64| {
            let mut name = [0u8; BOARD_NAME_LEN];
            name[..3].copy_from_slice(b"wan");
            BoardLink {
                name,
                chunk_bytes: i,
                nccl_min_bytes: i,
                rtt_us: i as u32,
                decision_id: i,
                ..BoardLink::default()
            }
        };
        let mut w =
            linkpilot::board::BoardWriter::create(&path, Duration::from_secs(60), monotonic_ns())
                .unwrap();
        w.publish(&[slot(1)], monotonic_ns());
        reopen(&std::ffi::CString::new(path.to_str().unwrap()).unwrap(), None);
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        // SAFETY: a second, writable shared mapping of the board file, unmapped below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let base = base as usize;
        let done = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let done = done.clone();
                std::thread::spawn(move || {
                    let (mut copies, mut busy) = (0u64, 0u64);
                    while !done.load(Ordering::Acquire) {
                        match read(&[0; BOARD_NAME_LEN], monotonic_ns()) {
                            Read::Link(l) => {
                                let i = l.decision_id;
                                assert_eq!(
                                    (l.chunk_bytes, l.nccl_min_bytes, u64::from(l.rtt_us)),
                                    (i, i, i),
                                    "a torn copy"
                                );
                                copies += 1;
                            }
                            Read::Busy => busy += 1,
                            _ => panic!("the board should stay fresh"),
                        }
                    }
                    (copies, busy)
                })
            })
            .collect();
        let seq = |b: usize| {
            // SAFETY: the seqlock word of the live mapping.
            unsafe { &*((b + offsets::SEQ) as *const AtomicU64) }
        };
        for i in 2..=3000u64 {
            let new = slot(i);
            // SAFETY: viewing a plain repr(C) value as bytes.
            let bytes = unsafe {
                std::slice::from_raw_parts((&raw const new).cast::<u8>(), size_of::<BoardLink>())
            };
            seq(base).fetch_add(1, Ordering::AcqRel);
            for (k, b) in bytes.iter().enumerate() {
                // SAFETY: slot 0 of the mapping.
                unsafe { std::ptr::write_volatile((base + offsets::LINKS + k) as *mut u8, *b) };
                for _ in 0..20 {
                    std::hint::spin_loop();
                }
            }
            seq(base).fetch_add(1, Ordering::Release);
            // A stable stretch between writes, as the daemon's board has most of the time.
            let t = std::time::Instant::now();
            while t.elapsed() < Duration::from_micros(5) {
                std::hint::spin_loop();
            }
        }
        done.store(true, Ordering::Release);
        let (copies, _busy) = readers
            .into_iter()
            .map(|r| r.join().unwrap())
            .fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
        assert!(copies > 100, "the readers should get many stable copies: {copies}");
        // SAFETY: unmapping the test's own mapping; the plugin's goes at teardown.
        unsafe { libc::munmap(base as *mut libc::c_void, SIZE) };
        teardown();
        drop(w);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
