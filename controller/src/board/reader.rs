//! A reader's side of the board (tests, `linkpilot status`, the layout's reference): checks
//! that the file is a board of this layout, copies it under the seqlock, and says whether the
//! daemon behind it still beats.

use std::{
    fs, io,
    path::Path,
    sync::atomic::{fence, Ordering},
    time::{Duration, Instant},
};

use linkpilot_common::board::{Board, BoardHeader, BOARD_MAGIC, BOARD_NAME_LEN, BOARD_VERSION};

use super::{Mapping, SIZE};

/// Why a board could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BoardError {
    #[error("reading the knob board {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path} is not a knob board (magic {magic:?})")]
    Magic { path: String, magic: [u8; 8] },
    #[error("{path}: board layout version {found}, this reader knows {BOARD_VERSION}")]
    Version { path: String, found: u32 },
    #[error(
        "{path}: no stable copy within {waited_ms} ms (the writer died mid-write, or kept writing)"
    )]
    Busy { path: String, waited_ms: u128 },
}

/// How long a read waits out a write in progress. A write takes microseconds, but a writer
/// descheduled halfway on a loaded node resumes only after other tasks' slices (milliseconds);
/// a sequence number odd for longer than this is a writer that died mid-write.
pub const PATIENCE: Duration = Duration::from_millis(200);

/// Attempts that only spin before a failed attempt starts to sleep, giving the CPU to a writer
/// that may be waiting for it.
const SPINS: u32 = 64;

/// A reader's view: a stable copy of the board.
pub struct BoardReader {
    map: Mapping,
    path: String,
}

impl BoardReader {
    pub fn open(path: &Path) -> Result<Self, BoardError> {
        let p = path.display().to_string();
        let io = |source| BoardError::Io { path: p.clone(), source };
        let file = fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < SIZE as u64 {
            return Err(io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{len} bytes, a board has {SIZE}"),
            )));
        }
        let map = Mapping::new(&file, false).map_err(io)?;
        // Magic and version never change after creation: check them once, before trusting the
        // sequence number.
        // SAFETY: the mapping holds at least a header.
        let header = unsafe { std::ptr::read_volatile(map.ptr.as_ptr().cast::<BoardHeader>()) };
        if header.magic != BOARD_MAGIC {
            return Err(BoardError::Magic { path: p, magic: header.magic });
        }
        if header.version != BOARD_VERSION {
            return Err(BoardError::Version { path: p, found: header.version });
        }
        Ok(Self { map, path: p })
    }

    /// A copy no write was in progress for, or `Busy` after [`PATIENCE`].
    pub fn read(&self) -> Result<Board, BoardError> {
        let start = Instant::now();
        let mut attempt = 0u32;
        loop {
            attempt = attempt.saturating_add(1);
            if attempt > 1 {
                let waited = start.elapsed();
                if waited >= PATIENCE {
                    let waited_ms = waited.as_millis();
                    return Err(BoardError::Busy { path: self.path.clone(), waited_ms });
                }
                if attempt < SPINS {
                    std::hint::spin_loop();
                } else {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
            let s1 = self.map.seq().load(Ordering::Acquire);
            if s1 & 1 == 1 {
                continue;
            }
            // SAFETY: the mapping holds one Board; a torn copy is detected below and dropped.
            let copy = unsafe { std::ptr::read_volatile(self.map.ptr.as_ptr()) };
            fence(Ordering::Acquire);
            if self.map.seq().load(Ordering::Relaxed) != s1 {
                continue;
            }
            if copy.header.magic != BOARD_MAGIC {
                return Err(BoardError::Magic {
                    path: self.path.clone(),
                    magic: copy.header.magic,
                });
            }
            if copy.header.version != BOARD_VERSION {
                return Err(BoardError::Version {
                    path: self.path.clone(),
                    found: copy.header.version,
                });
            }
            return Ok(copy);
        }
    }
}

/// Whether the daemon behind `board` missed two heartbeats by `now_ns` (CLOCK_MONOTONIC).
pub fn is_stale(board: &Board, now_ns: u64) -> bool {
    let interval = u64::from(board.header.heartbeat_interval_ms.max(1)) * 1_000_000;
    now_ns.saturating_sub(board.header.heartbeat_ns) > 2 * interval
}

/// A NUL-padded name as text.
pub fn name(bytes: &[u8; BOARD_NAME_LEN]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(BOARD_NAME_LEN);
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}
