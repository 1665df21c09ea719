//! The knob values a state asks for: fixed ones from the policy, auto ones (chunk from the
//! bandwidth-delay product, socket buffers, NCCL_IB_TIMEOUT and the watchdog from RTT p99, the
//! codec from the jobs' load as `codec.rs` chooses it)
//! within bounds and step limits, paced to one measurement-driven change per minimum dwell.

use std::time::Duration;

use super::{
    estimator::Signals,
    knobs::{bytes, Compression, Knobs, SyncKnobs},
    policy::{Policy, Setting},
    probe::Rate,
    transport::Transport,
};

/// Auto knobs whose changes are paced by the minimum dwell (timeouts may rise at once).
#[derive(Clone, Copy)]
enum Paced {
    Chunk = 0,
    Buffers = 1,
    IbTimeout = 2,
    Watchdog = 3,
    Compression = 4,
}

/// Knobs whose measurement-driven changes are paced.
pub(super) const PACED: usize = 5;

fn pow2_round(x: f64) -> u64 {
    if x <= 1.0 {
        return 1;
    }
    let lo = 2f64.powi(x.log2().floor() as i32);
    let v = if x / lo >= std::f64::consts::SQRT_2 { lo * 2.0 } else { lo };
    v as u64
}

/// `target` moved at most a factor `step` away from `prev`, then clamped to `[min, max]`.
fn limited(prev: u64, target: u64, step: f64, min: u64, max: u64) -> u64 {
    let lo = (prev as f64 / step).ceil() as u64;
    let hi = (prev as f64 * step).floor() as u64;
    target.clamp(lo.min(hi), hi.max(lo)).clamp(min, max)
}

/// The rate a chunk is sized from: what the link delivers now (at most the capacity), else the
/// capacity; with "auto", the link's measured rate, else none yet.
fn chunk_rate(rate: Rate, s: &Signals) -> Option<f64> {
    let delivered = (s.delivery_bps > 0.0).then_some(s.delivery_bps);
    match rate {
        Rate::Nominal(c) => Some(delivered.map_or(c, |d| d.min(c))),
        _ => delivered,
    }
}

/// The RTT socket buffers are sized on: the p99 with a nominal capacity, the baseline with a
/// measured rate.
fn buffer_rtt(rate: Rate, s: &Signals) -> Option<(&'static str, f64)> {
    match rate {
        Rate::Nominal(_) => s.rtt_p99_ms.map(|v| ("p99", v)),
        _ => s.baseline_ms.map(|v| ("baseline", v)),
    }
}

/// What the state and the signals ask for, within bounds (step limits apply against `prev`).
pub(super) fn knobs_for(
    p: &Policy,
    // The rate the BDP-derived knobs are sized from: the policy's capacity, or measured.
    rate: Rate,
    state: usize,
    s: &Signals,
    prev: Option<&Knobs>,
    // With `compression = "auto"`: the codec chosen from the jobs' load (`codec::choose`).
    codec: Option<Compression>,
    // Explanations are formatted only when a decision is made: the same inputs, run again.
    mut why: Option<&mut Vec<String>>,
) -> Knobs {
    let b = &p.bounds;
    let k = &p.states[state].knobs;
    // Until the jobs' load is known, "auto" keeps the codec in force if the bounds allow it,
    // else starts from the strongest: a codec too weak for a thin link stalls the job.
    let compression = match k.compression {
        Setting::Fixed(c) => c,
        Setting::Auto => codec.unwrap_or_else(|| {
            prev.map(|k| k.compression)
                .filter(|c| {
                    c.ratio() <= b.codec_weakest.ratio() && c.ratio() >= b.codec_strongest.ratio()
                })
                .unwrap_or(b.codec_strongest)
        }),
    };
    let chunk = match k.chunk {
        Setting::Fixed(c) => c,
        Setting::Auto => match (s.baseline_ms, chunk_rate(rate, s)) {
            (Some(base), Some(rate)) => {
                let bdp = rate / 8.0 * base / 1e3;
                let target = pow2_round(bdp / f64::from(b.chunk_in_flight));
                let prev = prev.map_or(b.chunk_initial, |k| k.chunk_bytes);
                let v = limited(prev, target, b.chunk_max_step, b.chunk_min, b.chunk_max);
                if let Some(w) = why.as_mut() {
                    w.push(format!(
                        "chunk: BDP {} ({:.2} Gbit/s x {base:.1} ms) / {} in flight",
                        bytes(bdp as u64),
                        rate / 1e9,
                        b.chunk_in_flight
                    ));
                }
                v
            }
            _ => prev.map_or(b.chunk_initial, |k| k.chunk_bytes),
        },
    };
    let tcp_buffer_bytes = match k.tcp_buffers {
        // "keep": 0, which the actuator reads as "write no sysctl".
        None => 0,
        Some(Setting::Fixed(v)) => v,
        // A measured rate is sized on the RTT baseline: the p99 grows with the queue the buffers
        // build, and would grow them further.
        Some(Setting::Auto) => match (buffer_rtt(rate, s), rate.bps()) {
            (Some((rtt_name, p99)), Some(bps)) => {
                let want = b.buffers_bdp_factor * bps / 8.0 * p99 / 1e3;
                let prev = prev.map_or(b.buffers_min, |k| k.tcp_buffer_bytes);
                let v = limited(
                    prev,
                    pow2_round(want),
                    b.buffers_max_step,
                    b.buffers_min,
                    b.buffers_max,
                );
                if let Some(w) = why.as_mut() {
                    w.push(format!(
                        "tcp_buffers: {} x {} x RTT {rtt_name} {p99:.1} ms = {}",
                        b.buffers_bdp_factor,
                        rate.describe(),
                        bytes(want as u64)
                    ));
                }
                v
            }
            _ => prev.map_or(b.buffers_min, |k| k.tcp_buffer_bytes),
        },
    };
    // Timeouts follow the RTT p99; with none measured (an idle link), the peak window's, and
    // once that too has aged out, the bounds' minimum: raised timeouts do not outlive the
    // measurements that raised them. Falls are paced by the dwell, rises are at once.
    let nccl_ib_timeout = match k.nccl_ib_timeout {
        Setting::Fixed(t) => t,
        Setting::Auto => match s.rtt_p99_ms.or(s.peak_p99_ms) {
            None => b.ib_timeout_min,
            Some(p99) => {
                let need = b.ib_timeout_k * p99 / 1e3 / 4.096e-6;
                let t = need.max(1.0).log2().ceil().clamp(0.0, 31.0) as u8;
                let t = t.clamp(b.ib_timeout_min, b.ib_timeout_max);
                if let Some(w) = why.as_mut() {
                    let of = if s.rtt_p99_ms.is_some() { "RTT p99" } else { "peak RTT p99" };
                    w.push(format!(
                        "nccl_ib_timeout: 4.096us x 2^{t} >= {} x {of} {p99:.1} ms",
                        b.ib_timeout_k
                    ));
                }
                t
            }
        },
    };
    let watchdog_s = match k.watchdog_s {
        Setting::Fixed(w) => w,
        Setting::Auto => {
            let want = match s.peak_p99_ms {
                None => b.watchdog_min_s,
                Some(peak) => {
                    if let Some(w) = why.as_mut() {
                        w.push(format!(
                            "watchdog: {} x peak RTT p99 {peak:.1} ms",
                            b.watchdog_rtt_multiple
                        ));
                    }
                    let want = (b.watchdog_rtt_multiple * peak / 1e3 / 30.0).ceil() * 30.0;
                    (want as u32).clamp(b.watchdog_min_s, b.watchdog_max_s)
                }
            };
            let prev = prev.map_or(b.watchdog_min_s, |k| k.watchdog_s);
            // Rises at once; falls by at most max_step per change.
            let floor = (f64::from(prev) / b.watchdog_max_step).ceil() as u32;
            want.max(floor.min(prev)).clamp(b.watchdog_min_s, b.watchdog_max_s)
        }
    };
    Knobs {
        compression,
        chunk_bytes: chunk,
        nccl_ib_timeout,
        nccl_ib_retry_cnt: k.nccl_ib_retry_cnt,
        watchdog_s,
        dscp: k.dscp,
        roce_traffic_class: k.roce_traffic_class,
        tcp_buffer_bytes,
        sync: SyncKnobs {
            // "auto" (0): the training side derives it from what the board shows.
            sync_every: match k.sync_every {
                Setting::Fixed(h) => h,
                Setting::Auto => 0,
            },
            outer_compression: match k.outer_compression {
                Setting::Fixed(c) => c,
                Setting::Auto => b.codec_strongest,
            },
            outer_codec_auto: matches!(k.outer_compression, Setting::Auto),
            fragments: k.fragments,
            overlap: k.overlap,
        },
        transport: k.transport.map(|t| Transport {
            congestion_control: t.congestion_control,
            initial_cwnd: t.initial_cwnd,
            initial_rwnd: t.initial_rwnd,
            sndcwnd_clamp: t.sndcwnd_clamp,
            socket_buffer: match t.socket_buffers {
                None => 0,
                Some(Setting::Fixed(b)) => b,
                Some(Setting::Auto) => tcp_buffer_bytes,
            },
            ecn: t.ecn,
        }),
    }
}

/// Holds back measurement-driven knob changes to one per minimum dwell (a state change applies
/// everything at once); timeouts may always rise, since a late rise can kill a job.
pub(super) fn pace(
    prev: Knobs,
    mut target: Knobs,
    state_changed: bool,
    now: Duration,
    dwell: Duration,
    changed: &mut [Option<Duration>; PACED],
) -> Knobs {
    let mut gate = |knob: Paced, moved: bool, urgent: bool| -> bool {
        if !moved {
            return true;
        }
        let ok = state_changed
            || urgent
            || changed[knob as usize].is_none_or(|t| now.saturating_sub(t) >= dwell);
        if ok {
            changed[knob as usize] = Some(now);
        }
        ok
    };
    if !gate(Paced::Compression, target.compression != prev.compression, false) {
        target.compression = prev.compression;
    }
    if !gate(Paced::Chunk, target.chunk_bytes != prev.chunk_bytes, false) {
        target.chunk_bytes = prev.chunk_bytes;
    }
    if !gate(Paced::Buffers, target.tcp_buffer_bytes != prev.tcp_buffer_bytes, false) {
        target.tcp_buffer_bytes = prev.tcp_buffer_bytes;
    }
    let rise = target.nccl_ib_timeout > prev.nccl_ib_timeout;
    if !gate(Paced::IbTimeout, target.nccl_ib_timeout != prev.nccl_ib_timeout, rise) {
        target.nccl_ib_timeout = prev.nccl_ib_timeout;
    }
    let rise = target.watchdog_s > prev.watchdog_s;
    if !gate(Paced::Watchdog, target.watchdog_s != prev.watchdog_s, rise) {
        target.watchdog_s = prev.watchdog_s;
    }
    target
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        assert_eq!(pow2_round(6.0 * 1024.0 * 1024.0), 8 << 20);
        assert_eq!(pow2_round(5.0 * 1024.0 * 1024.0), 4 << 20);
        assert_eq!(limited(8, 100, 2.0, 1, 1000), 16);
        assert_eq!(limited(8, 1, 2.0, 1, 1000), 4);
        assert_eq!(limited(8, 100, 2.0, 1, 10), 10);
    }
}
