//! The link settings a scenario file writes for one direction in one phase: the value types
//! (constant or ramped values, jitter, queue levels, ECN, loss, spikes), how they read from TOML,
//! and how a direction's overrides lay over the settings of both.

use std::fmt;

use serde::{de, Deserialize, Deserializer};
use toml::Spanned;

use crate::units::{BitRate, Bytes, Fraction, Nanos};

/// A value that is constant over a phase or ramps linearly from `from` to `to`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Ramp<T> {
    Fixed(T),
    Linear { from: T, to: T },
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Ramp<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A hand-written visitor rather than `#[serde(untagged)]`, so that "90 parsecs" is
        // reported with the unit's own message instead of a generic "no variant matched".
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> de::Visitor<'de> for V<T> {
            type Value = Ramp<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a value such as \"90ms\", or a ramp { from = ..., to = ... }")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Ramp<T>, E> {
                T::deserialize(de::value::StrDeserializer::<E>::new(s)).map(Ramp::Fixed)
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Ramp<T>, A::Error> {
                #[derive(Deserialize)]
                #[serde(deny_unknown_fields)]
                struct Linear<T> {
                    from: T,
                    to: T,
                }
                let Linear { from, to } =
                    Linear::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(Ramp::Linear { from, to })
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// Interpolation of ramped values, `progress` in [0, 1].
pub trait Lerp: Copy {
    fn lerp(a: Self, b: Self, progress: f64) -> Self;
}

impl Lerp for Nanos {
    fn lerp(a: Self, b: Self, t: f64) -> Self {
        Nanos((a.0 as f64 + (b.0 as f64 - a.0 as f64) * t).round() as u64)
    }
}
impl Lerp for BitRate {
    fn lerp(a: Self, b: Self, t: f64) -> Self {
        BitRate(a.0 + (b.0 - a.0) * t)
    }
}
impl Lerp for Fraction {
    fn lerp(a: Self, b: Self, t: f64) -> Self {
        Fraction(a.0 + (b.0 - a.0) * t)
    }
}

impl<T: Lerp> Ramp<T> {
    pub fn at(&self, progress: f64) -> T {
        match *self {
            Ramp::Fixed(v) => v,
            Ramp::Linear { from, to } => T::lerp(from, to, progress.clamp(0.0, 1.0)),
        }
    }
}

/// Delay variation added to each packet's one-way delay.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(tag = "distribution", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Jitter {
    /// Normal around zero.
    Normal { stddev: Nanos },
    /// Uniform in [-max, +max].
    Uniform { max: Nanos },
    /// Pareto-tailed extra delay (always positive) with the given mean; shape alpha 2.5.
    Pareto { mean: Nanos },
}

/// A queue level: a queueing delay ("5ms") or a queue length ("64KiB").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd)]
pub enum QueueLevel {
    Delay(Nanos),
    Length(Bytes),
}

impl<'de> Deserialize<'de> for QueueLevel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if let Ok(n) = s.parse::<Nanos>() {
            return Ok(QueueLevel::Delay(n));
        }
        s.parse::<Bytes>().map(QueueLevel::Length).map_err(|_| {
            de::Error::custom(format!(
                "invalid queue level {s:?}: expected a queueing delay such as \"5ms\" or a queue length such as \"64KiB\""
            ))
        })
    }
}

impl fmt::Display for QueueLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueLevel::Delay(n) => write!(f, "{n}"),
            QueueLevel::Length(b) => write!(f, "{}B", b.0),
        }
    }
}

/// Where the bottleneck queue marks ECT packets with CE (and drops Not-ECT ones instead).
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(tag = "mode", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Ecn {
    /// Mark every packet that finds the queue at or above `threshold`.
    Step { threshold: QueueLevel },
    /// RED-like: no marks below `min`, probability rising linearly to `max_p` at `max`, every
    /// packet marked above `max`. `min` and `max` are both delays or both lengths.
    Red { min: QueueLevel, max: QueueLevel, max_p: Fraction },
}

/// Random loss.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(tag = "model", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Loss {
    /// Each packet lost independently with probability `rate`.
    Bernoulli { rate: Ramp<Fraction> },
    /// Two-state Markov chain: good -> bad with probability `p`, bad -> good with `r`, per
    /// packet; packets lost with `loss_good` / `loss_bad` in each state.
    GilbertElliott { p: Fraction, r: Fraction, loss_good: Fraction, loss_bad: Fraction },
}

/// Periodic delay spikes: every `every`, for `length`, packets get `extra` one-way delay.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spikes {
    pub extra: Nanos,
    pub every: Nanos,
    pub length: Nanos,
}

/// Link settings as written: every field optional, so a direction can override some.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    /// One-way propagation delay.
    pub delay: Option<Ramp<Nanos>>,
    pub jitter: Option<Jitter>,
    /// Bottleneck rate of IP packets; absent: no bottleneck.
    pub rate: Option<Ramp<BitRate>>,
    /// Bottleneck queue capacity.
    pub queue: Option<Spanned<Bytes>>,
    pub ecn: Option<Spanned<Ecn>>,
    pub loss: Option<Loss>,
    pub spikes: Option<Spanned<Spikes>>,
    /// The link is down: every packet is dropped.
    pub down: Option<bool>,
}

impl LinkSpec {
    /// These settings with every field `over` sets taken from it instead.
    pub(super) fn overlay(&self, over: &LinkSpec) -> LinkSpec {
        LinkSpec {
            delay: over.delay.or(self.delay),
            jitter: over.jitter.or(self.jitter),
            rate: over.rate.or(self.rate),
            queue: over.queue.clone().or_else(|| self.queue.clone()),
            ecn: over.ecn.clone().or_else(|| self.ecn.clone()),
            loss: over.loss.or(self.loss),
            spikes: over.spikes.clone().or_else(|| self.spikes.clone()),
            down: over.down.or(self.down),
        }
    }
}
