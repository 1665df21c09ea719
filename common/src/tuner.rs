//! The NCCL tuner plugin's counter area: one small file per training process
//! (`/run/linkpilot/tuner/<pid>-<random>`, or under `$LINKPILOT_TUNER_STATS`) in which the plugin
//! records what it chose for each collective type and size class, so `linkpilot status` and the
//! metrics can show which processes have the plugin loaded and that NCCL followed the decision
//! their ranks adopted. The plugin counts in its own memory with relaxed atomics (no system call
//! on NCCL's call path) and writes the whole area into the file once a second with `pwrite`,
//! from a thread of its own; it holds an exclusive `flock` on the file while it lives, which is
//! how the daemon tells a live process's file from a dead one's (in any PID namespace). The
//! daemon reads the file with `read`. Little endian, `#[repr(C)]`, offsets asserted below.

/// First bytes of the file.
pub const TUNER_MAGIC: [u8; 8] = *b"LPTUNER\0";
pub const TUNER_VERSION: u32 = 2;
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
    /// A decision was adopted: the choice follows it (without: NCCL's own choice).
    pub const ADOPTED: u32 = 1 << 25;
    /// The collective is below the adopted decision's `min_bytes`: NCCL's own choice.
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

/// What the process's calls follow ([`TunerHeader::adoption`]).
pub mod adoption {
    /// No decision adopted yet: NCCL's own choices (no linkpilot training code drives the gate,
    /// or it has not reached its first step).
    pub const NONE_YET: u32 = 0;
    /// A decision the training code adopted at a step boundary, the same on every rank.
    pub const ADOPTED: u32 = 1;
    /// The training code withdrew it (its ranks' boards were not all fresh): NCCL's own.
    pub const WITHDRAWN: u32 = 2;
    /// Names by value.
    pub const NAMES: [&str; 3] = ["none yet", "adopted", "withdrawn"];
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
    /// getCollInfo calls that kept NCCL's own choice because no decision was adopted (all
    /// calls: the sum of the entries' `calls`; counted apart so that a call following the
    /// decision costs one atomic add, its entry's).
    pub own_calls: u64,
    /// getChunkSize calls likewise.
    pub own_chunk_calls: u64,
    /// The training step from which the current decision applies (0: none adopted).
    pub adopted_step: u64,
    /// What the calls follow now ([`adoption`]).
    pub adoption: u32,
    /// NCCL_BUFFSIZE as the plugin read it at the latest init, KiB.
    pub buffsize_kib: u32,
    /// Times the training code adopted or withdrew a decision.
    pub adoptions: u64,
}

/// What the plugin did for one (collective, size class).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TunerEntry {
    /// The latest getCollInfo outcome ([`choice`] bits).
    pub choice: u32,
    pub _pad: u32,
    pub calls: u64,
    /// The adopted step behind the latest change of `choice`.
    pub step: u64,
    /// The latest chunk size getChunkSize asked for, bytes (0: NCCL's own).
    pub chunk: u64,
    pub chunk_calls: u64,
    /// The adopted step behind the latest change of `chunk`.
    pub chunk_step: u64,
}

/// The whole file.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TunerStats {
    pub header: TunerHeader,
    pub entries: [[TunerEntry; SIZE_CLASSES]; COLL_SLOTS],
}

pub const TUNER_SIZE: usize = core::mem::size_of::<TunerStats>();

impl TunerHeader {
    /// A header that names this layout and `pid`, every count zero.
    pub fn new(pid: u32) -> Self {
        Self {
            magic: TUNER_MAGIC,
            version: TUNER_VERSION,
            size: TUNER_SIZE as u32,
            pid,
            ..Self::default()
        }
    }
}

impl TunerStats {
    /// A file of `header` and no entry used yet.
    pub fn new(header: TunerHeader) -> Self {
        Self { header, entries: [[TunerEntry::default(); SIZE_CLASSES]; COLL_SLOTS] }
    }
}

const _: () = assert!(core::mem::size_of::<TunerHeader>() == 64);
const _: () = assert!(core::mem::offset_of!(TunerHeader, own_calls) == 24);
const _: () = assert!(core::mem::offset_of!(TunerHeader, adoption) == 48);
const _: () = assert!(core::mem::size_of::<TunerEntry>() == 48);
const _: () = assert!(TUNER_SIZE == 64 + COLL_SLOTS * SIZE_CLASSES * 48);
