//! From TOML text to a validated [`Scenario`]: the file's raw shape, chains of other
//! scenarios, the checks a phase's link settings must pass, and error positions as line and
//! column.

use std::{fs, ops::Range, path::Path};

use serde::Deserialize;
use toml::Spanned;

use super::{Ecn, LinkModel, LinkSpec, Phase, Ramp, Scenario, ScenarioError, BUILTIN};
use crate::units::{Bytes, Nanos};

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

/// Default queue when a rate is set and no queue is: 100 full-size packets.
const DEFAULT_QUEUE: Bytes = Bytes(150_000);
const MIN_QUEUE: u64 = 1500;

impl Scenario {
    /// [`Scenario::parse`] of a file `depth` chains below the one the user named.
    pub(super) fn parse_depth(
        src: &str,
        file: &str,
        dir: Option<&Path>,
        depth: u8,
    ) -> Result<Self, ScenarioError> {
        let at = |span: Option<Range<usize>>, message: String| {
            ScenarioError::at(file, src, span.map_or(0, |s| s.start), message)
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
