//! NCCL's tuner plugin interface as C lays it out (nccl_tuner.h and tuner/tuner_v4.h, v5.h,
//! v6.h of NCCL 2.30): the exported structs of function pointers, the tuner constants a v5/v6
//! init may change, and the numbers NCCL passes. Sizes and offsets are asserted at compile time
//! for x86-64 and aarch64 (LP64); the C harness in tests/ checks them again from C.

use std::ffi::{c_char, c_int, c_ulong, c_void};

/// `ncclResult_t`: every entry point returns success (0) once init ran.
pub type NcclResult = c_int;
pub const SUCCESS: NcclResult = 0;

/// `ncclDebugLogger_t`: NCCL's own logger, handed to init.
pub type Logger = unsafe extern "C" fn(
    level: c_int,
    flags: c_ulong,
    file: *const c_char,
    line: c_int,
    fmt: *const c_char,
    ...
);
/// `NCCL_LOG_INFO`.
pub const LOG_INFO: c_int = 3;
/// `NCCL_INIT | NCCL_TUNING`: shown with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,TUNING).
pub const LOG_FLAGS: c_ulong = 0x1 | 0x40;

/// `ncclFunc_t` values the plugin tunes; others pass through untouched.
pub const FUNC_ALLREDUCE: c_int = 4;
/// Algorithms and protocols: `NCCL_NUM_ALGORITHMS` and `NCCL_NUM_PROTOCOLS` of 2.30.
pub const NUM_ALGORITHMS: usize = 7;
pub const NUM_PROTOCOLS: usize = 3;
/// `NCCL_HW_NET`: the network row of `hwLatencies`.
pub const HW_NET: usize = 2;
pub const NUM_HW_LINKS: usize = 3;
pub const NUM_COMPCAPS: usize = 4;
pub const NUM_TUNING_SCALES: usize = 3;
/// `ncclProtoGrainSize(NCCL_PROTO_SIMPLE)`: NCCL rounds a Simple chunk down to it.
pub const SIMPLE_GRAIN: usize = 512;
/// NCCL's NCCL_BUFFSIZE when the variable is unset (`DEFAULT_BUFFSIZE`).
pub const DEFAULT_BUFFSIZE: u64 = 1 << 22;

/// `ncclNvlDomainInfo_v5_t` (v6 uses the same).
#[repr(C)]
pub struct NvlDomainInfo {
    pub n_nvl_domains: c_int,
    pub min_ranks_per_nvl_domain: c_int,
    pub max_ranks_per_nvl_domain: c_int,
}

/// `ncclTunerConstants_v5_t` (v6 uses the same): microseconds and GB/s of NCCL's cost model,
/// which NCCL computes from them after init returns.
#[repr(C)]
pub struct TunerConstants {
    pub base_latencies: [[f64; NUM_PROTOCOLS]; NUM_ALGORITHMS],
    pub hw_latencies: [[[f64; NUM_PROTOCOLS]; NUM_ALGORITHMS]; NUM_HW_LINKS],
    pub ll_max_bws: [[f64; NUM_TUNING_SCALES]; NUM_COMPCAPS],
    pub per_ch_max_ring_ll128_bws: [[f64; NUM_TUNING_SCALES]; NUM_COMPCAPS],
    pub per_ch_max_tree_ll128_bws: [[f64; NUM_TUNING_SCALES]; NUM_COMPCAPS],
    pub per_ch_max_tree_bws: [[f64; NUM_TUNING_SCALES]; NUM_COMPCAPS],
    pub per_ch_max_nvls_tree_bws: [[f64; NUM_TUNING_SCALES]; NUM_COMPCAPS],
}

pub type InitV5 = unsafe extern "C" fn(
    ctx: *mut *mut c_void,
    comm_id: u64,
    n_ranks: usize,
    n_nodes: usize,
    logger: Option<Logger>,
    nvl_domain_info: *mut NvlDomainInfo,
    constants: *mut TunerConstants,
) -> NcclResult;
pub type InitV4 = unsafe extern "C" fn(
    n_ranks: usize,
    n_nodes: usize,
    logger: Option<Logger>,
    ctx: *mut *mut c_void,
) -> NcclResult;
/// The cost table behind `cost_table` is one `float[num_algo][num_proto]` block (NCCL casts its
/// 2-D array to `float**`).
pub type GetCollInfo = unsafe extern "C" fn(
    ctx: *mut c_void,
    coll_type: c_int,
    n_bytes: usize,
    num_pipe_ops: c_int,
    cost_table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    reg_buff: c_int,
    n_channels: *mut c_int,
) -> NcclResult;
pub type GetChunkSize = unsafe extern "C" fn(
    ctx: *mut c_void,
    coll_type: c_int,
    n_bytes: usize,
    algo: c_int,
    proto: c_int,
    n_channels: c_int,
    chunk_size: *mut usize,
) -> NcclResult;
pub type Finalize = unsafe extern "C" fn(ctx: *mut c_void) -> NcclResult;

/// `ncclTuner_v6_t`: v5 plus getChunkSize, last.
#[repr(C)]
pub struct TunerV6 {
    pub name: *const c_char,
    pub init: InitV5,
    pub get_coll_info: GetCollInfo,
    pub finalize: Finalize,
    pub get_chunk_size: GetChunkSize,
}

/// `ncclTuner_v5_t`.
#[repr(C)]
pub struct TunerV5 {
    pub name: *const c_char,
    pub init: InitV5,
    pub get_coll_info: GetCollInfo,
    pub finalize: Finalize,
}

/// `ncclTuner_v4_t`: init takes (nRanks, nNodes, logger, ctx); `destroy` for finalize.
#[repr(C)]
pub struct TunerV4 {
    pub name: *const c_char,
    pub init: InitV4,
    pub get_coll_info: GetCollInfo,
    pub destroy: Finalize,
}

// SAFETY: the structs are immutable after construction and `name` points at a static string.
unsafe impl Sync for TunerV6 {}
// SAFETY: as above.
unsafe impl Sync for TunerV5 {}
// SAFETY: as above.
unsafe impl Sync for TunerV4 {}

#[cfg(target_pointer_width = "64")]
mod layout {
    use super::*;
    use std::mem::{offset_of, size_of};

    const _: () = assert!(size_of::<TunerV6>() == 40);
    const _: () = assert!(offset_of!(TunerV6, init) == 8);
    const _: () = assert!(offset_of!(TunerV6, get_coll_info) == 16);
    const _: () = assert!(offset_of!(TunerV6, finalize) == 24);
    const _: () = assert!(offset_of!(TunerV6, get_chunk_size) == 32);
    const _: () = assert!(size_of::<TunerV5>() == 32);
    const _: () = assert!(offset_of!(TunerV5, finalize) == 24);
    const _: () = assert!(size_of::<TunerV4>() == 32);
    const _: () = assert!(offset_of!(TunerV4, destroy) == 24);
    const _: () = assert!(size_of::<NvlDomainInfo>() == 12);
    const _: () = assert!(size_of::<TunerConstants>() == 1152);
    const _: () = assert!(offset_of!(TunerConstants, hw_latencies) == 168);
    const _: () = assert!(offset_of!(TunerConstants, ll_max_bws) == 672);
    const _: () = assert!(offset_of!(TunerConstants, per_ch_max_nvls_tree_bws) == 1056);
    // Function pointers are non-null in Rust: an `Option` of one is the same size (NULL = None).
    const _: () = assert!(size_of::<Option<Logger>>() == 8);
}
