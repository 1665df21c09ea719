//! The daemon's side of the board: creates the file whole, then publishes every decision and
//! heartbeat under the seqlock, so that readers copy either the old board or the new one.

use std::{
    fs,
    io::{self, Write},
    path::{Path, PathBuf},
    sync::atomic::{fence, Ordering},
    time::Duration,
};

use linkpilot_common::board::{
    Board, BoardHeader, BoardLink, BOARD_MAGIC, BOARD_MAX_LINKS, BOARD_VERSION,
};

use super::{Mapping, SIZE};

/// The daemon's side.
pub struct BoardWriter {
    map: Mapping,
    path: PathBuf,
    board: Board,
}

impl BoardWriter {
    /// Creates (or replaces) the board at `path` with no links: written whole to a temporary
    /// file and renamed into place, so a reader never maps a half-written file. Readers that
    /// still map a previous daemon's board see its heartbeat stop and reopen.
    pub fn create(path: &Path, heartbeat: Duration, now_ns: u64) -> io::Result<Self> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        let header = BoardHeader {
            magic: BOARD_MAGIC,
            version: BOARD_VERSION,
            size: SIZE as u32,
            seq: 0,
            heartbeat_ns: now_ns,
            heartbeat_interval_ms: heartbeat.as_millis().min(u128::from(u32::MAX)) as u32,
            pid: std::process::id(),
            decision_id: 0,
            n_links: 0,
            pending: 0,
        };
        let board = Board { header, links: [BoardLink::default(); BOARD_MAX_LINKS] };
        // SAFETY: Board is repr(C) plain data without padding holes (size asserted in common).
        let bytes = unsafe { std::slice::from_raw_parts((&raw const board).cast::<u8>(), SIZE) };
        let mut tmp = crate::actuate::files::temp_beside(path)?;
        tmp.write_all(bytes)?;
        // The renamed file itself is mapped, never whatever the path names by then.
        let file = tmp.persist(path).map_err(|e| e.error)?;
        let map = Mapping::new(&file, true)?;
        Ok(Self { map, path: path.to_owned(), board })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the current board under the seqlock.
    fn write(&mut self) {
        let seq = self.map.seq();
        let s = seq.load(Ordering::Relaxed);
        seq.store(s.wrapping_add(1) | 1, Ordering::Relaxed); // odd: writing
        fence(Ordering::Release);
        self.board.header.seq = s.wrapping_add(1) | 1;
        // SAFETY: the mapping holds one Board; readers retry on the odd sequence number.
        unsafe { std::ptr::write_volatile(self.map.ptr.as_ptr(), self.board) };
        fence(Ordering::Release);
        let next = (s.wrapping_add(1) | 1).wrapping_add(1);
        self.board.header.seq = next;
        seq.store(next, Ordering::Release); // even: stable
    }

    /// Publishes every link's decision (at most [`BOARD_MAX_LINKS`]) and beats.
    pub fn publish(&mut self, links: &[BoardLink], now_ns: u64) {
        let n = links.len().min(BOARD_MAX_LINKS);
        self.board.links[..n].copy_from_slice(&links[..n]);
        for l in &mut self.board.links[n..] {
            *l = BoardLink::default();
        }
        self.board.header.n_links = n as u32;
        self.board.header.decision_id = links
            .iter()
            .map(|l| l.decision_id)
            .max()
            .unwrap_or(0)
            .max(self.board.header.decision_id);
        self.board.header.heartbeat_ns = now_ns;
        self.write();
    }

    /// Sets the [`linkpilot_common::board::pending`] bits the next write carries.
    pub fn set_pending(&mut self, bits: u32) {
        self.board.header.pending = bits;
    }

    /// Changes the heartbeat interval readers judge staleness by (a reloaded policy's tick).
    pub fn set_heartbeat_interval(&mut self, heartbeat: Duration, now_ns: u64) {
        self.board.header.heartbeat_interval_ms =
            heartbeat.as_millis().min(u128::from(u32::MAX)) as u32;
        self.heartbeat(now_ns);
    }

    /// Tells readers the daemon is alive.
    pub fn heartbeat(&mut self, now_ns: u64) {
        self.board.header.heartbeat_ns = now_ns;
        self.write();
    }
}
