//! `compression = "auto"`: the least compression whose per-step exchange still fits the compute
//! it overlaps with. The jobs on a link report their compute time, their exchange's wait and the
//! bytes they send each step (`board::job_reports`); with the link's rate and RTT that predicts
//! each codec's exchange time:
//!
//! `exchange(c) = latency_rtts x RTT + bytes uncompressed x ratio(c) x 8 / rate`
//!
//! and a step waits for what of it compute does not hide: `wait(c) = exchange(c) - hidden`.
//! How much compute hides is learnt from the jobs: at first all of it (an exchange that
//! overlaps the whole compute); a job that waited `w` with codec `c` showed `hidden =
//! exchange(c) - w` (DDP overlaps only what its buckets leave: one bucket, nothing); one that did
//! not wait showed at least `exchange(c)`. That is kept across codecs, so a codec the job outgrew
//! is not tried again on the model's first guess. Each codec is scored by the
//! step it predicts, its exposed exchange counted with the margin, times its steps-to-loss
//! factor; the best score wins, ties to the weaker codec. A weaker codec than the one in force
//! must fit with twice the margin, so that noise in the rate does not swap codecs back and
//! forth. Every choice carries its [`Prediction`]; once the jobs run the chosen codec, their
//! measured wait judges it ([`Check`]). Pure: time comes with the readings.

use std::{collections::VecDeque, time::Duration};

use serde::{Deserialize, Serialize};

use super::{estimator::Signals, knobs::Compression, policy::Policy, probe::Rate};
use crate::sense::sensors::JobProgress;

/// Rank-steps a window needs before its figures stand for the job.
const MIN_STEPS: u64 = 3;
/// The exposed wait a prediction may miss by, besides the margin's share of the compute: what a
/// step's last bucket and the codec's own work take however well the exchange overlaps.
const WAIT_SLACK_S: f64 = 0.02;

/// The per-step exchanges of the link's jobs (those with `kind` "ddp") over the window.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Load {
    /// Compute per rank and step, s.
    pub compute_s: f64,
    /// Exchange wait no compute hid, per rank and step, s.
    pub wait_s: f64,
    /// Gradient bytes before compression that this host's ranks send per step, all together.
    pub payload_bytes: f64,
    /// The codec the jobs ran over the window.
    pub codec: Compression,
    /// Rank-steps the window covers.
    pub steps: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Totals {
    steps: u64,
    step_s: f64,
    compute_s: f64,
    wire_bytes: u64,
    processes: u32,
}

/// The link's per-step jobs' totals over a sliding window, restarted when their codec changes
/// (a window across two codecs would mix their bytes).
#[derive(Debug, Default)]
pub struct JobWindow {
    codec: Option<Compression>,
    readings: VecDeque<(Duration, Totals)>,
    /// The exchange time per step compute hides, as the jobs' waits showed it (None: nothing
    /// yet, all of the compute).
    hidden: Option<f64>,
}

impl JobWindow {
    /// Folds in one read of the jobs' reports (the link's jobs only).
    pub fn read(&mut self, now: Duration, jobs: &[JobProgress], window: Duration) {
        let per_step: Vec<&JobProgress> = jobs.iter().filter(|j| j.kind == "ddp").collect();
        // The codec most of the steps ran with; jobs on one link follow one board.
        let codec = per_step
            .iter()
            .max_by_key(|j| j.rank_steps)
            .and_then(|j| j.codec.parse::<Compression>().ok());
        let Some(codec) = codec.or_else(|| parse_hook_codec(&per_step)) else {
            self.readings.clear();
            self.codec = None;
            return;
        };
        if self.codec != Some(codec) {
            self.readings.clear();
            self.codec = Some(codec);
        }
        let t = per_step.iter().fold(Totals::default(), |mut t, j| {
            t.steps += j.rank_steps;
            t.step_s += j.step_seconds;
            t.compute_s += j.compute_seconds;
            t.wire_bytes += j.wire_bytes;
            t.processes += j.processes.max(1);
            t
        });
        // Totals never fall while the same jobs run; a job that left restarts the window.
        if self
            .readings
            .back()
            .is_some_and(|(_, b)| t.steps < b.steps || t.wire_bytes < b.wire_bytes)
        {
            self.readings.clear();
        }
        self.readings.push_back((now, t));
        while self.readings.len() > 2
            && self.readings.get(1).is_some_and(|(at, _)| now.saturating_sub(*at) >= window)
        {
            self.readings.pop_front();
        }
    }

    /// The exchange time per step compute hides, as the jobs' waits showed it so far.
    pub fn hidden(&self, load: &Load) -> f64 {
        self.hidden.unwrap_or(load.compute_s).min(load.compute_s)
    }

    /// Learns from `load` how much of the exchange (the model's `exchange_s` for the codec it
    /// ran) compute hides; see the module's comment.
    pub fn calibrate(&mut self, load: &Load, exchange_s: f64) {
        if !exchange_s.is_finite() {
            return;
        }
        let hidden = if load.wait_s > WAIT_SLACK_S {
            exchange_s - load.wait_s
        } else {
            self.hidden(load).max(exchange_s)
        };
        self.hidden = Some(hidden.clamp(0.0, load.compute_s));
    }

    /// The window's figures, once it covers enough steps; `since`: only steps after it.
    pub fn load(&self, since: Option<Duration>) -> Option<Load> {
        let codec = self.codec?;
        let first = self.readings.iter().find(|(at, _)| since.is_none_or(|s| *at >= s))?.1;
        let last = self.readings.back()?.1;
        let steps = last.steps.checked_sub(first.steps)?;
        if steps < MIN_STEPS {
            return None;
        }
        let n = steps as f64;
        let compute_s = (last.compute_s - first.compute_s) / n;
        let wait_s = ((last.step_s - first.step_s) - (last.compute_s - first.compute_s)) / n;
        let wire_per_rank_step = (last.wire_bytes - first.wire_bytes) as f64 / n;
        let payload_bytes = wire_per_rank_step / codec.ratio() * f64::from(last.processes.max(1));
        let ok = compute_s.is_finite() && compute_s > 0.0 && wait_s.is_finite();
        ok.then_some(Load { compute_s, wait_s: wait_s.max(0.0), payload_bytes, codec, steps })
    }
}

/// The hook writes top-k as "topk:0.01", the daemon as "topk:1%": both parse.
fn parse_hook_codec(jobs: &[&JobProgress]) -> Option<Compression> {
    let j = jobs.iter().max_by_key(|j| j.rank_steps)?;
    let ratio = j.codec.strip_prefix("topk:")?.parse::<f64>().ok()?;
    Compression::topk(ratio).ok()
}

/// The rate the jobs' exchanges cross the link at: the most it carried over the window (its
/// busiest tick, or its EWMA), at most a nominal capacity; the capacity itself before anything
/// was measured.
pub fn carry_rate(rate: Rate, s: &Signals) -> Option<f64> {
    let carried = s.burst_bps.max(s.delivery_bps);
    let carried = (carried > 0.0).then_some(carried);
    match rate {
        Rate::Nominal(c) => Some(carried.map_or(c, |m| m.min(c))),
        Rate::Measured(r) => Some(carried.map_or(r, |m| m.max(r))),
        Rate::Probing(_) | Rate::Unknown => carried,
    }
}

/// What a choice expects: the chosen codec's exchange per step, and what it was derived from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    pub codec: Compression,
    /// The exchange time per step expected with `codec`, s.
    pub exchange_s: f64,
    /// Of that, what compute is not expected to hide, per step, s.
    pub wait_s: f64,
    /// The jobs' compute per step, s.
    pub compute_s: f64,
    pub rate_bps: f64,
    pub rtt_ms: f64,
    pub payload_bytes: f64,
    /// Of the exchange, what compute hides per step, as the jobs showed it (at first, all of
    /// the compute).
    pub hidden_s: f64,
}

/// A choice and why it was made.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    pub prediction: Prediction,
    pub why: String,
}

/// The codecs "auto" chooses from, weakest first: none, fp16 (bf16 where a bound names it),
/// int8, int4, and the strongest bound if it is a top-k; those within the bounds.
fn candidates(weakest: Compression, strongest: Compression) -> Vec<Compression> {
    let half = if matches!(weakest, Compression::Bf16) || matches!(strongest, Compression::Bf16) {
        Compression::Bf16
    } else {
        Compression::Fp16
    };
    let mut v = vec![Compression::None, half, Compression::Int8, Compression::Int4];
    if let Compression::TopK(_) = strongest {
        v.push(strongest);
    }
    if let Compression::TopK(_) = weakest {
        v.push(weakest);
    }
    v.retain(|c| c.ratio() <= weakest.ratio() && c.ratio() >= strongest.ratio());
    v.sort_by(|a, b| b.ratio().total_cmp(&a.ratio()));
    v.dedup_by(|a, b| a.ratio() == b.ratio());
    v
}

/// The codec for the link now: `load` the jobs' window, `rate_bps` the rate the link carries
/// them at, `rtt_ms` its RTT baseline, `current` the codec in force.
pub fn choose(
    p: &Policy,
    window: &mut JobWindow,
    rate_bps: f64,
    rtt_ms: f64,
    current: Compression,
) -> Option<Choice> {
    let b = &p.bounds;
    if !(rate_bps > 0.0 && rate_bps.is_finite() && rtt_ms >= 0.0 && rtt_ms.is_finite()) {
        return None;
    }
    let load = window.load(None)?;
    let latency_s = b.codec_latency_rtts * rtt_ms / 1e3;
    let exchange = |c: Compression| latency_s + load.payload_bytes * c.ratio() * 8.0 / rate_bps;
    window.calibrate(&load, exchange(load.codec));
    let hidden = window.hidden(&load);
    let margin = b.codec_margin;
    let exposed = |c: Compression, m: f64| (exchange(c) * (1.0 + m) - hidden).max(0.0);
    let score =
        |c: Compression| (load.compute_s + exposed(c, margin)) * p.outcome.factor(&c.to_string());
    let list = candidates(b.codec_weakest, b.codec_strongest);
    let mut best = *list.first()?;
    for &c in &list[1..] {
        if score(c) < score(best) * (1.0 - 1e-9) {
            best = c;
        }
    }
    // A weaker codec than the one in force needs room for twice the margin; the one in force
    // stays while it scores about as well.
    let weaker = best.ratio() > current.ratio();
    let in_bounds = list.iter().any(|c| c.ratio() == current.ratio());
    let chosen = if weaker && in_bounds && exposed(best, 2.0 * margin) > 0.0 {
        // The weakest codec with that room, if it is still weaker than the one in force.
        list.iter()
            .copied()
            .find(|&c| exposed(c, 2.0 * margin) == 0.0 && score(c) <= score(best) * 1.05)
            .filter(|c| c.ratio() > current.ratio())
            .unwrap_or(current)
    } else {
        best
    };
    let prediction = Prediction {
        codec: chosen,
        exchange_s: exchange(chosen),
        wait_s: exposed(chosen, 0.0),
        compute_s: load.compute_s,
        rate_bps,
        rtt_ms,
        payload_bytes: load.payload_bytes,
        hidden_s: hidden,
    };
    let others: Vec<String> = list
        .iter()
        .filter(|&&c| c != chosen)
        .map(|&c| format!("{c} {:.3}s", exchange(c)))
        .collect();
    let why = format!(
        "compression: auto: {chosen} exchanges {:.1} MB in {:.3}s predicted ({:.2} Gbit/s, RTT \
         {rtt_ms:.1} ms), {:.3}s of it hidden by the {:.3}s of compute a step{}, {:.0}% to \
         spare; {}",
        load.payload_bytes * chosen.ratio() / 1e6,
        exchange(chosen),
        rate_bps / 1e9,
        hidden.min(exchange(chosen)),
        load.compute_s,
        if hidden < load.compute_s { " (as the jobs' waits showed)" } else { "" },
        margin * 100.0,
        others.join(", ")
    );
    Some(Choice { prediction, why })
}

/// A prediction judged by the jobs' wait once they ran its codec.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Check {
    pub at_ms: u64,
    pub link: String,
    pub prediction: Prediction,
    /// When it was judged, and the jobs' measured wait per step then.
    pub judged_at_ms: Option<u64>,
    pub measured_wait_s: Option<f64>,
    pub measured_compute_s: Option<f64>,
    /// "pending", "as_predicted" or "mispredicted".
    pub verdict: String,
}

impl Check {
    pub fn new(at: Duration, link: &str, prediction: Prediction) -> Self {
        Self {
            at_ms: at.as_millis() as u64,
            link: link.to_owned(),
            prediction,
            judged_at_ms: None,
            measured_wait_s: None,
            measured_compute_s: None,
            verdict: "pending".into(),
        }
    }

    pub fn pending(&self) -> bool {
        self.judged_at_ms.is_none()
    }

    /// Judges the prediction with the jobs' steps since it was made, once they ran its codec
    /// for enough steps; true when it was judged now. Mispredicted: the measured wait differs
    /// from the predicted one by more than the margin's share of the compute.
    pub fn judge(&mut self, now: Duration, window: &JobWindow, margin: f64) -> bool {
        if !self.pending() {
            return false;
        }
        let since = Duration::from_millis(self.at_ms);
        let Some(load) = window.load(Some(since)) else { return false };
        if load.codec != self.prediction.codec {
            return false;
        }
        let allowed = margin * load.compute_s + WAIT_SLACK_S;
        let off = (load.wait_s - self.prediction.wait_s).abs() > allowed;
        self.judged_at_ms = Some(now.as_millis() as u64);
        self.measured_wait_s = Some(load.wait_s);
        self.measured_compute_s = Some(load.compute_s);
        self.verdict = if off { "mispredicted" } else { "as_predicted" }.into();
        true
    }

    /// One line for a timeline or a log.
    pub fn describe(&self) -> String {
        let p = &self.prediction;
        match (self.measured_wait_s, self.measured_compute_s) {
            (Some(w), Some(c)) => format!(
                "{}: {} {}: predicted wait {:.3}s a step, measured {w:.3}s (compute {c:.3}s)",
                self.link, p.codec, self.verdict, p.wait_s
            ),
            _ => format!(
                "{}: {} pending: predicted exchange {:.3}s, wait {:.3}s a step",
                self.link, p.codec, p.exchange_s, p.wait_s
            ),
        }
    }
}

#[cfg(test)]
#[path = "codec_tests.rs"]
mod tests;
