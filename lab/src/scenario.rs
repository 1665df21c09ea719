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
//!
//! This file holds the validated scenario and the timeline queries on it; the settings as
//! written are in `link`, reading and validating a file in `parse`.

mod link;
mod parse;

use std::{fs, path::Path};

pub use link::{Ecn, Jitter, Lerp, LinkSpec, Loss, QueueLevel, Ramp, Spikes};

use crate::units::{BitRate, Bytes, Nanos};

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
pub type ScenarioError = linkpilot_common::config_error::ConfigError;

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

impl Scenario {
    /// A built-in scenario by name, or a file by path.
    pub fn load(name_or_path: &str) -> Result<Self, ScenarioError> {
        if let Some((_, src)) = BUILTIN.iter().find(|(n, _)| *n == name_or_path) {
            return Self::parse(src, &format!("<built-in {name_or_path}>"), None);
        }
        let path = Path::new(name_or_path);
        let src = fs::read_to_string(path).map_err(|e| {
            ScenarioError::unreadable(
                name_or_path,
                format!(
                    "cannot read it ({e}); built-in scenarios are: {}",
                    BUILTIN.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                ),
            )
        })?;
        Self::parse(&src, name_or_path, path.parent())
    }

    /// Parses and validates `src`; `dir` is where chained scenario files are looked up.
    pub fn parse(src: &str, file: &str, dir: Option<&Path>) -> Result<Self, ScenarioError> {
        Self::parse_depth(src, file, dir, 0)
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

#[cfg(test)]
mod tests;
