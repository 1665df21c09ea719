//! The ladder of states, checked: names, thresholds (exit within enter, each state worse than
//! the healthier ones), knobs within the bounds and kept or set on the whole ladder, codecs that
//! only get stronger, and each state's synchronization and transport knobs.

use linkpilot_common::units::Bytes;
use toml::Spanned;

use super::{bad_name, map_setting};
use crate::control::policy::{
    file::{RawKnobs, RawState, Setting},
    higher_is_worse, secs,
    sections::{check_transport, CcUses},
    Bounds, Errors, State, StateKnobs, Thresholds,
};

pub(super) fn check_states(
    raw: &[Spanned<RawState>],
    b: &Bounds,
    e: &mut Errors,
) -> (Vec<State>, CcUses) {
    let mut ccs = Vec::new();
    if raw.is_empty() {
        e.at(0..0, "no [[state]]: a policy needs at least one state (the healthy one)");
    }
    let mut states: Vec<State> = Vec::new();
    for (i, s) in raw.iter().enumerate() {
        let span = s.span();
        let s = s.get_ref();
        let name = s.name.get_ref().clone();
        if states.iter().any(|o| o.name == name) {
            e.at(s.name.span(), format!("state name {name:?} is used twice"));
        }
        if let Some(why) = bad_name(&name) {
            e.at(s.name.span(), format!("state name {name:?} {why}"));
        }
        let enter = s.enter.as_ref().map(|t| *t.get_ref()).unwrap_or_default();
        let enter_span = s.enter.as_ref().map_or(span.clone(), |t| t.span());
        if i == 0 && !enter.conditions().is_empty() {
            e.at(enter_span.clone(), format!("state {name:?} is the first (healthiest) state: it has no enter thresholds; remove them or put a healthier state first"));
        }
        if i > 0 && enter.conditions().is_empty() {
            e.at(enter_span.clone(), format!("state {name:?} needs enter thresholds (any of rtt_inflation, cross_rtt_inflation, rtt_p99, jitter, cross_jitter, ce_fraction, cross_ce_fraction, retrans, cnp_rate, goodput_below, unanswered)"));
        }
        let exit = match &s.exit {
            None => enter,
            Some(x) => {
                let exit = *x.get_ref();
                if i == 0 {
                    e.at(
                        x.span(),
                        format!("state {name:?} is the first state: there is nothing to exit to"),
                    );
                }
                let enter_c = enter.conditions();
                for (sig, v, written) in exit.conditions() {
                    match enter_c.iter().find(|(n, _, _)| *n == sig) {
                        None => e.at(x.span(), format!("state {name:?}: exit threshold {sig} has no enter threshold to pair with")),
                        Some((_, ev, ew)) => {
                            let ok = if higher_is_worse(sig) { v <= *ev } else { v >= *ev };
                            if !ok {
                                let rel = if higher_is_worse(sig) { "at or below" } else { "at or above" };
                                e.at(x.span(), format!("state {name:?}: exit {sig} {written} must be {rel} its enter threshold {ew}, or the state could never be left"));
                            }
                        }
                    }
                }
                // Signals with an enter threshold and no exit one exit at the enter threshold.
                let mut merged = enter;
                merge(&mut merged, &exit);
                merged
            }
        };
        // Each state must be entered at worse signals than every healthier one.
        for prev in &states {
            for (sig, v, written) in enter.conditions() {
                if let Some((_, pv, pw)) =
                    prev.enter.conditions().into_iter().find(|(n, _, _)| *n == sig)
                {
                    let ordered = if higher_is_worse(sig) { v > pv } else { v < pv };
                    if !ordered {
                        e.at(enter_span.clone(), format!("state {name:?}: {sig} {written} overlaps state {:?} ({pw}); states are ordered healthiest first, so its threshold must be {}", prev.name, if higher_is_worse(sig) { "higher" } else { "lower" }));
                    }
                }
            }
        }
        let k = s.knobs.get_ref();
        let kspan = s.knobs.span();
        if let Some(d) = k.dscp.0.filter(|d| *d > 63) {
            e.at(kspan.clone(), format!("state {name:?}: dscp {d} must be 0..=63, or \"keep\""));
        }
        // A knob is left alone on the whole ladder or on none of it: a state that "keeps" after
        // one that set a value would leave that value behind rather than the host's own.
        if let Some(first) = states.first() {
            let mixed = [
                ("dscp", first.knobs.dscp.is_some(), k.dscp.0.is_some()),
                (
                    "roce_traffic_class",
                    first.knobs.roce_traffic_class.is_some(),
                    k.roce_traffic_class.0.is_some(),
                ),
                ("tcp_buffers", first.knobs.tcp_buffers.is_some(), k.tcp_buffers.0.is_some()),
            ];
            for (knob, _, set_here) in mixed.into_iter().filter(|(_, a, b)| a != b) {
                let (here, there) = if set_here { ("sets", "keeps") } else { ("keeps", "sets") };
                e.at(kspan.clone(), format!("state {name:?} {here} {knob} while state {:?} {there} it; \"keep\" (or leaving it out) applies to every state of the ladder or to none", first.name));
            }
        }
        if k.nccl_ib_retry_cnt > 7 {
            e.at(
                kspan.clone(),
                format!(
                    "state {name:?}: nccl_ib_retry_cnt {} must be 0..=7 (a 3-bit field)",
                    k.nccl_ib_retry_cnt
                ),
            );
        }
        // Each fixed knob within its bounds, all shown in the knob's own units.
        let bytes: fn(u64) -> String = |n| Bytes(n).to_string();
        let count: fn(u64) -> String = |n| n.to_string();
        let seconds: fn(u64) -> String = |n| format!("{n}s");
        let (ib_min, ib_max) = (u64::from(b.ib_timeout_min), u64::from(b.ib_timeout_max));
        let (wd_min, wd_max) = (u64::from(b.watchdog_min_s), u64::from(b.watchdog_max_s));
        let bounded = [
            ("chunk", k.chunk.fixed().map(|c| c.0), b.chunk_min, b.chunk_max, bytes),
            ("nccl_ib_timeout", k.nccl_ib_timeout.fixed().map(u64::from), ib_min, ib_max, count),
            ("watchdog", k.watchdog.fixed().map(|w| u64::from(secs(w))), wd_min, wd_max, seconds),
            (
                "tcp_buffers",
                k.tcp_buffers.0.and_then(Setting::fixed).map(|t| t.0),
                b.buffers_min,
                b.buffers_max,
                bytes,
            ),
        ];
        for (knob, v, lo, hi, show) in bounded {
            if let Some(v) = v.filter(|v| *v < lo || *v > hi) {
                let (v, lo, hi) = (show(v), show(lo), show(hi));
                e.at(
                    kspan.clone(),
                    format!("state {name:?}: {knob} {v} lies outside the bounds {lo}..={hi}"),
                );
            }
        }
        check_sync(&name, k, b, kspan.clone(), e);
        // "auto" chooses from the link and the jobs, whatever the state: only fixed codecs
        // form a ladder.
        let fixed_before = states.iter().rev().find_map(|st: &State| match st.knobs.compression {
            Setting::Fixed(c) => Some((c, st.name.as_str())),
            Setting::Auto => None,
        });
        if let (Setting::Fixed(c), Some((prev, prev_name))) = (k.compression, fixed_before) {
            if c.ratio() > prev.ratio() {
                e.at(kspan.clone(), format!("state {name:?}: compression {c} is lighter than {prev} in the healthier state {prev_name:?}; compression may only get stronger as states worsen"));
            }
        }
        let transport = s.transport.as_ref().map(|t| check_transport(&name, t, b, e, &mut ccs));
        if k.tcp_buffers.0.is_none()
            && transport.as_ref().is_some_and(|t| t.socket_buffers == Some(Setting::Auto))
        {
            e.at(
                kspan.clone(),
                format!(
                    "state {name:?}: transport socket_buffers \"auto\" is the state's \
                     tcp_buffers, which is \"keep\": give socket_buffers a size"
                ),
            );
        }
        states.push(State {
            name,
            enter,
            exit,
            knobs: StateKnobs {
                compression: k.compression,
                chunk: map_setting(k.chunk, |b| b.0),
                nccl_ib_timeout: k.nccl_ib_timeout,
                nccl_ib_retry_cnt: k.nccl_ib_retry_cnt,
                watchdog_s: map_setting(k.watchdog, secs),
                dscp: k.dscp.0,
                roce_traffic_class: k.roce_traffic_class.0,
                tcp_buffers: k.tcp_buffers.0.map(|s| map_setting(s, |b| b.0)),
                sync_every: k.sync_every,
                outer_compression: k.outer_codec,
                fragments: k.fragments,
                overlap: k.overlap,
                transport,
            },
        });
    }
    (states, ccs)
}

/// A state's synchronization knobs: H within the bounds, fragments no more than the steps of a
/// round, and each fragment's overlap below the steps between two sends.
fn check_sync(name: &str, k: &RawKnobs, b: &Bounds, span: std::ops::Range<usize>, e: &mut Errors) {
    let h = match k.sync_every {
        Setting::Fixed(h) => {
            if h != 1 && (h < b.sync_min || h > b.sync_max) {
                e.at(
                    span.clone(),
                    format!(
                        "state {name:?}: sync_every {h} lies outside the bounds {}..={} (1, the \
                         per-step exchange, is always allowed)",
                        b.sync_min, b.sync_max
                    ),
                );
            }
            h
        }
        // The shortest round "auto" may choose.
        Setting::Auto => b.sync_min,
    };
    let f = u32::from(k.fragments);
    if f == 0 || f > h.max(1) {
        e.at(
            span.clone(),
            format!(
                "state {name:?}: fragments {f} must be from 1 to sync_every's {}{h} (one send a \
                 step at most)",
                if matches!(k.sync_every, Setting::Auto) { "smallest, " } else { "" }
            ),
        );
    } else if u32::from(k.overlap) >= h / f {
        e.at(
            span,
            format!(
                "state {name:?}: overlap {} must be below the {} steps between two sends \
                 (sync_every {h} / fragments {f})",
                k.overlap,
                h / f
            ),
        );
    }
}

/// Overrides `into`'s thresholds with those `from` sets.
fn merge(into: &mut Thresholds, from: &Thresholds) {
    macro_rules! take {
        ($($f:ident),*) => {$( if from.$f.is_some() { into.$f = from.$f; } )*};
    }
    take!(
        rtt_inflation,
        cross_rtt_inflation,
        rtt_p99,
        jitter,
        cross_jitter,
        ce_fraction,
        cross_ce_fraction,
        retrans,
        cnp_rate,
        goodput_below,
        unanswered
    );
}
