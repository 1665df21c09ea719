//! The per-link series (`linkpilot_link_*`, `linkpilot_knob_*`, `linkpilot_decisions`): each
//! link's state in its ladder, its signals and knobs, and the decisions made. Apart from the
//! rest because these are the series a reload renames: they remember the links and states they
//! were written with, so that [`LinkMetrics::retain`] can remove those the new policy lacks.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
};

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::{families, family, labels, note, set, Labels, Named, F64};
use crate::control::{
    estimator::Signals,
    knobs::{Compression, Knobs},
};

const LINK_RTT_STATS: [&str; 5] = ["ewma", "baseline", "p50", "p99", "peak_p99"];

/// The link's signals that are one number each: (name, help).
const LINK_F64: &[(&str, &str)] = &[
    ("link_jitter_seconds", "RTT p99 - p50"),
    (
        "link_cross_jitter_seconds",
        "RTT p99 - p50 of the samples cross_rtt_inflation reads (0: none in the window)",
    ),
    ("link_rtt_inflation_ratio", "RTT EWMA over baseline, minus one"),
    (
        "link_cross_rtt_inflation_ratio",
        "RTT inflation from others' traffic: the reporting jobs' flows count only with the \
         first sample of each burst",
    ),
    ("link_ce_fraction", "CE (or echoed ECE) share of packets, EWMA"),
    (
        "link_cross_ce_fraction",
        "CE (or echoed ECE) share of packets, EWMA, without the marks on the reporting \
         jobs' flows",
    ),
    ("link_retrans_fraction", "Retransmitted share of segments sent, EWMA"),
    ("link_cnp_per_second", "RoCE congestion notifications per second"),
    ("link_goodput_bytes_per_second", "Goodput EWMA"),
    ("link_delivery_bytes_per_second", "Largest goodput EWMA over the window"),
    ("link_goodput_capacity_ratio", "Goodput over the link's nominal capacity"),
];

/// The knobs that are one number each: (name, help).
const KNOBS: &[(&str, &str)] = &[
    ("knob_compression_ratio", "Wire bytes per fp32 gradient byte"),
    ("knob_chunk_bytes", "Bytes per pipelined chunk (NCCL_BUFFSIZE)"),
    ("knob_nccl_ib_timeout", "NCCL_IB_TIMEOUT exponent: 4.096us x 2^t"),
    ("knob_nccl_ib_retry_cnt", "NCCL_IB_RETRY_CNT"),
    ("knob_watchdog_seconds", "Collective watchdog timeout"),
    ("knob_dscp", "DSCP of the link's egress traffic (-1: left alone)"),
    ("knob_roce_traffic_class", "RoCE traffic class (NCCL_IB_TC; -1: left alone)"),
    ("knob_tcp_buffer_bytes", "TCP buffer limit asked for (0: left alone)"),
    (
        "knob_sync_every",
        "Inner steps per cross-site sync round (1: every step; 0: auto, the training side \
         derives it)",
    ),
    ("knob_outer_compression_ratio", "Wire bytes per fp32 pseudo-gradient byte"),
    ("knob_fragments", "Parts of the parameters synced one at a time in a round"),
    ("knob_overlap", "Inner steps a fragment's exchange may take before it is applied"),
];

/// The label values the series were written with (the rest would keep their last value: two
/// states of one link reading 1).
#[derive(Default)]
struct Shown {
    links: BTreeSet<String>,
    states: BTreeSet<String>,
}

#[derive(Clone)]
pub struct LinkMetrics {
    link_state: Family<Labels, Gauge>,
    link_state_level: Family<Labels, Gauge>,
    link_rtt: Family<Labels, F64>,
    link_f64: Named<F64>,
    knob_compression: Family<Labels, Gauge>,
    knobs: Named<F64>,
    decisions: Family<Labels, Counter>,
    shown: Arc<Mutex<Shown>>,
}

impl LinkMetrics {
    pub fn register(r: &mut Registry) -> Self {
        let link_state = family(r, "link_state", "1 for the link's current state, 0 otherwise");
        let link_state_level =
            family(r, "link_state_level", "The current state's place in the ladder (0: first)");
        let link_rtt =
            family(r, "link_rtt_seconds", "Link RTT: ewma, baseline, p50, p99, peak_p99");
        let link_f64 = families(r, LINK_F64);
        let knob_compression =
            family(r, "knob_compression", "1 for the gradient compression mode in force");
        let knobs = families(r, KNOBS);
        let decisions = family(r, "decisions", "Decisions made, by the state they chose");
        Self {
            link_state,
            link_state_level,
            link_rtt,
            link_f64,
            knob_compression,
            knobs,
            decisions,
            shown: Arc::default(),
        }
    }

    /// A link's state (out of `states`, the ladder), knobs and signals.
    pub fn link(&self, link: &str, states: &[String], state: &str, k: &Knobs, s: &Signals) {
        if let Ok(mut shown) = self.shown.lock() {
            note(&mut shown.links, link);
            states.iter().for_each(|st| note(&mut shown.states, st));
        }
        let l = labels(&[("link", link)]);
        for st in states {
            let on = i64::from(st == state);
            self.link_state.get_or_create(&labels(&[("link", link), ("state", st)])).set(on);
        }
        let level = states.iter().position(|s| s == state).unwrap_or(0);
        self.link_state_level.get_or_create(&l).set(level as i64);
        let rtt = [s.rtt_ms, s.baseline_ms, s.rtt_p50_ms, s.rtt_p99_ms, s.peak_p99_ms];
        for (stat, v) in LINK_RTT_STATS.into_iter().zip(rtt) {
            let ls = labels(&[("link", link), ("stat", stat)]);
            // Unmeasured (an idle link): no series, rather than the last value forever.
            match v {
                Some(v) => _ = self.link_rtt.get_or_create(&ls).set(v / 1e3),
                None => _ = self.link_rtt.remove(&ls),
            }
        }
        for (name, v) in [
            ("link_jitter_seconds", s.jitter_ms / 1e3),
            ("link_cross_jitter_seconds", s.cross_jitter_ms.unwrap_or(0.0) / 1e3),
            ("link_rtt_inflation_ratio", s.rtt_inflation),
            ("link_cross_rtt_inflation_ratio", s.cross_rtt_inflation),
            ("link_ce_fraction", s.ce_fraction),
            ("link_cross_ce_fraction", s.cross_ce_fraction),
            ("link_retrans_fraction", s.retrans),
            ("link_cnp_per_second", s.cnp_per_s),
            ("link_goodput_bytes_per_second", s.goodput_bps / 8.0),
            ("link_delivery_bytes_per_second", s.delivery_bps / 8.0),
            ("link_goodput_capacity_ratio", s.goodput_fraction),
        ] {
            set(&self.link_f64, name, &l, v);
        }
        let mode = k.compression.mode();
        for m in Compression::MODES {
            let on = i64::from(*m == mode);
            self.knob_compression.get_or_create(&labels(&[("link", link), ("mode", m)])).set(on);
        }
        for (name, v) in [
            ("knob_compression_ratio", k.compression.ratio()),
            ("knob_chunk_bytes", k.chunk_bytes as f64),
            ("knob_nccl_ib_timeout", f64::from(k.nccl_ib_timeout)),
            ("knob_nccl_ib_retry_cnt", f64::from(k.nccl_ib_retry_cnt)),
            ("knob_watchdog_seconds", f64::from(k.watchdog_s)),
            ("knob_dscp", k.dscp.map_or(-1.0, f64::from)),
            ("knob_roce_traffic_class", k.roce_traffic_class.map_or(-1.0, f64::from)),
            ("knob_tcp_buffer_bytes", k.tcp_buffer_bytes as f64),
            ("knob_sync_every", f64::from(k.sync.sync_every)),
            ("knob_outer_compression_ratio", k.sync.outer_compression.ratio()),
            ("knob_fragments", f64::from(k.sync.fragments)),
            ("knob_overlap", f64::from(k.sync.overlap)),
        ] {
            set(&self.knobs, name, &l, v);
        }
    }

    pub fn decision(&self, link: &str, state: &str) {
        if let Ok(mut shown) = self.shown.lock() {
            note(&mut shown.links, link);
            note(&mut shown.states, state);
        }
        self.decisions.get_or_create(&labels(&[("link", link), ("state", state)])).inc();
    }

    /// Removes the series of links and states that are not in these lists (a reloaded
    /// policy's), whatever values they were written with.
    pub fn retain(&self, links: &[String], states: &[String]) {
        let Ok(mut shown) = self.shown.lock() else { return };
        let all_states: BTreeSet<&String> = shown.states.iter().chain(states).collect();
        for link in &shown.links {
            let link_gone = !links.contains(link);
            for st in &all_states {
                if link_gone || !states.contains(st) {
                    let ls = labels(&[("link", link), ("state", st)]);
                    self.link_state.remove(&ls);
                    self.decisions.remove(&ls);
                }
            }
            if !link_gone {
                continue;
            }
            let l = labels(&[("link", link)]);
            self.link_state_level.remove(&l);
            for stat in LINK_RTT_STATS {
                self.link_rtt.remove(&labels(&[("link", link), ("stat", stat)]));
            }
            for (_, f) in self.link_f64.iter().chain(&self.knobs) {
                f.remove(&l);
            }
            for m in Compression::MODES {
                self.knob_compression.remove(&labels(&[("link", link), ("mode", m)]));
            }
        }
        shown.links.retain(|l| links.contains(l));
        shown.states.retain(|s| states.contains(s));
    }
}
