//! Judging a state change by its outcome. The jobs on a link report their progress (steps and
//! the step time they took, `sense::sensors::JobProgress`); a state change that moved knobs is
//! judged `settle` + `window` after it: the jobs' progress over the window after it (from
//! `settle` on: the ranks adopt a new codec at a step boundary) against the window before it.
//! Slower by more than `slower_by` while the link itself did not worsen: the change is
//! reverted and the same change held off for `hold`, doubled at each revert of it again, up to
//! `hold_max`; a change that is kept clears its history. Pure: time comes with the readings.
//!
//! Progress is steps per second of step time (the inverse of the mean step, exact over the
//! steps a window completed, however the window cuts them), each step divided by the
//! steps-to-loss factor of the codec it ran with: a codec that needs 1.3x the steps to reach
//! the same loss makes 1/1.3 of the progress per step. The link "worsened" when its path got
//! longer (RTT baseline +10%), its measured rate fell by `slower_by`, it had an outage, or
//! retransmissions appeared; CE marks and RTT inflation are not counted, since what the job
//! sends moves them itself (more bytes, a longer queue).

use std::{collections::VecDeque, time::Duration};

use serde::{Deserialize, Serialize};

use super::{
    estimator::{dur, Signals},
    policy::Outcome,
};
use crate::sense::sensors::JobProgress;

/// A state change judged by the jobs' progress (a revert is also a [`Decision`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub at_ms: u64,
    pub link: String,
    pub from: String,
    pub to: String,
    /// "kept", "reverted" or "unjudged".
    pub verdict: String,
    /// The jobs' progress before and after, steps per second of step time.
    pub before: Option<f64>,
    pub after: Option<f64>,
    pub why: String,
    /// For a revert: how long the change is held off, s.
    pub hold_s: Option<f64>,
}

/// A change held off after reverts, as status shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeldChange {
    pub link: String,
    pub from: String,
    pub to: String,
    pub remaining_s: f64,
    pub reverts: u32,
}

/// What the link showed when the jobs were read.
#[derive(Clone, Copy, Debug)]
struct LinkSample {
    at: Duration,
    baseline_ms: Option<f64>,
    rate_bps: f64,
    retrans: f64,
    outage: bool,
}

/// A state change waiting for its judgment.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Pending {
    from: usize,
    to: usize,
    at: Duration,
}

/// A change held off after reverts: `from` -> `to` is not taken before `until`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hold {
    pub from: usize,
    pub to: usize,
    pub until: Duration,
    /// Reverts of this change in a row (the hold doubles with each).
    pub reverts: u32,
}

/// How a judged change came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Kept,
    Reverted,
    /// Too few steps, or no job reported through both windows.
    Unjudged,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Kept => "kept",
            Kind::Reverted => "reverted",
            Kind::Unjudged => "unjudged",
        }
    }
}

/// One judgment: state indices, progress before and after (steps/s), and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Judgment {
    pub from: usize,
    pub to: usize,
    pub kind: Kind,
    pub before: Option<f64>,
    pub after: Option<f64>,
    pub why: String,
    /// For a revert: how long the change is now held off.
    pub hold: Option<Duration>,
}

/// Per link: the readings of the recent windows, the change waiting, the holds.
#[derive(Default)]
pub struct Judge {
    jobs: VecDeque<(Duration, Vec<JobProgress>)>,
    link: VecDeque<LinkSample>,
    pending: Option<Pending>,
    holds: Vec<Hold>,
}

/// Readings kept at most (one a second covers two 600 s windows and the settling).
const MAX_READINGS: usize = 2048;

/// Progress of the jobs over one window: steps weighed by their codec's factor, raw steps,
/// step seconds, and the wall time the readings span.
#[derive(Clone, Copy, Debug, Default)]
struct Window {
    effective: f64,
    steps: u64,
    step_s: f64,
    span_s: f64,
}

impl Window {
    fn rate(&self, min_steps: u32) -> f64 {
        if self.steps >= u64::from(min_steps) && self.step_s > 0.0 {
            self.effective / self.step_s
        } else {
            // Fewer steps than asked for over the whole window: the job all but stalled.
            self.effective / self.span_s.max(1e-9)
        }
    }
}

impl Judge {
    /// Keeps one reading of the jobs on this link, and the link's signals at it.
    pub fn read(&mut self, now: Duration, jobs: Vec<JobProgress>, s: &Signals, cfg: &Outcome) {
        let keep = 2 * dur(cfg.window) + dur(cfg.settle) + Duration::from_secs(5);
        self.jobs.push_back((now, jobs));
        self.link.push_back(LinkSample {
            at: now,
            baseline_ms: s.baseline_ms,
            rate_bps: s.delivery_bps.max(s.received_bps),
            retrans: s.retrans,
            outage: s.unanswered_ms > 0.0,
        });
        while self.jobs.front().is_some_and(|(t, _)| now.saturating_sub(*t) > keep)
            || self.jobs.len() > MAX_READINGS
        {
            self.jobs.pop_front();
        }
        while self.link.front().is_some_and(|l| now.saturating_sub(l.at) > keep)
            || self.link.len() > MAX_READINGS
        {
            self.link.pop_front();
        }
    }

    /// Whether `from` -> `to` is held off at `now`.
    pub fn held(&self, from: usize, to: usize, now: Duration) -> bool {
        self.holds.iter().any(|h| h.from == from && h.to == to && now < h.until)
    }

    /// The holds still in force.
    pub fn holds(&self, now: Duration) -> impl Iterator<Item = &Hold> {
        self.holds.iter().filter(move |h| now < h.until)
    }

    /// (from, to, judged at) of the change waiting for its judgment.
    pub fn pending(&self, cfg: &Outcome) -> Option<(usize, usize, Duration)> {
        self.pending.map(|p| (p.from, p.to, p.at + dur(cfg.settle) + dur(cfg.window)))
    }

    /// A state change at `now`: judged later when `judge` (it moved knobs and the policy
    /// judges), and in any case the end of the one waiting (what follows it is no longer its
    /// outcome alone).
    pub fn changed(&mut self, from: usize, to: usize, now: Duration, judge: bool) {
        self.pending = judge.then_some(Pending { from, to, at: now });
    }

    /// The judgment of the waiting change, once its after-window has passed.
    pub fn due(&mut self, now: Duration, cfg: &Outcome) -> Option<Judgment> {
        let p = self.pending?;
        let (window, settle) = (dur(cfg.window), dur(cfg.settle));
        if now < p.at + settle + window {
            return None;
        }
        self.pending = None;
        let before = (p.at.saturating_sub(window), p.at);
        let after = (p.at + settle, p.at + settle + window);
        let mut j = Judgment {
            from: p.from,
            to: p.to,
            kind: Kind::Unjudged,
            before: None,
            after: None,
            why: String::new(),
            hold: None,
        };
        let (b, a) = match self.windows(before, after, window, cfg) {
            Ok(w) => w,
            Err(why) => {
                j.why = why;
                return Some(j);
            }
        };
        let min = cfg.min_steps;
        if b.steps < u64::from(min) {
            j.why = format!("{} steps in the window before, fewer than {min}", b.steps);
            return Some(j);
        }
        let (rb, ra) = (b.rate(min), a.rate(min));
        (j.before, j.after) = (Some(rb), Some(ra));
        let change = format!(
            "{rb:.3} -> {ra:.3} steps/s ({} and {} steps over {:.0} s)",
            b.steps,
            a.steps,
            window.as_secs_f64()
        );
        if ra >= rb * (1.0 - cfg.slower_by) {
            j.kind = Kind::Kept;
            j.why = format!("jobs not slower: {change}");
            self.holds.retain(|h| !(h.from == p.from && h.to == p.to));
            return Some(j);
        }
        if let Some(worse) = self.link_worsened(before, after, cfg.slower_by) {
            j.kind = Kind::Kept;
            j.why = format!("jobs slower ({change}), but the link worsened: {worse}");
            return Some(j);
        }
        let reverts = self
            .holds
            .iter()
            .find(|h| h.from == p.from && h.to == p.to)
            .map_or(0, |h| h.reverts)
            .saturating_add(1);
        let doubled = dur(cfg.hold).saturating_mul(1u32 << (reverts - 1).min(20));
        let hold = doubled.min(dur(cfg.hold_max));
        self.holds.retain(|h| !(h.from == p.from && h.to == p.to));
        self.holds.push(Hold { from: p.from, to: p.to, until: now + hold, reverts });
        j.kind = Kind::Reverted;
        j.hold = Some(hold);
        j.why = format!(
            "jobs {:.0}% slower ({change}) while the link did not worsen",
            (1.0 - ra / rb) * 100.0
        );
        Some(j)
    }

    /// The jobs that reported through both windows, summed over each.
    fn windows(
        &self,
        before: (Duration, Duration),
        after: (Duration, Duration),
        window: Duration,
        cfg: &Outcome,
    ) -> Result<(Window, Window), String> {
        let names: std::collections::BTreeSet<&str> =
            self.jobs.iter().flat_map(|(_, js)| js.iter().map(|j| j.job.as_str())).collect();
        let (mut b, mut a, mut any) = (Window::default(), Window::default(), false);
        for name in names {
            let (Some(wb), Some(wa)) = (
                self.job_window(name, before, window, cfg),
                self.job_window(name, after, window, cfg),
            ) else {
                continue;
            };
            any = true;
            for (sum, w) in [(&mut b, wb), (&mut a, wa)] {
                sum.effective += w.effective;
                sum.steps += w.steps;
                sum.step_s += w.step_s;
                sum.span_s = sum.span_s.max(w.span_s);
            }
        }
        if any {
            Ok((b, a))
        } else {
            Err("no job reported through both windows".into())
        }
    }

    /// One job's progress over `[t1, t2]`, if its readings span at least 3/4 of it.
    fn job_window(
        &self,
        job: &str,
        (t1, t2): (Duration, Duration),
        window: Duration,
        cfg: &Outcome,
    ) -> Option<Window> {
        let points: Vec<(Duration, &JobProgress)> = self
            .jobs
            .iter()
            .filter(|(t, _)| (t1..=t2).contains(t))
            .filter_map(|(t, js)| js.iter().find(|j| j.job == job).map(|j| (*t, j)))
            .collect();
        let span = points.last()?.0.saturating_sub(points.first()?.0);
        if span * 4 < window * 3 {
            return None;
        }
        let mut w = Window { span_s: span.as_secs_f64(), ..Window::default() };
        for pair in points.windows(2) {
            let (x, y) = (pair[0].1, pair[1].1);
            let steps = y.rank_steps.saturating_sub(x.rank_steps);
            w.steps += steps;
            w.effective += steps as f64 / cfg.factor(&y.codec);
            w.step_s += (y.step_seconds - x.step_seconds).max(0.0);
        }
        Some(w)
    }

    /// How the link got worse from the window before to the one after, if it did.
    fn link_worsened(
        &self,
        before: (Duration, Duration),
        after: (Duration, Duration),
        slower_by: f64,
    ) -> Option<String> {
        let pick = |(t1, t2): (Duration, Duration)| -> Vec<LinkSample> {
            self.link.iter().filter(|l| (t1..=t2).contains(&l.at)).copied().collect()
        };
        let (b, a) = (pick(before), pick(after));
        let mean = |v: &[LinkSample], f: &dyn Fn(&LinkSample) -> Option<f64>| {
            let xs: Vec<f64> = v.iter().filter_map(f).collect();
            (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
        };
        let mut worse = Vec::new();
        if a.iter().any(|l| l.outage) {
            worse.push("an outage".to_owned());
        }
        let baseline = |l: &LinkSample| l.baseline_ms;
        if let (Some(x), Some(y)) = (mean(&b, &baseline), mean(&a, &baseline)) {
            if y > x * 1.1 {
                worse.push(format!("RTT baseline {x:.1} -> {y:.1} ms"));
            }
        }
        let rate = |l: &LinkSample| Some(l.rate_bps);
        if let (Some(x), Some(y)) = (mean(&b, &rate), mean(&a, &rate)) {
            if y < x * (1.0 - slower_by) {
                worse.push(format!("measured rate {:.1} -> {:.1} Mbit/s", x / 1e6, y / 1e6));
            }
        }
        let retrans = |l: &LinkSample| Some(l.retrans);
        if let (Some(x), Some(y)) = (mean(&b, &retrans), mean(&a, &retrans)) {
            if y > (2.0 * x).max(x + 0.005) {
                worse.push(format!(
                    "retransmitted {:.2}% -> {:.2}% of segments",
                    x * 100.0,
                    y * 100.0
                ));
            }
        }
        (!worse.is_empty()).then(|| worse.join(", "))
    }
}
