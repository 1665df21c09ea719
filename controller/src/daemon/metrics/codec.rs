//! `compression = "auto"`'s predictions (`control::codec`), per link: the latest one's expected
//! exchange and wait per step, the jobs' measured wait once they ran its codec, and how many
//! came out as predicted or mispredicted. Series go with their link.

use std::sync::{Arc, Mutex};

use prometheus_client::{
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use super::{family, labels, Labels, F64};
use crate::control::codec::Check;

const VERDICTS: [&str; 2] = ["as_predicted", "mispredicted"];

#[derive(Clone)]
pub struct CodecMetrics {
    predicted: Family<Labels, F64>,
    measured: Family<Labels, F64>,
    verdicts: Family<Labels, Counter>,
    /// The links with series.
    links: Arc<Mutex<Vec<String>>>,
}

impl CodecMetrics {
    pub fn register(r: &mut Registry) -> Self {
        Self {
            predicted: family(
                r,
                "codec_predicted_seconds",
                "compression = \"auto\": the latest choice's expected exchange time per step \
                 (of=\"exchange\") and the part of it compute does not hide (of=\"wait\")",
            ),
            measured: family(
                r,
                "codec_measured_wait_seconds",
                "The jobs' measured exchange wait per step once they ran the latest chosen codec",
            ),
            verdicts: family(
                r,
                "codec_predictions",
                "Codec choices judged by the jobs' measured wait: as_predicted, or mispredicted \
                 (off by more than the margin's share of the compute)",
            ),
            links: Arc::default(),
        }
    }

    /// A judged prediction.
    pub fn judged(&self, c: &Check) {
        if VERDICTS.contains(&c.verdict.as_str()) {
            self.verdicts
                .get_or_create(&labels(&[("link", &c.link), ("verdict", &c.verdict)]))
                .inc();
        }
    }

    /// Every link's latest prediction; the series of links without one go.
    pub fn update(&self, checks: &[Check]) {
        let Ok(mut shown) = self.links.lock() else { return };
        for gone in shown.iter().filter(|l| !checks.iter().any(|c| &c.link == *l)) {
            for of in ["exchange", "wait"] {
                self.predicted.remove(&labels(&[("link", gone), ("of", of)]));
            }
            self.measured.remove(&labels(&[("link", gone)]));
            for v in VERDICTS {
                self.verdicts.remove(&labels(&[("link", gone), ("verdict", v)]));
            }
        }
        *shown = checks.iter().map(|c| c.link.clone()).collect();
        for c in checks {
            let p = &c.prediction;
            for (of, v) in [("exchange", p.exchange_s), ("wait", p.wait_s)] {
                self.predicted.get_or_create(&labels(&[("link", &c.link), ("of", of)])).set(v);
            }
            let measured = self.measured.get_or_create(&labels(&[("link", &c.link)]));
            measured.set(c.measured_wait_s.unwrap_or(f64::NAN));
            for v in VERDICTS {
                let _ = self.verdicts.get_or_create(&labels(&[("link", &c.link), ("verdict", v)]));
            }
        }
    }
}
