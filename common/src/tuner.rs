//! The NCCL tuner plugin's counter area: one small file per training process
//! (`/run/linkpilot/tuner/<pid>`, or `$LINKPILOT_TUNER_STATS/<pid>`) in which the plugin records
//! what it chose for each collective type and size class, so `linkpilot status` and the metrics
//! can show that NCCL followed the board. The plugin maps the file shared and updates it with
//! relaxed atomic stores (no system call on NCCL's call path); the daemon reads it with `read`.
//! Little endian, `#[repr(C)]`, offsets asserted below.

/// First bytes of the file.
pub const TUNER_MAGIC: [u8; 8] = *b"LPTUNER\0";
pub const TUNER_VERSION: u32 = 1;
/// Collective slots: NCCL's Broadcast 0, Reduce 1, AllGather 2, ReduceScatter 3, AllReduce 4,
/// and one for every other value (never tuned).
pub const COLL_SLOTS: usize = 6;
/// The slot of collective types the plugin does not know.
pub const COLL_OTHER: usize = 5;
/// Collective names by slot.
pub const COLLS: [&str; COLL_SLOTS] =
    ["broadcast", "reduce", "allgather", "reducescatter", "allreduce", "other"];
/// Size classes: class `c` holds collectives of `2^c` to `2^(c+1) - 1` bytes (0 bytes in class
/// 0); the last class holds everything from `2^(SIZE_CLASSES - 1)` bytes on.
pub const SIZE_CLASSES: usize = 40;

/// The size class of a collective of `bytes`.
pub const fn size_class(bytes: u64) -> usize {
    let c = if bytes == 0 { 0 } else { bytes.ilog2() as usize };
    if c < SIZE_CLASSES {
        c
    } else {
        SIZE_CLASSES - 1
    }
}

/// Bits of [`TunerEntry::choice`]: the algorithm (bits 0-7), protocol (8-15) and channel count
/// (16-23) the plugin asked for ([`crate::board::nccl::ANY`] / 0: none), and flags (24-31).
pub mod choice {
    /// Set on every recorded choice (a zero word means "never called").
    pub const SEEN: u32 = 1 << 24;
    /// The board was fresh: the choice follows it (without: NCCL's own choice, board unusable).
    pub const BOARD: u32 = 1 << 25;
    /// The collective is below the board's `nccl_min_bytes`: NCCL's own choice.
    pub const SMALL: u32 = 1 << 26;
    /// NCCL's cost table allowed none of the preferred algorithm/protocol combinations.
    pub const NOT_ALLOWED: u32 = 1 << 27;

    pub const fn pack(algo: u8, proto: u8, channels: u8, flags: u32) -> u32 {
        algo as u32 | (proto as u32) << 8 | (channels as u32) << 16 | flags
    }
    pub const fn algo(word: u32) -> u8 {
        word as u8
    }
    pub const fn proto(word: u32) -> u8 {
        (word >> 8) as u8
    }
    pub const fn channels(word: u32) -> u8 {
        (word >> 16) as u8
    }
}

/// Board states of [`TunerHeader::board`].
pub mod board_state {
    pub const NEVER_READ: u32 = 0;
    pub const FRESH: u32 = 1;
    pub const MISSING: u32 = 2;
    pub const STALE: u32 = 3;
    /// Another file, another layout version, or cut short.
    pub const FOREIGN: u32 = 4;
    /// The file exists but cannot be opened or mapped.
    pub const UNREADABLE: u32 = 5;
    /// Names by value.
    pub const NAMES: [&str; 6] =
        ["never read", "fresh", "missing", "stale", "foreign", "unreadable"];
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TunerHeader {
    pub magic: [u8; 8],
    pub version: u32,
    /// Size of the whole file.
    pub size: u32,
    pub pid: u32,
    /// Communicators with the plugin initialised in this process now.
    pub communicators: u32,
    /// getCollInfo calls that kept NCCL's own choice because there was no fresh board (all
    /// calls: the sum of the entries' `calls`; counted apart so that a call following the
    /// board costs one atomic add, its entry's).
    pub own_calls: u64,
    /// getChunkSize calls likewise.
    pub own_chunk_calls: u64,
    /// The newest decision id a call acted on.
    pub decision_id: u64,
    /// The board as the last call found it ([`board_state`]).
    pub board: u32,
    /// NCCL_BUFFSIZE as the plugin read it at the latest init, KiB.
    pub buffsize_kib: u32,
    pub _reserved: u64,
}

/// What the plugin did for one (collective, size class).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TunerEntry {
    /// The latest getCollInfo outcome ([`choice`] bits).
    pub choice: u32,
    pub _pad: u32,
    pub calls: u64,
    /// The decision behind the latest change of `choice`.
    pub decision_id: u64,
    /// The latest chunk size getChunkSize asked for, bytes (0: NCCL's own).
    pub chunk: u64,
    pub chunk_calls: u64,
    /// The decision behind the latest change of `chunk`.
    pub chunk_decision_id: u64,
}

/// The whole file.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TunerStats {
    pub header: TunerHeader,
    pub entries: [[TunerEntry; SIZE_CLASSES]; COLL_SLOTS],
}

pub const TUNER_SIZE: usize = core::mem::size_of::<TunerStats>();

const _: () = assert!(core::mem::size_of::<TunerHeader>() == 64);
const _: () = assert!(core::mem::offset_of!(TunerHeader, own_calls) == 24);
const _: () = assert!(core::mem::offset_of!(TunerHeader, board) == 48);
const _: () = assert!(core::mem::size_of::<TunerEntry>() == 48);
const _: () = assert!(TUNER_SIZE == 64 + COLL_SLOTS * SIZE_CLASSES * 48);
