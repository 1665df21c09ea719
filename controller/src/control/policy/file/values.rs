//! The value syntaxes a policy shares across its tables: thresholds on the link's signals, a
//! knob that is fixed or "auto", and one a site may "keep". Apart from the tables because each
//! table's field types are built from them.

use linkpilot_common::units::{Fraction, Nanos, PerSecond, Percent};
use serde::Deserialize;

/// Thresholds on the link's signals; `None` is "not a condition".
#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Thresholds {
    /// RTT over its windowed-min baseline, as a share of the baseline.
    pub rtt_inflation: Option<Percent>,
    /// The same from the RTT samples that show others' queue: the flows of jobs reporting on
    /// this host count only with the first sample of each burst, so their own queue does not.
    pub cross_rtt_inflation: Option<Percent>,
    pub rtt_p99: Option<Nanos>,
    /// RTT p99 minus p50 over the window.
    pub jitter: Option<Nanos>,
    /// The same over the samples `cross_rtt_inflation` reads: a job's own bursts, which queue
    /// behind each other, add none of it.
    pub cross_jitter: Option<Nanos>,
    pub ce_fraction: Option<Fraction>,
    /// `ce_fraction` without the marks on the flows of jobs reporting on this host: their own
    /// bursts' queue does not count.
    pub cross_ce_fraction: Option<Fraction>,
    /// Retransmitted segments per segment sent.
    pub retrans: Option<Fraction>,
    /// RoCE CNPs per second (TC-seen and NIC-handled).
    pub cnp_rate: Option<PerSecond>,
    /// Goodput below this share of the link's capacity (while the link carries traffic).
    pub goodput_below: Option<Fraction>,
    /// Nothing received for this long since the link retransmitted: a dead link or peer.
    pub unanswered: Option<Nanos>,
}

/// A knob value that is either fixed or derived from measurements ("auto").
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Setting<T> {
    Auto,
    Fixed(T),
}

impl<T> Setting<T> {
    /// The value, unless "auto".
    pub(in crate::control::policy) fn fixed(self) -> Option<T> {
        match self {
            Setting::Fixed(t) => Some(t),
            Setting::Auto => None,
        }
    }
}

impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for Setting<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = toml::Value::deserialize(d)?;
        if v.as_str() == Some("auto") {
            return Ok(Setting::Auto);
        }
        T::deserialize(v)
            .map(Setting::Fixed)
            .map_err(|e| serde::de::Error::custom(format!("{}, or \"auto\"", e.message().trim())))
    }
}

/// A knob a site may leave alone: a value, or "keep" (None).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(in crate::control::policy) struct Keep<T>(pub(in crate::control::policy) Option<T>);

impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for Keep<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = toml::Value::deserialize(d)?;
        if v.as_str() == Some("keep") {
            return Ok(Keep(None));
        }
        T::deserialize(v)
            .map(|t| Keep(Some(t)))
            .map_err(|e| serde::de::Error::custom(format!("{}, or \"keep\"", e.message().trim())))
    }
}
