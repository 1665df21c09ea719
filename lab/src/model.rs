//! The link model of one direction: pure, with time and randomness passed in, so it can be
//! tested exactly. It decides each packet's fate at arrival: dropped (and why), or delivered at a
//! given time, possibly CE-marked. Delivery times never decrease: order is preserved.

use rand::{Rng, RngExt as _};
use rand_distr::{Distribution, Normal, Pareto};

use crate::{
    scenario::{Ecn, Jitter, LinkModel, Loss, QueueLevel},
    units::Nanos,
};

/// ECN codepoint of a packet (the two low bits of the IPv4 TOS / IPv6 traffic class).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EcnCodepoint {
    NotEct,
    Ect1,
    Ect0,
    Ce,
}

impl EcnCodepoint {
    pub fn from_bits(bits: u8) -> Self {
        match bits & 3 {
            0 => Self::NotEct,
            1 => Self::Ect1,
            2 => Self::Ect0,
            _ => Self::Ce,
        }
    }

    pub fn is_ect(self) -> bool {
        !matches!(self, Self::NotEct)
    }
}

/// Why a packet was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropCause {
    /// The link was down.
    Outage,
    /// Random loss.
    Loss,
    /// The bottleneck queue was full.
    QueueFull,
    /// A Not-ECT packet where an ECT one would have been marked.
    Aqm,
}

/// A packet's fate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Drop(DropCause),
    Deliver {
        /// When to hand the packet on (monotonic nanoseconds).
        at: u64,
        /// Set CE on the way.
        mark_ce: bool,
        /// Queueing delay at the bottleneck.
        queue_delay: u64,
    },
}

/// Link parameters at one instant (ramps and spikes already evaluated).
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    pub delay: u64,
    pub extra_delay: u64,
    pub jitter: Option<Jitter>,
    pub rate_bps: Option<f64>,
    pub queue_bytes: u64,
    pub ecn: Option<Ecn>,
    pub loss: Option<LossNow>,
    pub down: bool,
}

/// Loss model with ramps evaluated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LossNow {
    Bernoulli(f64),
    GilbertElliott { p: f64, r: f64, loss_good: f64, loss_bad: f64 },
}

impl Params {
    /// Parameters of `link` at `progress` (0..1) through its phase, `in_phase` after its start.
    pub fn of(link: &LinkModel, progress: f64, in_phase: Nanos) -> Self {
        let extra_delay = link
            .spikes
            .map(|s| if in_phase.0 % s.every.0.max(1) < s.length.0 { s.extra.0 } else { 0 })
            .unwrap_or(0);
        Self {
            delay: link.delay.at(progress).0,
            extra_delay,
            jitter: link.jitter,
            rate_bps: link.rate.map(|r| r.at(progress).0),
            queue_bytes: link.queue.0,
            ecn: link.ecn,
            loss: link.loss.map(|l| match l {
                Loss::Bernoulli { rate } => LossNow::Bernoulli(rate.at(progress).0),
                Loss::GilbertElliott { p, r, loss_good, loss_bad } => LossNow::GilbertElliott {
                    p: p.0,
                    r: r.0,
                    loss_good: loss_good.0,
                    loss_bad: loss_bad.0,
                },
            }),
            down: link.down,
        }
    }
}

/// State of one direction.
#[derive(Debug, Default)]
pub struct Link {
    /// When the bottleneck finishes serialising what it holds.
    busy_until: u64,
    /// Delivery time of the last packet accepted.
    last_delivery: u64,
    /// Gilbert-Elliott: in the bad state.
    bad_state: bool,
}

impl Link {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes waiting at the bottleneck at `now`, at `rate_bps`.
    pub fn queued_bytes(&self, now: u64, rate_bps: Option<f64>) -> u64 {
        match rate_bps {
            Some(rate) => (self.busy_until.saturating_sub(now) as f64 * rate / 8e9) as u64,
            None => 0,
        }
    }

    /// Queueing delay a packet arriving at `now` would see.
    pub fn queue_delay(&self, now: u64) -> u64 {
        self.busy_until.saturating_sub(now)
    }

    /// Decides the fate of a packet of `len` IP bytes arriving at `now`.
    pub fn on_packet(
        &mut self,
        p: &Params,
        now: u64,
        len: usize,
        ecn: EcnCodepoint,
        rng: &mut impl Rng,
    ) -> Verdict {
        if p.down {
            return Verdict::Drop(DropCause::Outage);
        }
        if self.lost(p, rng) {
            return Verdict::Drop(DropCause::Loss);
        }
        let mut mark_ce = false;
        let mut queue_delay = 0;
        let mut leaves_bottleneck = now;
        if let Some(rate) = p.rate_bps {
            queue_delay = self.queue_delay(now);
            if self.queued_bytes(now, Some(rate)) + len as u64 > p.queue_bytes {
                return Verdict::Drop(DropCause::QueueFull);
            }
            if let Some(aqm) = p.ecn {
                if should_mark(aqm, queue_delay, self.queued_bytes(now, Some(rate)), rng) {
                    if !ecn.is_ect() {
                        return Verdict::Drop(DropCause::Aqm);
                    }
                    mark_ce = ecn != EcnCodepoint::Ce;
                }
            }
            let serialisation = (len as f64 * 8e9 / rate).round() as u64;
            self.busy_until = self.busy_until.max(now) + serialisation;
            leaves_bottleneck = self.busy_until;
        }
        let jitter = p.jitter.map_or(0, |j| sample_jitter(j, rng));
        let at = (leaves_bottleneck + p.delay + p.extra_delay).saturating_add_signed(jitter);
        let at = at.max(self.last_delivery).max(now);
        self.last_delivery = at;
        Verdict::Deliver { at, mark_ce, queue_delay }
    }

    fn lost(&mut self, p: &Params, rng: &mut impl Rng) -> bool {
        match p.loss {
            None => false,
            Some(LossNow::Bernoulli(rate)) => rng.random::<f64>() < rate,
            Some(LossNow::GilbertElliott { p, r, loss_good, loss_bad }) => {
                // Transition first, then lose with the new state's probability.
                let flip = if self.bad_state { r } else { p };
                if rng.random::<f64>() < flip {
                    self.bad_state = !self.bad_state;
                }
                rng.random::<f64>() < if self.bad_state { loss_bad } else { loss_good }
            }
        }
    }
}

/// Whether a packet finding `queue_delay` ns / `queue_bytes` bytes ahead of it is marked.
fn should_mark(aqm: Ecn, queue_delay: u64, queue_bytes: u64, rng: &mut impl Rng) -> bool {
    let level = |l: QueueLevel| match l {
        QueueLevel::Delay(d) => (queue_delay, d.0),
        QueueLevel::Length(b) => (queue_bytes, b.0),
    };
    match aqm {
        Ecn::Step { threshold } => {
            let (now, at) = level(threshold);
            now >= at
        }
        Ecn::Red { min, max, max_p } => {
            let ((now, lo), (_, hi)) = (level(min), level(max));
            if now < lo {
                false
            } else if now >= hi {
                true
            } else {
                rng.random::<f64>() < max_p.0 * (now - lo) as f64 / (hi - lo) as f64
            }
        }
    }
}

/// A jitter sample in nanoseconds (may be negative).
fn sample_jitter(j: Jitter, rng: &mut impl Rng) -> i64 {
    match j {
        Jitter::Normal { stddev } => {
            Normal::new(0.0, stddev.0 as f64).map_or(0, |d| d.sample(rng) as i64)
        }
        Jitter::Uniform { max } => {
            let m = max.0 as i64;
            if m == 0 {
                0
            } else {
                rng.random_range(-m..=m)
            }
        }
        Jitter::Pareto { mean } => {
            // X ~ Pareto(scale, alpha) is at least `scale` with mean scale*alpha/(alpha-1), so
            // X - scale starts at zero with mean scale/(alpha-1): choose scale for `mean`.
            const ALPHA: f64 = 2.5;
            let scale = mean.0 as f64 * (ALPHA - 1.0);
            if scale <= 0.0 {
                return 0;
            }
            Pareto::new(scale, ALPHA).map_or(0, |d| (d.sample(rng) - scale) as i64)
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::{rngs::SmallRng, SeedableRng};

    use super::*;
    use crate::units::Fraction;

    fn params() -> Params {
        Params {
            delay: 90_000_000,
            extra_delay: 0,
            jitter: None,
            rate_bps: None,
            queue_bytes: 150_000,
            ecn: None,
            loss: None,
            down: false,
        }
    }

    fn rng() -> SmallRng {
        SmallRng::seed_from_u64(7)
    }

    /// How many of `n` back-to-back Not-ECT packets on a fresh link the random loss model drops.
    fn random_losses(p: &Params, n: usize) -> usize {
        let mut l = Link::new();
        let mut r = rng();
        (0..n)
            .filter(|_| {
                l.on_packet(p, 0, 100, EcnCodepoint::NotEct, &mut r)
                    == Verdict::Drop(DropCause::Loss)
            })
            .count()
    }

    #[test]
    fn pure_delay() {
        let mut l = Link::new();
        let v = l.on_packet(&params(), 1_000, 1500, EcnCodepoint::NotEct, &mut rng());
        assert_eq!(v, Verdict::Deliver { at: 90_001_000, mark_ce: false, queue_delay: 0 });
    }

    #[test]
    fn bottleneck_serialises_and_queues() {
        let p = Params { rate_bps: Some(12e6), ..params() }; // 1500 B = 1 ms
        let mut l = Link::new();
        let mut r = rng();
        let a = l.on_packet(&p, 0, 1500, EcnCodepoint::NotEct, &mut r);
        let b = l.on_packet(&p, 0, 1500, EcnCodepoint::NotEct, &mut r);
        assert_eq!(a, Verdict::Deliver { at: 91_000_000, mark_ce: false, queue_delay: 0 });
        assert_eq!(b, Verdict::Deliver { at: 92_000_000, mark_ce: false, queue_delay: 1_000_000 });
        assert_eq!(l.queued_bytes(0, p.rate_bps), 3000);
    }

    #[test]
    fn full_queue_drops() {
        let p = Params { rate_bps: Some(12e6), queue_bytes: 3000, ..params() };
        let mut l = Link::new();
        let mut r = rng();
        let v: Vec<_> =
            (0..3).map(|_| l.on_packet(&p, 0, 1500, EcnCodepoint::NotEct, &mut r)).collect();
        assert!(matches!(v[1], Verdict::Deliver { .. }));
        assert_eq!(v[2], Verdict::Drop(DropCause::QueueFull));
    }

    #[test]
    fn step_ecn_marks_ect_and_drops_not_ect() {
        let p = Params {
            rate_bps: Some(12e6),
            ecn: Some(Ecn::Step { threshold: QueueLevel::Delay(Nanos(1_500_000)) }),
            ..params()
        };
        let mut l = Link::new();
        let mut r = rng();
        for _ in 0..2 {
            assert!(matches!(
                l.on_packet(&p, 0, 1500, EcnCodepoint::Ect0, &mut r),
                Verdict::Deliver { mark_ce: false, .. }
            ));
        }
        // Queue delay now 2 ms >= 1.5 ms.
        assert!(matches!(
            l.on_packet(&p, 0, 1500, EcnCodepoint::Ect0, &mut r),
            Verdict::Deliver { mark_ce: true, .. }
        ));
        assert_eq!(
            l.on_packet(&p, 0, 1500, EcnCodepoint::NotEct, &mut r),
            Verdict::Drop(DropCause::Aqm)
        );
        // Already CE: delivered, not counted as a new mark.
        assert!(matches!(
            l.on_packet(&p, 0, 1500, EcnCodepoint::Ce, &mut r),
            Verdict::Deliver { mark_ce: false, .. }
        ));
    }

    #[test]
    fn outage_drops_everything() {
        let p = Params { down: true, ..params() };
        assert_eq!(
            Link::new().on_packet(&p, 0, 100, EcnCodepoint::Ect0, &mut rng()),
            Verdict::Drop(DropCause::Outage)
        );
    }

    #[test]
    fn bernoulli_loss_rate() {
        let p = Params { loss: Some(LossNow::Bernoulli(0.1)), ..params() };
        let lost = random_losses(&p, 100_000);
        assert!((9_500..10_500).contains(&lost), "{lost}");
    }

    #[test]
    fn gilbert_elliott_mean_loss() {
        // Stationary bad-state share p/(p+r) = 0.01/0.26; loss = that * 0.5 = 1.92%.
        let p = Params {
            loss: Some(LossNow::GilbertElliott { p: 0.01, r: 0.25, loss_good: 0.0, loss_bad: 0.5 }),
            ..params()
        };
        let lost = random_losses(&p, 200_000);
        assert!((3_300..4_400).contains(&lost), "{lost}");
    }

    #[test]
    fn jitter_never_reorders() {
        let p = Params { jitter: Some(Jitter::Normal { stddev: Nanos(5_000_000) }), ..params() };
        let mut l = Link::new();
        let mut r = rng();
        let mut last = 0;
        for i in 0..10_000u64 {
            let Verdict::Deliver { at, .. } =
                l.on_packet(&p, i * 100_000, 100, EcnCodepoint::NotEct, &mut r)
            else {
                panic!("dropped")
            };
            assert!(at >= last && at >= i * 100_000);
            last = at;
        }
    }

    #[test]
    fn red_marks_with_rising_probability() {
        let d = |ns| QueueLevel::Delay(Nanos(ns));
        let aqm = Ecn::Red { min: d(1_000_000), max: d(3_000_000), max_p: Fraction(0.5) };
        let mut r = rng();
        assert!(!should_mark(aqm, 999_999, 0, &mut r));
        assert!(should_mark(aqm, 3_000_000, 0, &mut r));
        let marked = (0..10_000).filter(|_| should_mark(aqm, 2_000_000, 0, &mut r)).count();
        assert!((2_200..2_800).contains(&marked), "{marked}");
    }

    #[test]
    fn length_thresholds_use_queued_bytes() {
        let aqm = Ecn::Step { threshold: QueueLevel::Length(crate::units::Bytes(3000)) };
        let mut r = rng();
        assert!(!should_mark(aqm, u64::MAX, 2999, &mut r));
        assert!(should_mark(aqm, 0, 3000, &mut r));
    }
}
