//! RTT percentiles over a sliding time window in fixed memory, whatever the flow count or tick
//! rate: samples go into log-spaced buckets (1% wide) kept per one-second slot, so a slot that
//! leaves the window is subtracted whole. hdrhistogram cannot take single samples back, which
//! is what a sliding window needs, hence this small structure.

use std::{collections::VecDeque, time::Duration};

/// Smallest and largest RTT the buckets resolve, microseconds; others are clamped.
const LOW_US: f64 = 10.0;
const HIGH_US: f64 = 100_000_000.0;
/// Each bucket is 1% wider than the one before.
const GROWTH: f64 = 1.01;
/// ln(HIGH/LOW) / ln(GROWTH), rounded up.
const BUCKETS: usize = 1621;

fn bucket(us: u32) -> usize {
    let v = f64::from(us).clamp(LOW_US, HIGH_US);
    (((v / LOW_US).ln() / GROWTH.ln()) as usize).min(BUCKETS - 1)
}

/// The geometric middle of a bucket, in milliseconds: within 0.5% of any sample in it.
fn bucket_ms(b: usize) -> f64 {
    LOW_US * GROWTH.powf(b as f64 + 0.5) / 1e3
}

struct Slot {
    index: u64,
    counts: Vec<u32>,
    min_us: u32,
}

/// Samples of the last `window` (plus at most one slot), by bucket.
pub struct RttWindow {
    window: Duration,
    slot_len: Duration,
    slots: VecDeque<Slot>,
    total: Vec<u32>,
    count: u64,
    spare: Option<Vec<u32>>,
}

impl RttWindow {
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            slot_len: Duration::from_secs(1),
            slots: VecDeque::new(),
            total: vec![0; BUCKETS],
            count: 0,
            spare: None,
        }
    }

    /// Records a sample taken at `now` (time since start).
    pub fn push(&mut self, now: Duration, us: u32) {
        let index = (now.as_nanos() / self.slot_len.as_nanos()) as u64;
        if self.slots.back().is_none_or(|s| s.index != index) {
            let counts = self.spare.take().unwrap_or_else(|| vec![0; BUCKETS]);
            self.slots.push_back(Slot { index, counts, min_us: u32::MAX });
        }
        let b = bucket(us);
        let slot = self.slots.back_mut().expect("pushed above");
        slot.counts[b] += 1;
        slot.min_us = slot.min_us.min(us);
        self.total[b] += 1;
        self.count += 1;
    }

    /// Drops the slots that ended more than `window` before `now`.
    pub fn expire(&mut self, now: Duration) {
        let slot_ns = self.slot_len.as_nanos();
        while let Some(front) = self.slots.front() {
            let end = Duration::from_nanos(((u128::from(front.index) + 1) * slot_ns) as u64);
            if now.saturating_sub(end) <= self.window {
                break;
            }
            let mut old = self.slots.pop_front().expect("front exists");
            for (t, c) in self.total.iter_mut().zip(&old.counts) {
                *t -= c;
                self.count -= u64::from(*c);
            }
            old.counts.fill(0);
            self.spare = Some(old.counts);
        }
    }

    pub fn samples(&self) -> u64 {
        self.count
    }

    /// Smallest sample in the window, exact.
    pub fn min_ms(&self) -> Option<f64> {
        let min = self.slots.iter().map(|s| s.min_us).min()?;
        (min != u32::MAX).then(|| f64::from(min) / 1e3)
    }

    /// The sample of rank ceil(q * n), to within half a bucket (0.5%).
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0u64;
        for (b, &c) in self.total.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank {
                return Some(bucket_ms(b));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn buckets_cover_the_range_within_half_a_percent() {
        assert!(bucket(u32::MAX) >= BUCKETS - 2, "the range ends at the last buckets");
        assert_eq!(bucket(0), 0);
        for us in [15, 999, 180_000, 250_000, 99_000_000] {
            let ms = bucket_ms(bucket(us));
            let err = (ms - f64::from(us) / 1e3).abs() / (f64::from(us) / 1e3);
            assert!(err <= 0.0051, "{us} us -> {ms} ms");
        }
    }

    #[test]
    fn percentiles_and_min() {
        let mut w = RttWindow::new(10 * S);
        for i in 0..100u32 {
            w.push(S, 180_000 + i * 100);
        }
        let near = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() <= b * 0.005);
        assert!(near(w.quantile_ms(0.5), 184.9), "{:?}", w.quantile_ms(0.5));
        assert!(near(w.quantile_ms(0.99), 189.8), "{:?}", w.quantile_ms(0.99));
        assert_eq!((w.min_ms(), w.samples()), (Some(180.0), 100));
    }

    #[test]
    fn whole_slots_leave_the_window() {
        let mut w = RttWindow::new(2 * S);
        w.push(Duration::from_millis(500), 1_000);
        w.push(Duration::from_millis(1500), 2_000);
        w.expire(Duration::from_millis(2900));
        assert_eq!(w.samples(), 2, "the slot [0 s, 1 s) ended 1.9 s ago");
        w.expire(Duration::from_millis(3100));
        assert_eq!((w.samples(), w.min_ms()), (1, Some(2.0)));
        w.expire(10 * S);
        assert_eq!((w.samples(), w.min_ms(), w.quantile_ms(0.5)), (0, None, None));
        // The recycled slot starts from zero.
        w.push(11 * S, 5_000);
        assert_eq!(w.samples(), 1);
        assert!(w.quantile_ms(0.99).is_some_and(|v| (v - 5.0).abs() < 0.03));
    }
}
