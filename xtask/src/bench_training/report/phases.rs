//! Per phase rates over a configuration's repeats: steps/s, step time percentiles, WAN bytes
//! per step and codecs. Kept apart from the summary because it gathers per run samples by phase
//! name before any spread is taken.

use std::collections::BTreeMap;

use super::{Run, Spread};

/// One phase's figures over runs, each the spread of the per run values.
#[derive(Default)]
pub(super) struct PhaseRates {
    pub(super) rate: Option<Spread>,
    pub(super) p50: Option<Spread>,
    pub(super) p99: Option<Spread>,
    pub(super) bytes: Option<Spread>,
    pub(super) codecs: BTreeMap<String, usize>,
}

/// One phase's samples over runs: steps/s, p50, p99, WAN bytes per step, steps per codec.
#[derive(Default)]
struct Samples {
    rate: Vec<f64>,
    p50: Vec<f64>,
    p99: Vec<f64>,
    bytes: Vec<f64>,
    codecs: BTreeMap<String, usize>,
}

/// Per phase name, over the runs: steps/s, step time percentiles, WAN bytes per step, codecs.
pub(super) fn phase_rates(runs: &[&Run]) -> Vec<(String, PhaseRates)> {
    let mut order: Vec<String> = Vec::new();
    let mut samples: BTreeMap<String, Samples> = BTreeMap::new();
    for r in runs {
        for p in r.phases() {
            let m = r.in_phase(&p);
            if !order.contains(&p.name) {
                order.push(p.name.clone());
            }
            let e = samples.entry(p.name.clone()).or_default();
            e.rate.push(m.steps_per_s);
            e.p50.push(m.p50_s);
            e.p99.push(m.p99_s);
            e.bytes.push(m.wan_bytes_per_step);
            for (c, n) in m.codecs {
                *e.codecs.entry(c).or_default() += n;
            }
        }
    }
    order
        .into_iter()
        .map(|name| {
            let s = samples.remove(&name).unwrap_or_default();
            let p = PhaseRates {
                rate: Spread::of(s.rate),
                p50: Spread::of(s.p50),
                p99: Spread::of(s.p99),
                bytes: Spread::of(s.bytes),
                codecs: s.codecs,
            };
            (name, p)
        })
        .collect()
}
