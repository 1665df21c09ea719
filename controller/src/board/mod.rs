//! The knob board's writer (the daemon) and a reader (tests, `linkpilot status`, the layout's
//! reference for docs/knob-board.md). The file is mapped shared; every write goes under the
//! seqlock in the header, so a reader copying the board while the daemon writes sees the old
//! or the new values, never a mix. This file holds the mapping both sides share and the tests
//! of the seqlock between them; `writer.rs`, `reader.rs` and `slot.rs` (a link's decision as a
//! slot) hold the rest.

pub mod drop_dir;
pub mod feed;
pub mod job_flows;
pub mod job_reports;
pub mod tuner_stats;

mod reader;
mod slot;
mod writer;

use std::{fs, io, os::fd::AsRawFd, ptr::NonNull, sync::atomic::AtomicU64};

use linkpilot_common::board::{offsets, Board};

pub use reader::{is_stale, name, BoardError, BoardReader};
pub(crate) use slot::compression_code;
pub use slot::{board_link, bps, link_of, rtt_us, set_nccl, set_sync_facts};
pub use writer::BoardWriter;

/// Where the daemon keeps the board.
pub const DEFAULT_PATH: &str = "/run/linkpilot/knobs";

const SIZE: usize = std::mem::size_of::<Board>();

/// A shared, writable mapping of a board file.
struct Mapping {
    ptr: NonNull<Board>,
}

// SAFETY: the mapping is plain shared memory; access goes through the seqlock.
unsafe impl Send for Mapping {}

impl Mapping {
    fn new(file: &fs::File, writable: bool) -> io::Result<Self> {
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        // SAFETY: a fresh mapping of SIZE bytes of an open file; checked for failure below.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), SIZE, prot, libc::MAP_SHARED, file.as_raw_fd(), 0)
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        NonNull::new(p.cast::<Board>())
            .map(|ptr| Self { ptr })
            .ok_or_else(|| io::Error::other("mmap returned null"))
    }

    fn seq(&self) -> &AtomicU64 {
        // SAFETY: `seq` is an 8-byte aligned u64 at a fixed offset of a live mapping.
        unsafe { &*self.ptr.as_ptr().cast::<u8>().add(offsets::SEQ).cast::<AtomicU64>() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `new` mapped.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), SIZE) };
    }
}

#[cfg(test)]
mod tests {
    use std::{
        path::PathBuf,
        sync::{
            atomic::{AtomicBool, Ordering},
            Arc,
        },
        time::Duration,
    };

    use linkpilot_common::board::BoardLink;

    use super::*;
    use crate::control::{Compression, Knobs};

    fn temp_path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("lp-board-{}-{name}", std::process::id())).join("knobs")
    }

    fn knobs(i: u64) -> Knobs {
        Knobs {
            compression: if i.is_multiple_of(2) {
                Compression::Int8
            } else {
                Compression::TopK(0.01)
            },
            chunk_bytes: i,
            nccl_ib_timeout: (i % 31) as u8,
            nccl_ib_retry_cnt: 7,
            watchdog_s: i as u32,
            dscp: Some((i % 64) as u8),
            roce_traffic_class: Some((i % 256) as u8),
            tcp_buffer_bytes: 2 * i,
            sync: Default::default(),
            transport: None,
        }
    }

    #[test]
    fn readers_never_see_a_torn_board() {
        let path = temp_path("torn");
        let mut w = BoardWriter::create(&path, Duration::from_millis(100), 1).unwrap();
        let r = BoardReader::open(&path).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let stop = done.clone();
        let writer = std::thread::spawn(move || {
            for i in 1..=200_000u64 {
                let links: Vec<BoardLink> = (0..3)
                    .map(|l| board_link(&format!("link{l}"), "congested", 1, &knobs(i), i))
                    .collect();
                w.publish(&links, i);
            }
            stop.store(true, Ordering::Release);
            w
        });
        let (mut reads, mut last) = (0u64, 0u64);
        while !done.load(Ordering::Acquire) {
            let Ok(b) = r.read() else { continue };
            reads += 1;
            let id = b.header.decision_id;
            assert!(id >= last, "decision ids went back: {id} after {last}");
            last = id;
            for l in &b.links[..b.header.n_links as usize] {
                // Every field of a slot comes from the same write.
                assert_eq!((l.decision_id, l.chunk_bytes, l.tcp_buffer_bytes), (id, id, 2 * id));
                assert_eq!(u64::from(l.watchdog_s), id);
                assert_eq!(b.header.heartbeat_ns, id);
            }
        }
        let w = writer.join().unwrap();
        assert!(reads > 100, "the reader should get many stable copies: {reads}");
        let b = r.read().unwrap();
        assert_eq!((b.header.decision_id, name(&b.links[2].name)), (200_000, "link2".into()));
        assert_eq!(b.header.seq % 2, 0);
        let _ = fs::remove_dir_all(w.path().parent().unwrap());
    }

    /// A writer descheduled mid-write (the sequence number left odd for milliseconds, as on a
    /// loaded node) is waited for; one that never finishes is `Busy` after the patience.
    #[test]
    fn a_write_left_half_done_is_waited_out_and_one_never_finished_is_busy() {
        let path = temp_path("halfdone");
        let w = BoardWriter::create(&path, Duration::from_millis(100), 7).unwrap();
        let r = BoardReader::open(&path).unwrap();
        let file = fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let raw = Mapping::new(&file, true).unwrap();
        let even = raw.seq().load(Ordering::Acquire);
        raw.seq().store(even + 1, Ordering::Release);
        let finisher = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            raw.seq().store(even + 2, Ordering::Release);
            raw
        });
        let started = std::time::Instant::now();
        let b = r.read().unwrap();
        assert!(started.elapsed() >= Duration::from_millis(20), "read before the write ended");
        assert_eq!((b.header.seq, b.header.heartbeat_ns), (even + 2, 7));
        let raw = finisher.join().unwrap();
        raw.seq().store(even + 3, Ordering::Release);
        let started = std::time::Instant::now();
        let e = r.read().unwrap_err().to_string();
        assert!(started.elapsed() >= reader::PATIENCE, "{e}");
        assert!(e.contains("no stable copy within") && e.contains("died mid-write"), "{e}");
        drop(w);
        let _ = fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn staleness_after_two_missed_heartbeats() {
        let path = temp_path("stale");
        let mut w = BoardWriter::create(&path, Duration::from_millis(100), 1_000_000_000).unwrap();
        let r = BoardReader::open(&path).unwrap();
        let b = r.read().unwrap();
        assert!(!is_stale(&b, 1_000_000_000 + 200_000_000));
        assert!(is_stale(&b, 1_000_000_000 + 200_000_001));
        w.heartbeat(1_300_000_000);
        assert!(!is_stale(&r.read().unwrap(), 1_450_000_000));
        let _ = fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn not_a_board() {
        let path = temp_path("junk");
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, vec![7u8; SIZE]).unwrap();
        let err = BoardReader::open(&path).err().unwrap().to_string();
        assert!(err.contains("not a knob board"), "{err}");
        fs::write(&path, b"short").unwrap();
        let err = BoardReader::open(&path).err().unwrap().to_string();
        assert!(err.contains("a board has"), "{err}");
        let _ = fs::remove_dir_all(path.parent().unwrap());
    }
}

#[cfg(test)]
mod python_tests;
