//! The board's form of one link's decision: the knobs, state and decision id of a slot, and
//! what the NCCL tuner plugin and the training side's "auto" synchronization read beside them.
//! Pure conversions, apart from the mapping that carries them (`writer.rs`).

use linkpilot_common::board::{compression as code, nccl, BoardLink, BOARD_NAME_LEN};

use crate::control::{
    plan::{LinkPlan, SyncBounds},
    policy::NcclRule,
    Compression, Knobs,
};

fn name_bytes(s: &str) -> [u8; BOARD_NAME_LEN] {
    let mut out = [0u8; BOARD_NAME_LEN];
    let n = s.len().min(BOARD_NAME_LEN - 1);
    out[..n].copy_from_slice(&s.as_bytes()[..n]);
    out
}

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

/// The board's form of one link's decision.
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
