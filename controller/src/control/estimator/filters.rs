//! The estimator's two filters: an EWMA whose weight follows the time a sample spans, and a
//! max over a sliding time window. Apart from the estimator because they know nothing of links
//! or signals.

use std::{collections::VecDeque, time::Duration};

/// Max (or, negated, min) over a sliding time window, amortised O(1).
#[derive(Default)]
pub(super) struct WindowedMax {
    q: VecDeque<(Duration, f64)>,
}

impl WindowedMax {
    pub(super) fn push(&mut self, now: Duration, v: f64, window: Duration) {
        while self.q.back().is_some_and(|&(_, b)| b <= v) {
            self.q.pop_back();
        }
        self.q.push_back((now, v));
        self.expire(now, window);
    }

    /// Forgets values older than `window` (pushes do too, but an idle link pushes nothing).
    pub(super) fn expire(&mut self, now: Duration, window: Duration) {
        while self.q.front().is_some_and(|&(t, _)| now.saturating_sub(t) > window) {
            self.q.pop_front();
        }
    }

    pub(super) fn get(&self) -> Option<f64> {
        self.q.front().map(|&(_, v)| v)
    }
}

/// An EWMA whose weight follows the seconds a sample spans, not the count of samples.
pub(super) struct Ewma {
    pub(super) half_life: f64,
    /// `None` before the first sample (and after the estimator resets it).
    pub(super) value: Option<f64>,
}

impl Ewma {
    pub(super) fn update(&mut self, v: f64, dt: f64) -> f64 {
        let next = match self.value {
            None => v,
            Some(old) => {
                let w = 1.0 - 0.5f64.powf(dt / self.half_life);
                old + w * (v - old)
            }
        };
        self.value = Some(next);
        next
    }
}
