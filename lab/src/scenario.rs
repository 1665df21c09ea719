//! Scenario files: a timeline of phases, each setting the link model of both directions.
//!
//! ```toml
//! name = "congestion-ecn"
//! [[phase]]
//! name = "onset"
//! duration = "30s"
//! [phase.link]                       # both directions
//! delay = { from = "90ms", to = "95ms" }   # values may ramp over the phase
//! rate = "200Mbit/s"
//! queue = "4MiB"
//! ecn = { mode = "step", threshold = "5ms" }
//! [phase.hk_to_us]                   # overrides for one direction
//! rate = "100Mbit/s"
//! ```
//!
//! A scenario may instead `chain` other scenarios by name (built-in, or a file `NAME.toml` next
//! to it). Errors name the file, line and column; nothing is started from a bad file.

use std::{fmt, fs, ops::Range, path::Path};

use serde::{de, Deserialize, Deserializer};
use toml::Spanned;

use crate::units::{BitRate, Bytes, Fraction, Nanos};

/// The built-in scenarios, by name.
pub const BUILTIN: &[(&str, &str)] = &[
    ("steady-180ms", include_str!("../scenarios/steady-180ms.toml")),
    ("congestion-ecn", include_str!("../scenarios/congestion-ecn.toml")),
    ("jitter-spikes", include_str!("../scenarios/jitter-spikes.toml")),
    ("lossy", include_str!("../scenarios/lossy.toml")),
    ("outage", include_str!("../scenarios/outage.toml")),
    ("hk-us-day", include_str!("../scenarios/hk-us-day.toml")),
    ("training-day", include_str!("../scenarios/training-day.toml")),
    ("training-quick", include_str!("../scenarios/training-quick.toml")),
    ("training-holdout", include_str!("../scenarios/training-holdout.toml")),
    ("training-lossy", include_str!("../scenarios/training-lossy.toml")),
    ("ref-day", include_str!("../scenarios/ref-day.toml")),
    ("ref-reroute", include_str!("../scenarios/ref-reroute.toml")),
    ("ref-droptail", include_str!("../scenarios/ref-droptail.toml")),
    ("ref-fatpipe", include_str!("../scenarios/ref-fatpipe.toml")),
];

/// One direction of the WAN link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    HkToUs,
    UsToHk,
}

impl Direction {
    pub const BOTH: [Direction; 2] = [Direction::HkToUs, Direction::UsToHk];

    pub fn name(self) -> &'static str {
        match self {
            Direction::HkToUs => "hk_to_us",
            Direction::UsToHk => "us_to_hk",
        }
    }
}

/// A scenario file that cannot be used, with where the problem is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScenarioError {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: {}", self.file, self.line, self.column, self.message)
    }
}

impl std::error::Error for ScenarioError {}

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
    fn overlay(&self, over: &LinkSpec) -> LinkSpec {
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

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPhase {
    name: String,
    duration: Spanned<Nanos>,
    #[serde(default)]
    link: LinkSpec,
    #[serde(default)]
    hk_to_us: LinkSpec,
    #[serde(default)]
    us_to_hk: LinkSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    name: String,
    #[serde(default)]
    description: String,
    /// Start over after the last phase (default: the last phase goes on).
    #[serde(default, rename = "loop")]
    repeat: bool,
    #[serde(default)]
    phase: Vec<RawPhase>,
    #[serde(default)]
    chain: Option<Spanned<Vec<String>>>,
}

/// Settings of one direction during one phase, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkModel {
    pub delay: Ramp<Nanos>,
    pub jitter: Option<Jitter>,
    pub rate: Option<Ramp<BitRate>>,
    pub queue: Bytes,
    pub ecn: Option<Ecn>,
    pub loss: Option<Loss>,
    pub spikes: Option<Spikes>,
    pub down: bool,
}

/// A validated phase.
#[derive(Clone, Debug, PartialEq)]
pub struct Phase {
    pub name: String,
    pub duration: Nanos,
    pub hk_to_us: LinkModel,
    pub us_to_hk: LinkModel,
}

impl Phase {
    pub fn link(&self, dir: Direction) -> &LinkModel {
        match dir {
            Direction::HkToUs => &self.hk_to_us,
            Direction::UsToHk => &self.us_to_hk,
        }
    }
}

/// A validated scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    pub repeat: bool,
    pub phases: Vec<Phase>,
}

/// Default queue when a rate is set and no queue is: 100 full-size packets.
const DEFAULT_QUEUE: Bytes = Bytes(150_000);
const MIN_QUEUE: u64 = 1500;

impl Scenario {
    /// A built-in scenario by name, or a file by path.
    pub fn load(name_or_path: &str) -> Result<Self, ScenarioError> {
        if let Some((_, src)) = BUILTIN.iter().find(|(n, _)| *n == name_or_path) {
            return Self::parse(src, &format!("<built-in {name_or_path}>"), None);
        }
        let path = Path::new(name_or_path);
        let src = fs::read_to_string(path).map_err(|e| ScenarioError {
            file: name_or_path.to_owned(),
            line: 0,
            column: 0,
            message: format!(
                "cannot read it ({e}); built-in scenarios are: {}",
                BUILTIN.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
            ),
        })?;
        Self::parse(&src, name_or_path, path.parent())
    }

    /// Parses and validates `src`; `dir` is where chained scenario files are looked up.
    pub fn parse(src: &str, file: &str, dir: Option<&Path>) -> Result<Self, ScenarioError> {
        Self::parse_depth(src, file, dir, 0)
    }

    fn parse_depth(
        src: &str,
        file: &str,
        dir: Option<&Path>,
        depth: u8,
    ) -> Result<Self, ScenarioError> {
        let at = |span: Option<Range<usize>>, message: String| {
            let (line, column) = span.map_or((1, 1), |s| line_col(src, s.start));
            ScenarioError { file: file.to_owned(), line, column, message }
        };
        let raw: RawScenario = toml::from_str(src).map_err(|e| {
            let message = match e.span().and_then(|s| key_before(src, s.start)) {
                Some(key) if !e.message().contains(&format!("`{key}`")) => {
                    format!("field `{key}`: {}", e.message())
                }
                _ => e.message().to_owned(),
            };
            at(e.span(), message)
        })?;
        let mut phases = Vec::new();
        if let Some(chain) = &raw.chain {
            if !raw.phase.is_empty() {
                return Err(at(
                    Some(chain.span()),
                    "a scenario has either `chain` or `[[phase]]`, not both".into(),
                ));
            }
            if depth > 4 {
                return Err(at(
                    Some(chain.span()),
                    "chains nest more than 4 deep (a cycle?)".into(),
                ));
            }
            for name in chain.get_ref() {
                let sub = match BUILTIN.iter().find(|(n, _)| n == name) {
                    Some((_, sub_src)) => {
                        Self::parse_depth(sub_src, &format!("<built-in {name}>"), None, depth + 1)
                    }
                    None => {
                        let path = dir.unwrap_or(Path::new(".")).join(format!("{name}.toml"));
                        let sub_src = fs::read_to_string(&path).map_err(|_| {
                            at(
                                Some(chain.span()),
                                format!(
                                    "chained scenario {name:?} is neither built in nor a file {}",
                                    path.display()
                                ),
                            )
                        })?;
                        Self::parse_depth(&sub_src, &path.display().to_string(), dir, depth + 1)
                    }
                }?;
                phases.extend(sub.phases);
            }
        }
        for p in &raw.phase {
            phases.push(validate_phase(p, &at)?);
        }
        if phases.is_empty() {
            return Err(at(
                None,
                "the scenario has no phases: add [[phase]] tables or a `chain`".into(),
            ));
        }
        Ok(Scenario { name: raw.name, description: raw.description, repeat: raw.repeat, phases })
    }

    /// Total length of one pass through the phases.
    pub fn duration(&self) -> Nanos {
        Nanos(self.phases.iter().map(|p| p.duration.0).sum())
    }

    /// The phase in force `elapsed` after the start, its index and how far into it we are (0..1).
    pub fn phase_at(&self, elapsed: Nanos) -> (usize, &Phase, f64) {
        let total = self.duration().0.max(1);
        let mut t = elapsed.0;
        if self.repeat {
            t %= total;
        } else if t >= total {
            let last = self.phases.len() - 1;
            return (last, &self.phases[last], 1.0);
        }
        for (i, p) in self.phases.iter().enumerate() {
            if t < p.duration.0 {
                return (i, p, t as f64 / p.duration.0.max(1) as f64);
            }
            t -= p.duration.0;
        }
        let last = self.phases.len() - 1;
        (last, &self.phases[last], 1.0)
    }

    /// Offset of the start of phase `index` from the start of the scenario.
    pub fn phase_start(&self, index: usize) -> Nanos {
        Nanos(self.phases.iter().take(index).map(|p| p.duration.0).sum())
    }
}

fn validate_phase(
    p: &RawPhase,
    at: &impl Fn(Option<Range<usize>>, String) -> ScenarioError,
) -> Result<Phase, ScenarioError> {
    if p.duration.get_ref().0 == 0 {
        return Err(at(
            Some(p.duration.span()),
            format!("phase {:?}: duration must be above zero", p.name),
        ));
    }
    let link = |over: &LinkSpec| validate_link(&p.link.overlay(over), &p.name, at);
    Ok(Phase {
        name: p.name.clone(),
        duration: *p.duration.get_ref(),
        hk_to_us: link(&p.hk_to_us)?,
        us_to_hk: link(&p.us_to_hk)?,
    })
}

fn validate_link(
    s: &LinkSpec,
    phase: &str,
    at: &impl Fn(Option<Range<usize>>, String) -> ScenarioError,
) -> Result<LinkModel, ScenarioError> {
    let queue = match &s.queue {
        Some(q) if q.get_ref().0 < MIN_QUEUE => {
            return Err(at(
                Some(q.span()),
                format!("phase {phase:?}: queue must hold at least one packet ({MIN_QUEUE}B)"),
            ))
        }
        Some(q) => *q.get_ref(),
        None => DEFAULT_QUEUE,
    };
    if let Some(ecn) = &s.ecn {
        if s.rate.is_none() {
            return Err(at(
                Some(ecn.span()),
                format!("phase {phase:?}: ecn needs a bottleneck `rate` to queue at"),
            ));
        }
        if let Ecn::Red { min, max, .. } = ecn.get_ref() {
            if min >= max {
                return Err(at(
                    Some(ecn.span()),
                    format!("phase {phase:?}: RED needs min < max (got {min} and {max})"),
                ));
            }
        }
    }
    if let Some(sp) = &s.spikes {
        let v = sp.get_ref();
        if v.every.0 == 0 || v.length > v.every {
            return Err(at(
                Some(sp.span()),
                format!("phase {phase:?}: spikes need 0 < length <= every"),
            ));
        }
    }
    Ok(LinkModel {
        delay: s.delay.unwrap_or(Ramp::Fixed(Nanos(0))),
        jitter: s.jitter,
        rate: s.rate,
        queue,
        ecn: s.ecn.as_ref().map(|e| *e.get_ref()),
        loss: s.loss,
        spikes: s.spikes.as_ref().map(|v| *v.get_ref()),
        down: s.down.unwrap_or(false),
    })
}

/// The bare key whose value starts at byte `offset` (`delay` in `delay = "9 parsecs"`).
fn key_before(src: &str, offset: usize) -> Option<&str> {
    let line_start = src[..offset.min(src.len())].rfind('\n').map_or(0, |i| i + 1);
    let before = src[line_start..offset.min(src.len())].trim_end();
    let before = before.strip_suffix('=')?.trim_end();
    let start = before
        .char_indices()
        .rfind(|&(_, c)| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        .map_or(0, |(i, c)| i + c.len_utf8());
    let key = &before[start..];
    (!key.is_empty()).then_some(key)
}

/// 1-based line and column of byte `offset` in `src`.
pub fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let before = &src[..offset.min(src.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests;
