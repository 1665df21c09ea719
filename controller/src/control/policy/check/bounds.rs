//! `[bounds]`, checked: each rule a section's limits must keep, reported in one fixed order.

use std::ops::Range;

use linkpilot_common::units::Bytes;

use crate::control::policy::{file::RawBounds, secs, Bounds, Errors};

/// A rule of a section: (broken, why).
type Rule = (bool, String);

pub(super) fn check_bounds(b: &RawBounds, e: &mut Errors) -> Bounds {
    let (c, t, i) = (b.chunk.get_ref(), b.tcp_buffers.get_ref(), b.nccl_ib_timeout.get_ref());
    let (w, y, z) = (b.watchdog.get_ref(), b.sync_every.get_ref(), b.compression.get_ref());
    // Chunks and socket buffers alike: a range of sizes, none empty.
    let sizes = |name: &str, min: Bytes, max: Bytes| {
        let why = format!("{name} bounds: min {min} must be above 0 and at most max {max}");
        (min.0 == 0 || min > max, why)
    };
    // Each section's rules, (broken, why), in the order the errors are reported.
    let sections: [(Range<usize>, Vec<Rule>); 6] = [
        (
            b.chunk.span(),
            vec![
                sizes("chunk", c.min, c.max),
                (
                    c.initial < c.min || c.initial > c.max,
                    format!(
                        "chunk initial {} must lie within min {} and max {}",
                        c.initial, c.min, c.max
                    ),
                ),
                (c.in_flight == 0, "chunk in_flight must be at least 1".into()),
            ],
        ),
        (
            b.tcp_buffers.span(),
            vec![
                sizes("tcp_buffers", t.min, t.max),
                // The kernel's buffer sysctls are C ints.
                (
                    t.max.0 > i32::MAX as u64,
                    format!("tcp_buffers max {} must be below 2GiB (a C int)", t.max),
                ),
                (
                    !(t.bdp_factor > 0.0 && t.bdp_factor.is_finite()),
                    "tcp_buffers bdp_factor must be above 0".into(),
                ),
            ],
        ),
        (
            b.nccl_ib_timeout.span(),
            vec![
                (
                    i.min == 0 || i.max > 31 || i.min > i.max,
                    format!(
                        "nccl_ib_timeout bounds {}..={} must lie within 1..=31, min first",
                        i.min, i.max
                    ),
                ),
                (!(i.k > 0.0 && i.k.is_finite()), "nccl_ib_timeout k must be above 0".into()),
            ],
        ),
        (
            b.watchdog.span(),
            vec![
                (
                    w.min.0 < 1_000_000_000 || w.min > w.max,
                    format!(
                        "watchdog bounds: min {} must be at least 1s and at most max {}",
                        w.min, w.max
                    ),
                ),
                (
                    !(w.rtt_multiple > 0.0 && w.rtt_multiple.is_finite()),
                    "watchdog rtt_multiple must be above 0".into(),
                ),
            ],
        ),
        (
            b.sync_every.span(),
            vec![
                (
                    y.min == 0 || y.min > y.max,
                    format!(
                        "sync_every bounds: min {} must be at least 1 and at most max {}",
                        y.min, y.max
                    ),
                ),
                (
                    y.max_drift < y.max,
                    format!(
                        "sync_every max_drift {} must be at least max {}: a site may always \
                         finish a round",
                        y.max_drift, y.max
                    ),
                ),
                (
                    !(y.margin.0 >= 0.0 && y.margin.0.is_finite()),
                    "sync_every margin must be 0% or more".into(),
                ),
            ],
        ),
        (
            b.compression.span(),
            vec![
                (
                    z.weakest.ratio() < z.strongest.ratio(),
                    format!(
                        "compression bounds: weakest {} sends less than strongest {}",
                        z.weakest, z.strongest
                    ),
                ),
                (
                    !(z.margin.0 >= 0.0 && z.margin.0.is_finite()),
                    "compression margin must be 0% or more".into(),
                ),
                (
                    !(z.latency_rtts >= 0.0 && z.latency_rtts <= 100.0),
                    format!("compression latency_rtts {} must be from 0 to 100", z.latency_rtts),
                ),
            ],
        ),
    ];
    for (span, rules) in sections {
        for (_, why) in rules.into_iter().filter(|(broken, _)| *broken) {
            e.at(span.clone(), why);
        }
    }
    for (span, step) in [
        (b.chunk.span(), c.max_step),
        (b.tcp_buffers.span(), t.max_step),
        (b.watchdog.span(), w.max_step),
    ] {
        if step < 1.0 || !step.is_finite() {
            e.at(span, format!("max_step {step} must be at least 1 (a factor per change)"));
        }
    }
    Bounds {
        chunk_min: c.min.0,
        chunk_max: c.max.0,
        chunk_initial: c.initial.0,
        chunk_in_flight: c.in_flight,
        chunk_max_step: c.max_step,
        buffers_min: t.min.0,
        buffers_max: t.max.0,
        buffers_bdp_factor: t.bdp_factor,
        buffers_max_step: t.max_step,
        ib_timeout_k: i.k,
        ib_timeout_min: i.min,
        ib_timeout_max: i.max,
        watchdog_min_s: secs(w.min),
        watchdog_max_s: secs(w.max),
        watchdog_rtt_multiple: w.rtt_multiple,
        watchdog_max_step: w.max_step,
        sync_min: y.min,
        sync_max: y.max,
        sync_margin: y.margin.0,
        max_drift: y.max_drift,
        codec_weakest: z.weakest,
        codec_strongest: z.strongest,
        codec_margin: z.margin.0,
        codec_latency_rtts: z.latency_rtts,
    }
}
