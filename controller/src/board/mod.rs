//! The knob board's writer (the daemon) and a reader (tests, `linkpilot status`, the layout's
//! reference for docs/knob-board.md). The file is mapped shared; every write goes under the
//! seqlock in the header, so a reader copying the board while the daemon writes sees the old
//! or the new values, never a mix.

pub mod drop_dir;
pub mod feed;
pub mod job_flows;
pub mod job_reports;
pub mod tuner_stats;

use std::{
    fs,
    io::{self, Write},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    ptr::NonNull,
    sync::atomic::{fence, AtomicU64, Ordering},
    time::Duration,
};

use linkpilot_common::board::{
    compression as code, nccl, offsets, Board, BoardHeader, BoardLink, BOARD_MAGIC,
    BOARD_MAX_LINKS, BOARD_NAME_LEN, BOARD_VERSION,
};

use crate::control::{
    plan::{LinkPlan, SyncBounds},
    policy::NcclRule,
    Compression, Knobs,
};

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

/// The daemon's side.
pub struct BoardWriter {
    map: Mapping,
    path: PathBuf,
    board: Board,
}

fn name_bytes(s: &str) -> [u8; BOARD_NAME_LEN] {
    let mut out = [0u8; BOARD_NAME_LEN];
    let n = s.len().min(BOARD_NAME_LEN - 1);
    out[..n].copy_from_slice(&s.as_bytes()[..n]);
    out
}

/// The board's form of one link's decision.
/// A compression as the board's code and top-k ratio.
pub(crate) fn compression_code(c: Compression) -> (u32, f64) {
    match c {
        Compression::None => (code::NONE, 0.0),
        Compression::Fp16 => (code::FP16, 0.0),
        Compression::Bf16 => (code::BF16, 0.0),
        Compression::Int8 => (code::INT8, 0.0),
        Compression::Int4 => (code::INT4, 0.0),
        Compression::TopK(r) => (code::TOPK, r),
    }
}

pub fn board_link(link: &str, state: &str, state_index: u32, k: &Knobs, id: u64) -> BoardLink {
    let (compression, topk_ratio) = compression_code(k.compression);
    let (outer_compression, outer_topk_ratio) = compression_code(k.sync.outer_compression);
    BoardLink {
        name: name_bytes(link),
        state: name_bytes(state),
        state_index,
        compression,
        topk_ratio,
        chunk_bytes: k.chunk_bytes,
        tcp_buffer_bytes: k.tcp_buffer_bytes,
        watchdog_s: k.watchdog_s,
        nccl_ib_timeout: k.nccl_ib_timeout,
        nccl_ib_retry_cnt: k.nccl_ib_retry_cnt,
        dscp: k.dscp.unwrap_or(linkpilot_common::board::KEEP),
        roce_traffic_class: k.roce_traffic_class.unwrap_or(linkpilot_common::board::KEEP),
        decision_id: id,
        sync_every: k.sync.sync_every,
        outer_compression,
        outer_topk_ratio,
        outer_codec_auto: u8::from(k.sync.outer_codec_auto),
        fragments: k.sync.fragments,
        overlap: k.sync.overlap,
        ..BoardLink::default()
    }
}

/// A link's plan as its board slot: its knobs, the NCCL rule and RTT for the tuner plugin, and
/// what "auto" sync sizes its rounds by. The busiest tick's rate, not the average: a job syncing
/// every H steps sends in bursts, and an average would make "auto" H grow without end.
pub fn link_of(p: &LinkPlan, sync: &SyncBounds) -> BoardLink {
    let mut l = board_link(&p.link, &p.state, p.state_index, &p.knobs, p.decision);
    set_nccl(&mut l, p.nccl, p.nccl_min_bytes, p.baseline_ms);
    set_sync_facts(&mut l, sync, p.burst_bps, p.capacity_bps.unwrap_or(0.0));
    l
}

/// Sets what the training side's "auto" synchronization needs beside the knobs: the policy's
/// bounds on H, its margin and drift bound, and the link's measured and nominal rates.
pub fn set_sync_facts(l: &mut BoardLink, b: &SyncBounds, delivery_bps: f64, capacity_bps: f64) {
    l.sync_min = b.sync_min;
    l.sync_max = b.sync_max;
    l.sync_margin_bp = (b.sync_margin * 1e4).round().clamp(0.0, f64::from(u16::MAX)) as u16;
    l.max_drift = b.max_drift;
    // A top-k weakest bound leaves none weaker than the strongest to choose: its code suffices.
    l.outer_weakest = compression_code(b.codec_weakest).0 as u8;
    l.delivery_bps = bps(delivery_bps);
    l.capacity_bps = bps(capacity_bps);
}

/// A rate as the board's whole bit/s (0: not measured).
pub fn bps(v: f64) -> u64 {
    if v.is_finite() && v > 0.0 {
        v.round().min(u64::MAX as f64) as u64
    } else {
        0
    }
}

/// Sets what the NCCL tuner plugin reads: the state's `[nccl]` rule, the policy's `min_bytes`
/// and the link's RTT baseline (`None`: not measured yet).
pub fn set_nccl(l: &mut BoardLink, rule: NcclRule, min_bytes: u64, rtt_ms: Option<f64>) {
    l.nccl_algo = rule.algo.unwrap_or(nccl::ANY);
    l.nccl_proto = rule.proto.unwrap_or(nccl::ANY);
    l.nccl_max_channels = rule.max_channels;
    l.nccl_min_bytes = min_bytes;
    l.rtt_us = rtt_us(rtt_ms);
}

/// An RTT in ms as the board's microseconds (0: not measured).
pub fn rtt_us(rtt_ms: Option<f64>) -> u32 {
    rtt_ms
        .filter(|v| v.is_finite() && *v > 0.0)
        .map_or(0, |v| (v * 1e3).round().min(u32::MAX as f64) as u32)
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

/// Why a board could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BoardError {
    #[error("reading the knob board {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path} is not a knob board (magic {magic:?})")]
    Magic { path: String, magic: [u8; 8] },
    #[error("{path}: board layout version {found}, this reader knows {BOARD_VERSION}")]
    Version { path: String, found: u32 },
    #[error("{path}: the daemon kept writing; no stable copy after {tries} tries")]
    Busy { path: String, tries: u32 },
}

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

    /// A copy no write was in progress for, or `Busy` after `tries` attempts.
    pub fn read(&self, tries: u32) -> Result<Board, BoardError> {
        for _ in 0..tries {
            let s1 = self.map.seq().load(Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
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
        Err(BoardError::Busy { path: self.path.clone(), tries })
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

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
            let Ok(b) = r.read(1000) else { continue };
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
        let b = r.read(10).unwrap();
        assert_eq!((b.header.decision_id, name(&b.links[2].name)), (200_000, "link2".into()));
        assert_eq!(b.header.seq % 2, 0);
        let _ = fs::remove_dir_all(w.path().parent().unwrap());
    }

    #[test]
    fn staleness_after_two_missed_heartbeats() {
        let path = temp_path("stale");
        let mut w = BoardWriter::create(&path, Duration::from_millis(100), 1_000_000_000).unwrap();
        let r = BoardReader::open(&path).unwrap();
        let b = r.read(10).unwrap();
        assert!(!is_stale(&b, 1_000_000_000 + 200_000_000));
        assert!(is_stale(&b, 1_000_000_000 + 200_000_001));
        w.heartbeat(1_300_000_000);
        assert!(!is_stale(&r.read(10).unwrap(), 1_450_000_000));
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
mod python_tests {
    use super::*;
    use crate::control::SyncKnobs;

    /// Reads the board at argv[1] with the Python package's reader, as JSON. Only the standard
    /// library may be needed: the reader is for processes without torch too.
    const READ: &str = r#"
import dataclasses, json, sys
from linkpilot.board import KnobBoard
with KnobBoard(sys.argv[1]) as board:
    snap = board.read()
assert "torch" not in sys.modules, "linkpilot.board imported torch"
out = dataclasses.asdict(snap)
out["codecs"] = [k.codec for k in snap.links]
print(json.dumps(out))
"#;

    #[test]
    fn the_python_package_reader_agrees() {
        let dir = std::env::temp_dir().join(format!("lp-board-py-{}", std::process::id()));
        let path = dir.join("knobs");
        let now = crate::kernel::probes::monotonic_ns();
        let mut w = BoardWriter::create(&path, Duration::from_secs(60), now).unwrap();
        let k = Knobs {
            compression: Compression::TopK(0.01),
            chunk_bytes: 8 << 20,
            nccl_ib_timeout: 22,
            nccl_ib_retry_cnt: 7,
            watchdog_s: 1800,
            dscp: Some(26),
            roce_traffic_class: Some(106),
            tcp_buffer_bytes: 128 << 20,
            sync: SyncKnobs {
                sync_every: 0,
                outer_compression: Compression::TopK(0.02),
                outer_codec_auto: true,
                fragments: 4,
                overlap: 3,
            },
            transport: None,
        };
        let k2 = Knobs { compression: Compression::Int4, sync: SyncKnobs::default(), ..k };
        let mut hk = board_link("hk-us", "severe", 3, &k, 42);
        let rule = NcclRule {
            algo: Some(nccl::ALGO_TREE),
            proto: Some(nccl::PROTO_SIMPLE),
            max_channels: 4,
        };
        set_nccl(&mut hk, rule, 1 << 20, Some(180.25));
        let policy = crate::control::Policy::parse(
            "[bounds]\nsync_every = { min = 8, max = 400, margin = \"25%\", max_drift = 1600 }\n\
             compression = { weakest = \"fp16\", strongest = \"topk:2%\" }\n\
             [[link]]\nname = \"hk-us\"\ninterfaces = [\"eth0\"]\ncapacity = \"40Gbit/s\"\n\
             [[state]]\nname = \"healthy\"\n[state.knobs]\ncompression = \"none\"\ndscp = 26\n\
             roce_traffic_class = 106\n",
            "test",
        )
        .unwrap();
        set_sync_facts(&mut hk, &SyncBounds::of(&policy.bounds), 2.5e8, 4e10);
        w.set_pending(linkpilot_common::board::pending::SYSCTL);
        w.publish(&[hk, board_link("eu", "x", 1, &k2, 9)], now);
        let python = concat!(env!("CARGO_MANIFEST_DIR"), "/../python");
        let out = std::process::Command::new("python3")
            .env("PYTHONPATH", python)
            .args(["-c", READ])
            .arg(&path)
            .output()
            .unwrap();
        let _ = fs::remove_dir_all(&dir);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            (v["stale"].as_bool(), v["pid"].as_u64()),
            (Some(false), Some(std::process::id().into())),
            "{v}"
        );
        assert_eq!((v["decision_id"].as_u64(), v["heartbeat_ns"].as_u64()), (Some(42), Some(now)));
        assert_eq!(v["heartbeat_interval_ms"].as_u64(), Some(60_000));
        assert_eq!(v["pending"], serde_json::json!(["sysctl"]));
        assert_eq!(v["codecs"], serde_json::json!(["topk:0.01", "int4"]));
        let l = &v["links"][0];
        assert_eq!((l["name"].as_str(), l["state"].as_str()), (Some("hk-us"), Some("severe")));
        assert_eq!((l["state_index"].as_u64(), l["compression"].as_str()), (Some(3), Some("topk")));
        assert_eq!(l["topk_ratio"].as_f64(), Some(0.01));
        assert_eq!(
            (l["chunk_bytes"].as_u64(), l["tcp_buffer_bytes"].as_u64()),
            (Some(8 << 20), Some(128 << 20))
        );
        assert_eq!(
            (
                l["watchdog_s"].as_u64(),
                l["nccl_ib_timeout"].as_u64(),
                l["nccl_ib_retry_cnt"].as_u64()
            ),
            (Some(1800), Some(22), Some(7))
        );
        assert_eq!((l["dscp"].as_u64(), l["roce_traffic_class"].as_u64()), (Some(26), Some(106)));
        assert_eq!(l["decision_id"].as_u64(), Some(42));
        assert_eq!(
            (l["nccl_algo"].as_str(), l["nccl_proto"].as_str(), l["nccl_max_channels"].as_u64()),
            (Some("tree"), Some("simple"), Some(4))
        );
        assert_eq!(
            (l["nccl_min_bytes"].as_u64(), l["rtt_us"].as_u64()),
            (Some(1 << 20), Some(180_250))
        );
        assert_eq!(
            (l["sync_every"].as_u64(), l["sync_min"].as_u64(), l["sync_max"].as_u64()),
            (Some(0), Some(8), Some(400))
        );
        assert_eq!(
            (l["sync_margin"].as_f64(), l["max_drift"].as_u64(), l["outer_codec"].as_str()),
            (Some(0.25), Some(1600), Some("topk:0.02"))
        );
        assert_eq!((l["fragments"].as_u64(), l["overlap"].as_u64()), (Some(4), Some(3)));
        // outer_codec = "auto": the training side chooses from fp16 to top-k 2%.
        assert_eq!(
            (l["outer_codec_auto"].as_bool(), l["outer_weakest"].as_str()),
            (Some(true), Some("fp16"))
        );
        assert_eq!(
            (l["delivery_bps"].as_u64(), l["capacity_bps"].as_u64()),
            (Some(250_000_000), Some(40_000_000_000))
        );
        let e = &v["links"][1];
        assert_eq!(
            (e["name"].as_str(), e["state_index"].as_u64(), e["decision_id"].as_u64()),
            (Some("eu"), Some(1), Some(9))
        );
        assert_eq!(
            (e["sync_every"].as_u64(), e["fragments"].as_u64(), e["outer_codec"].as_str()),
            (Some(1), Some(1), Some("int8"))
        );
        assert_eq!(e["outer_codec_auto"].as_bool(), Some(false));
        // No [nccl] rule: NCCL's own choices.
        assert_eq!(
            (e["nccl_algo"].as_str(), e["nccl_proto"].as_str()),
            (Some("auto"), Some("auto"))
        );
    }
}
