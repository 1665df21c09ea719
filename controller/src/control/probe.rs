//! `capacity = "auto"`: the rate the bandwidth-delay-product knobs are sized from when the
//! policy names no capacity. It is the link's measured rate (the largest goodput EWMA over the
//! estimator's window: a tick's own goodput counts what a sender pushed into the bottleneck's
//! queue, more than the link carries), and buffers are sized on the RTT baseline, not the p99
//! (buffers that fill the queue raise the p99, which would raise the buffers). One catch: socket buffers cap what
//! a flow can send (about half the buffer per RTT), so a rate measured through small buffers
//! says what the buffers allow, not what the link does. So when the measured rate fills the
//! buffers (the fit from it is as large as the buffers in force), the buffers are probed: sized
//! for twice the rate; once they are in force for a window, the rate is judged. Grew by 10% or
//! more: the buffers were the limit, and the next probe may follow. Did not: the link is the
//! limit, the buffers go back to fit the measured rate, and the next probe waits
//! [`REPROBE_WINDOWS`] windows (the link may have freed up meanwhile). Probes only start in the
//! ladder's first state: a congested link is not probed.

use std::time::Duration;

use super::estimator::Signals;

/// A rate at least this much higher after a probe means the buffers were the limit.
const GAIN: f64 = 1.1;
/// Windows between a probe that gained nothing and the next one.
pub const REPROBE_WINDOWS: u32 = 10;

/// Where the rate for the BDP-derived knobs comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rate {
    /// The policy's capacity.
    Nominal(f64),
    /// Measured on the link (`capacity = "auto"`).
    Measured(f64),
    /// The rate for which the formula gives the probe's buffers (twice those in force), to see
    /// whether larger buffers carry more.
    Probing(f64),
    /// Auto, and nothing measured yet: the knobs keep their values.
    Unknown,
}

impl Rate {
    pub fn bps(self) -> Option<f64> {
        match self {
            Rate::Nominal(r) | Rate::Measured(r) | Rate::Probing(r) => Some(r),
            Rate::Unknown => None,
        }
    }

    /// How a decision names it.
    pub fn describe(self) -> String {
        let gbit = |r: f64| format!("{:.3} Gbit/s", r / 1e9);
        match self {
            Rate::Nominal(r) => format!("capacity {}", gbit(r)),
            Rate::Measured(r) => format!("measured {}", gbit(r)),
            Rate::Probing(r) => format!("probing {} (twice the buffers in force)", gbit(r)),
            Rate::Unknown => "no rate measured yet".into(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Trial {
    /// The buffers the probe asks for, the rate measured before it, and when it began.
    buffers: u64,
    rate_before: f64,
    began: Duration,
    /// When the buffers in force first reached the probe's.
    in_force_since: Option<Duration>,
}

/// One link's probe state (kept across ticks; a policy reload starts it over).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RateProbe {
    trial: Option<Trial>,
    /// When a probe last gained nothing.
    settled_at: Option<Duration>,
}

/// Inputs of one evaluation.
pub struct Inputs<'a> {
    pub now: Duration,
    pub signals: &'a Signals,
    /// The buffers in force, and the most the bounds allow.
    pub buffers: u64,
    pub buffers_max: u64,
    pub bdp_factor: f64,
    /// In the ladder's first state.
    pub calm: bool,
    /// The estimator's window: how long a probe is measured.
    pub window: Duration,
}

impl RateProbe {
    /// The rate to size the BDP-derived knobs from now; `capacity` is the policy's (None:
    /// "auto"). Called once per tick.
    pub fn rate(&mut self, capacity: Option<f64>, x: &Inputs) -> Rate {
        if let Some(c) = capacity {
            return Rate::Nominal(c);
        }
        // A sender's goodput or a receiver's intake: a flow's buffers bound it at both ends.
        let measured = x.signals.delivery_bps.max(x.signals.received_bps);
        let Some(base) = x.signals.baseline_ms.filter(|_| measured > 0.0) else {
            return Rate::Unknown;
        };
        // The rate for which bdp_factor x rate x RTT baseline is `buffers`.
        let sizing = |buffers: u64| buffers as f64 * 8.0 / (x.bdp_factor * base / 1e3);
        if let Some(t) = &mut self.trial {
            if x.buffers < t.buffers {
                // Asked for, not yet in force (knob changes are paced by the dwell); dropped if
                // the ladder moves or it never comes.
                if x.calm && x.now.saturating_sub(t.began) < 2 * x.window {
                    return Rate::Probing(sizing(t.buffers));
                }
                self.trial = None;
                return Rate::Measured(measured);
            }
            let since = *t.in_force_since.get_or_insert(x.now);
            if x.now.saturating_sub(since) < x.window {
                return Rate::Probing(sizing(t.buffers));
            }
            let gained = measured >= GAIN * t.rate_before;
            self.trial = None;
            if !gained {
                self.settled_at = Some(x.now);
                return Rate::Measured(measured);
            }
        }
        // Flows send about half their buffers per RTT (less with the kernel's overheads): a
        // fit of half the buffers or more means the flows may be using all the buffers allow.
        let fit = x.bdp_factor * measured / 8.0 * base / 1e3;
        let filled = fit >= 0.5 * x.buffers as f64;
        let rested =
            self.settled_at.is_none_or(|t| x.now.saturating_sub(t) >= x.window * REPROBE_WINDOWS);
        if x.calm && filled && rested && x.buffers < x.buffers_max {
            let buffers = x.buffers.saturating_mul(2).min(x.buffers_max);
            self.trial =
                Some(Trial { buffers, rate_before: measured, began: x.now, in_force_since: None });
            return Rate::Probing(sizing(buffers));
        }
        Rate::Measured(measured)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 300 Mbit/s link behind 180 ms: flows send at most half the buffers per RTT, so the
    /// rate measured is the smaller of the two. Started at 8 MiB buffers, the probe doubles them
    /// while the rate follows, stops once the link is the limit, and settles the buffers
    /// between 2 and 4 bandwidth-delay products: never the 1 GiB a nominal 40 Gbit/s gives.
    #[test]
    fn buffers_grow_while_the_rate_follows_and_settle_at_the_link() {
        let (link, rtt): (f64, f64) = (300e6, 180.0);
        let bdp = link / 8.0 * rtt / 1e3;
        let window = Duration::from_secs(10);
        let mut probe = RateProbe::default();
        let mut buffers: u64 = 1 << 20;
        let mut seen = Vec::new();
        for tick in 0..2000u64 {
            let now = Duration::from_millis(tick * 500);
            let rate = link.min(buffers as f64 / 2.0 * 8.0 / (rtt / 1e3));
            let signals =
                Signals { delivery_bps: rate, baseline_ms: Some(rtt), ..Signals::default() };
            let x = Inputs {
                now,
                signals: &signals,
                buffers,
                buffers_max: 1 << 30,
                bdp_factor: 2.0,
                calm: true,
                window,
            };
            let r = probe.rate(None, &x).bps().unwrap();
            // As auto.rs sizes them: the bdp factor x rate x RTT, at most doubled per change.
            let want = (2.0 * r / 8.0 * rtt / 1e3) as u64;
            buffers = want.clamp(buffers / 2, buffers * 2).next_power_of_two();
            seen.push(buffers);
        }
        let late = &seen[1000..];
        let (lo, hi) = (*late.iter().min().unwrap(), *late.iter().max().unwrap());
        assert!(lo as f64 >= 2.0 * bdp * 0.5 && hi as f64 <= 4.0 * bdp * 2.0, "{lo} {hi}");
        assert!(*seen.iter().max().unwrap() as f64 <= 8.0 * bdp, "{:?}", seen.iter().max());
        // It got there: the rate the buffers allow reaches the link's.
        assert!(lo as f64 / 2.0 * 8.0 / (rtt / 1e3) >= link);
    }

    #[test]
    fn a_nominal_capacity_is_used_as_is_and_nothing_measured_keeps_the_knobs() {
        let mut probe = RateProbe::default();
        let s = Signals::default();
        let x = Inputs {
            now: Duration::ZERO,
            signals: &s,
            buffers: 1 << 23,
            buffers_max: 1 << 30,
            bdp_factor: 2.0,
            calm: true,
            window: Duration::from_secs(10),
        };
        assert_eq!(probe.rate(Some(40e9), &x), Rate::Nominal(40e9));
        assert_eq!(probe.rate(None, &x), Rate::Unknown);
    }

    /// Not in the first state: no probe; a probe under way is dropped if the ladder moves, or if
    /// its buffers never come into force.
    #[test]
    fn a_congested_link_is_not_probed() {
        let mut probe = RateProbe::default();
        let s = Signals { delivery_bps: 300e6, baseline_ms: Some(180.0), ..Signals::default() };
        let mut x = Inputs {
            now: Duration::ZERO,
            signals: &s,
            buffers: 1 << 23,
            buffers_max: 1 << 30,
            bdp_factor: 2.0,
            calm: false,
            window: Duration::from_secs(10),
        };
        assert_eq!(probe.rate(None, &x), Rate::Measured(300e6));
        x.calm = true;
        // Sized for twice the buffers in force: 2 x 16 MiB = 2 x rate x 180 ms.
        let twice = Rate::Probing((16 << 20) as f64 * 8.0 / (2.0 * 0.18));
        assert_eq!(probe.rate(None, &x), twice);
        x.calm = false;
        assert_eq!(probe.rate(None, &x), Rate::Measured(300e6));
        x.calm = true;
        assert_eq!(probe.rate(None, &x), twice);
        x.now = Duration::from_secs(25);
        assert_eq!(probe.rate(None, &x), Rate::Measured(300e6), "not in force after 2 windows");
    }
}
