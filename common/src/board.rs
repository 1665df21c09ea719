//! The knob board: a small shared-memory file (`/run/linkpilot/knobs`) through which training
//! processes read the current knob values every step. Versioned `#[repr(C)]` layout, little
//! endian, written under a seqlock; docs/knob-board.md documents the bytes for C and Python.

/// First bytes of the file.
pub const BOARD_MAGIC: [u8; 8] = *b"LPKNOBS\0";
/// Layout version; a reader that does not know it must not interpret the rest. Version 2 added
/// the NCCL tuner plugin's fields to each link slot (112 -> 128 bytes), version 3 the
/// cross-site synchronization's knobs and the link's measured rate (128 -> 184 bytes).
pub const BOARD_VERSION: u32 = 3;
/// Links the board has room for.
/// `dscp` and `roce_traffic_class` of a link whose policy leaves them alone ("keep"): no DSCP
/// is 255, and no RoCE class sets both ECN bits.
pub const KEEP: u8 = 255;

pub const BOARD_MAX_LINKS: usize = 8;
/// Bytes of a link or state name, NUL-padded (names longer than 31 bytes are cut).
pub const BOARD_NAME_LEN: usize = 32;

/// Compression codes of [`BoardLink::compression`].
pub mod compression {
    pub const NONE: u32 = 0;
    pub const FP16: u32 = 1;
    pub const BF16: u32 = 2;
    pub const INT8: u32 = 3;
    pub const INT4: u32 = 4;
    /// Top-k: the kept fraction is in [`super::BoardLink::topk_ratio`].
    pub const TOPK: u32 = 5;
}

/// Codes of [`BoardLink::nccl_algo`] and [`BoardLink::nccl_proto`]: NCCL's own numbers
/// (`NCCL_ALGO_*`, `NCCL_PROTO_*` of nccl_tuner.h), and [`nccl::ANY`] for "NCCL's own choice".
pub mod nccl {
    pub const ALGO_TREE: u8 = 0;
    pub const ALGO_RING: u8 = 1;
    pub const ALGO_COLLNET_DIRECT: u8 = 2;
    pub const ALGO_COLLNET_CHAIN: u8 = 3;
    pub const ALGO_NVLS: u8 = 4;
    pub const ALGO_NVLS_TREE: u8 = 5;
    pub const ALGO_PAT: u8 = 6;
    /// Algorithm names by code, as policies and the board's readers spell them.
    pub const ALGOS: [&str; 7] =
        ["tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat"];
    pub const PROTO_LL: u8 = 0;
    pub const PROTO_LL128: u8 = 1;
    pub const PROTO_SIMPLE: u8 = 2;
    /// Protocol names by code.
    pub const PROTOS: [&str; 3] = ["ll", "ll128", "simple"];
    /// No preference: NCCL's own choice.
    pub const ANY: u8 = 255;
}

/// Bits of [`BoardHeader::pending`]: actuators whose part of the board's decisions is not in
/// place yet (their write failed; the daemon retries every tick until it holds).
pub mod pending {
    pub const DSCP: u32 = 1 << 0;
    pub const ENV_FILE: u32 = 1 << 1;
    /// TCP buffer sysctls.
    pub const SYSCTL: u32 = 1 << 2;
    /// The policy's `[host]` sysctls.
    pub const HOST_SYSCTL: u32 = 1 << 3;
    pub const ROCE_TC: u32 = 1 << 4;
    /// The per-peer transport profiles (sock_ops).
    pub const TRANSPORT: u32 = 1 << 5;
    /// Actuator names by bit position, as status and metrics spell them.
    pub const NAMES: [&str; 6] =
        ["dscp", "env_file", "sysctl", "host_sysctl", "roce_tc", "transport"];
}

/// The header, at offset 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BoardHeader {
    pub magic: [u8; 8],
    pub version: u32,
    /// Size of the whole board in bytes (header and every link slot).
    pub size: u32,
    /// Seqlock: odd while the daemon writes. Readers copy, then re-read it; a change or an odd
    /// value means "copy again".
    pub seq: u64,
    /// CLOCK_MONOTONIC (ns) of the daemon's last heartbeat.
    pub heartbeat_ns: u64,
    /// How often the daemon beats; a reader treats the board as stale (daemon dead) after two
    /// intervals without a beat and falls back to its safe defaults.
    pub heartbeat_interval_ms: u32,
    pub pid: u32,
    /// Id of the newest decision on the board.
    pub decision_id: u64,
    /// Link slots in use.
    pub n_links: u32,
    /// [`pending`] bits: 0 when everything the board shows is in place. Padding before this
    /// field existed, so older version-2 daemons write 0.
    pub pending: u32,
}

/// One link's knobs, in slots after the header.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BoardLink {
    pub name: [u8; BOARD_NAME_LEN],
    pub state: [u8; BOARD_NAME_LEN],
    /// Position of `state` in the policy's ladder (0 = healthiest).
    pub state_index: u32,
    /// A [`compression`] code.
    pub compression: u32,
    pub topk_ratio: f64,
    /// Bytes per pipelined chunk or bucket.
    pub chunk_bytes: u64,
    pub tcp_buffer_bytes: u64,
    /// Collective watchdog timeout, seconds.
    pub watchdog_s: u32,
    pub nccl_ib_timeout: u8,
    pub nccl_ib_retry_cnt: u8,
    /// [`KEEP`] when the policy leaves it alone.
    pub dscp: u8,
    /// [`KEEP`] when the policy leaves it alone.
    pub roce_traffic_class: u8,
    /// The decision that set these values.
    pub decision_id: u64,
    /// Collectives of fewer bytes keep NCCL's own choices (the tuner plugin changes nothing).
    pub nccl_min_bytes: u64,
    /// The link's RTT baseline (windowed minimum), microseconds; 0 = not measured yet. The tuner
    /// plugin adds half of it to NCCL's network latency when a communicator starts.
    pub rtt_us: u32,
    /// Preferred NCCL algorithm ([`nccl`] code), or [`nccl::ANY`].
    pub nccl_algo: u8,
    /// Preferred NCCL protocol ([`nccl`] code), or [`nccl::ANY`].
    pub nccl_proto: u8,
    /// Most channels a collective may use; 0 = NCCL's own count.
    pub nccl_max_channels: u8,
    pub _pad: u8,
    /// Inner steps per cross-site synchronization round (1: every step, the per-step
    /// exchange; 0: "auto", which the training side derives within `sync_min..=sync_max`).
    pub sync_every: u32,
    pub sync_min: u32,
    pub sync_max: u32,
    /// Inner steps a site may take without a sync before it waits for the link.
    pub max_drift: u32,
    /// A [`compression`] code: the pseudo-gradients' codec.
    pub outer_compression: u32,
    /// Parts of the parameters synchronized one at a time in a round.
    pub fragments: u16,
    /// Inner steps a fragment's exchange may take before it is applied.
    pub overlap: u16,
    pub outer_topk_ratio: f64,
    /// The rate the link has shown it carries (the largest goodput over the estimator's window),
    /// bit/s; 0 = nothing measured yet.
    pub delivery_bps: u64,
    /// The link's nominal capacity from the policy, bit/s.
    pub capacity_bps: u64,
    /// The share of an exchange's time "auto" keeps to spare, in hundredths of a percent.
    pub sync_margin_bp: u16,
    /// 1: the training side chooses the pseudo-gradients' codec with H, from `outer_weakest` to
    /// `outer_compression` (a reader that does not know this field runs the latter).
    pub outer_codec_auto: u8,
    /// A [`compression`] code: the weakest codec an auto outer codec may choose.
    pub outer_weakest: u8,
    pub _pad2: [u8; 4],
}

impl Default for BoardLink {
    fn default() -> Self {
        Self {
            name: [0; BOARD_NAME_LEN],
            state: [0; BOARD_NAME_LEN],
            state_index: 0,
            compression: compression::NONE,
            topk_ratio: 0.0,
            chunk_bytes: 0,
            tcp_buffer_bytes: 0,
            watchdog_s: 0,
            nccl_ib_timeout: 0,
            nccl_ib_retry_cnt: 0,
            dscp: 0,
            roce_traffic_class: 0,
            decision_id: 0,
            nccl_min_bytes: 0,
            rtt_us: 0,
            nccl_algo: nccl::ANY,
            nccl_proto: nccl::ANY,
            nccl_max_channels: 0,
            _pad: 0,
            sync_every: 1,
            sync_min: 1,
            sync_max: 1,
            max_drift: 0,
            outer_compression: compression::INT8,
            fragments: 1,
            overlap: 0,
            outer_topk_ratio: 0.0,
            delivery_bps: 0,
            capacity_bps: 0,
            sync_margin_bp: 0,
            outer_codec_auto: 0,
            outer_weakest: compression::NONE as u8,
            _pad2: [0; 4],
        }
    }
}

/// The whole board.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Board {
    pub header: BoardHeader,
    pub links: [BoardLink; BOARD_MAX_LINKS],
}

/// Byte offsets readers in other languages use (asserted below against the Rust layout).
pub mod offsets {
    pub const SEQ: usize = 16;
    pub const HEARTBEAT_NS: usize = 24;
    pub const HEARTBEAT_INTERVAL_MS: usize = 32;
    pub const N_LINKS: usize = 48;
    pub const PENDING: usize = 52;
    pub const LINKS: usize = 56;
    pub const LINK_SIZE: usize = 184;
}

const _: () = assert!(core::mem::size_of::<BoardHeader>() == offsets::LINKS);
const _: () = assert!(core::mem::size_of::<BoardLink>() == offsets::LINK_SIZE);
const _: () = assert!(core::mem::offset_of!(BoardHeader, seq) == offsets::SEQ);
const _: () = assert!(core::mem::offset_of!(BoardHeader, heartbeat_ns) == offsets::HEARTBEAT_NS);
const _: () = assert!(
    core::mem::offset_of!(BoardHeader, heartbeat_interval_ms) == offsets::HEARTBEAT_INTERVAL_MS
);
const _: () = assert!(core::mem::offset_of!(BoardHeader, n_links) == offsets::N_LINKS);
const _: () = assert!(core::mem::offset_of!(BoardHeader, pending) == offsets::PENDING);
const _: () = assert!(core::mem::offset_of!(BoardLink, chunk_bytes) == 80);
const _: () = assert!(core::mem::offset_of!(BoardLink, watchdog_s) == 96);
const _: () = assert!(core::mem::offset_of!(BoardLink, decision_id) == 104);
const _: () = assert!(core::mem::offset_of!(BoardLink, nccl_min_bytes) == 112);
const _: () = assert!(core::mem::offset_of!(BoardLink, rtt_us) == 120);
const _: () = assert!(core::mem::offset_of!(BoardLink, nccl_algo) == 124);
const _: () = assert!(core::mem::offset_of!(BoardLink, nccl_proto) == 125);
const _: () = assert!(core::mem::offset_of!(BoardLink, nccl_max_channels) == 126);
const _: () =
    assert!(core::mem::size_of::<Board>() == offsets::LINKS + BOARD_MAX_LINKS * offsets::LINK_SIZE);
const _: () = assert!(core::mem::offset_of!(BoardLink, sync_every) == 128);
const _: () = assert!(core::mem::offset_of!(BoardLink, outer_compression) == 144);
const _: () = assert!(core::mem::offset_of!(BoardLink, fragments) == 148);
const _: () = assert!(core::mem::offset_of!(BoardLink, overlap) == 150);
const _: () = assert!(core::mem::offset_of!(BoardLink, outer_topk_ratio) == 152);
const _: () = assert!(core::mem::offset_of!(BoardLink, delivery_bps) == 160);
const _: () = assert!(core::mem::offset_of!(BoardLink, capacity_bps) == 168);
const _: () = assert!(core::mem::offset_of!(BoardLink, sync_margin_bp) == 176);
const _: () = assert!(core::mem::offset_of!(BoardLink, outer_codec_auto) == 178);
const _: () = assert!(core::mem::offset_of!(BoardLink, outer_weakest) == 179);
const _: () = assert!(core::mem::size_of::<Board>() == 1528);
