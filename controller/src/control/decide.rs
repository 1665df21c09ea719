//! The decision core: per link, a ladder of states walked with hysteresis, and knob values
//! derived from the state and the signals within bounds and step limits. Pure: snapshots carry
//! their own time, nothing here reads a clock or does IO.
//!
//! This file walks the ladder and derives the knobs; reading thresholds against the signals,
//! filing snapshot rows under links, reloads and the read-only views have files of their own.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{
    auto::{knobs_for, pace, PACED},
    codec::{self, Check, JobWindow, Prediction},
    estimator::{Aggregate, Estimator, Signals},
    knobs::Knobs,
    outcome::{Judge, Kind, Verdict},
    policy::{Policy, Setting},
    probe::{Inputs, RateProbe},
};
use crate::sense::sensors::{JobProgress, Snapshot};

mod conditions;
mod layout;
mod reload;
mod views;

use conditions::{all_exited, any_entered, entered, exited};

/// One change of a link's state or knobs, with why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// Increases by one with every decision of this core, across links.
    pub id: u64,
    pub at_ms: u64,
    pub link: String,
    pub state: String,
    pub knobs: Knobs,
    /// `knob old -> new` for each change (empty for the first decision).
    pub changes: Vec<String>,
    /// The signals and thresholds behind it: "congested: ce_fraction 3.1% >= 1% for 1.2 s".
    pub reason: String,
    pub signals: Signals,
    /// With `compression = "auto"`, when the codec was chosen: the exchange it expects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<Prediction>,
}

struct LinkControl {
    estimator: Estimator,
    state: usize,
    last_change: Option<Duration>,
    /// Since when each state's enter condition has held without a break.
    enter_since: Vec<Option<Duration>>,
    exit_since: Option<Duration>,
    knobs: Option<Knobs>,
    knob_changed: [Option<Duration>; PACED],
    signals: Signals,
    /// Set by a policy reload: the next tick decides (and says why) even if nothing moved.
    reloaded: bool,
    /// With `capacity = "auto"`: the measured rate's probe.
    probe: RateProbe,
    /// State changes judged by the jobs' progress.
    judge: Judge,
    /// The per-step jobs' load, for `compression = "auto"`, and its latest prediction.
    jobs: JobWindow,
    codec_check: Option<Check>,
    /// The id of the link's newest decision.
    decided: u64,
}

impl LinkControl {
    fn new(policy: &Policy, link: &super::policy::Link) -> Self {
        Self {
            estimator: Estimator::new(policy.estimator, link.clone()),
            state: 0,
            last_change: None,
            enter_since: vec![None; policy.states.len()],
            exit_since: None,
            knobs: None,
            knob_changed: [None; PACED],
            signals: Signals::default(),
            reloaded: false,
            probe: RateProbe::default(),
            judge: Judge::default(),
            jobs: JobWindow::default(),
            codec_check: None,
            decided: 0,
        }
    }
}

/// Turns snapshots into decisions for every link of a policy.
pub struct Core {
    policy: Policy,
    links: Vec<LinkControl>,
    next_id: u64,
    /// (hash of interface and peer, link index) of each row of the last snapshot.
    layout: Vec<(u64, Option<usize>)>,
    /// Judgments since the caller last took them.
    verdicts: Vec<Verdict>,
    /// Codec predictions judged since the caller last took them.
    codec_checks: Vec<Check>,
    now: Duration,
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

impl Core {
    pub fn new(policy: Policy) -> Self {
        let links = policy.links.iter().map(|l| LinkControl::new(&policy, l)).collect();
        Self {
            policy,
            links,
            next_id: 1,
            layout: Vec::new(),
            verdicts: Vec::new(),
            codec_checks: Vec::new(),
            now: Duration::ZERO,
        }
    }

    /// Folds in one snapshot; returns the decisions it caused (at most one per link).
    pub fn step(&mut self, snap: &Snapshot) -> Vec<Decision> {
        let aggs = self.aggregate(snap);
        self.step_with_jobs(snap.at_ms, &aggs, snap.jobs.as_deref())
    }

    /// Folds in each link's share of a snapshot taken at `at_ms` (in policy link order), for
    /// callers that already know which rows belong to which link.
    pub fn step_aggregates(&mut self, at_ms: u64, aggs: &[Aggregate]) -> Vec<Decision> {
        self.step_with_jobs(at_ms, aggs, None)
    }

    /// [`Self::step_aggregates`] with the jobs' progress read at this tick, if it was.
    fn step_with_jobs(
        &mut self,
        at_ms: u64,
        aggs: &[Aggregate],
        jobs: Option<&[JobProgress]>,
    ) -> Vec<Decision> {
        let now = Duration::from_millis(at_ms);
        self.now = now;
        let mut out = Vec::new();
        for (i, agg) in aggs.iter().enumerate().take(self.links.len()) {
            if let Some(mut d) = self.step_link(i, now, agg, jobs) {
                d.id = self.next_id;
                self.links[i].decided = d.id;
                self.next_id += 1;
                out.push(d);
            }
        }
        out
    }

    fn step_link(
        &mut self,
        i: usize,
        now: Duration,
        agg: &Aggregate,
        jobs: Option<&[JobProgress]>,
    ) -> Option<Decision> {
        let p = &self.policy;
        let h = p.hysteresis;
        let (enter_after, exit_after, dwell) = (
            Duration::from_nanos(h.enter_after.0),
            Duration::from_nanos(h.exit_after.0),
            Duration::from_nanos(h.min_dwell.0),
        );
        let lc = &mut self.links[i];
        let s = lc.estimator.update_aggregate(now.as_millis() as u64, agg);
        lc.signals = s;
        if let Some(jobs) = jobs {
            // A job on a link the policy lacks counts on the first (as status shows it).
            let link_of = |j: &JobProgress| p.links.iter().position(|l| l.name == j.link);
            let mine: Vec<JobProgress> =
                jobs.iter().filter(|j| link_of(j).unwrap_or(0) == i).cloned().collect();
            lc.jobs.read(now, &mine, Duration::from_nanos(p.estimator.window.0));
            lc.judge.read(now, mine, &s, &p.outcome);
            if let Some(c) = lc.codec_check.as_mut() {
                if c.judge(now, &lc.jobs, p.bounds.codec_margin) {
                    self.codec_checks.push(c.clone());
                }
            }
        }
        let judged = lc.judge.due(now, &p.outcome);
        for (j, st) in p.states.iter().enumerate().skip(1) {
            let holds = any_entered(&st.enter, &s);
            lc.enter_since[j] = if holds { Some(lc.enter_since[j].unwrap_or(now)) } else { None };
        }
        let dwell_ok = lc.last_change.is_none_or(|t| now.saturating_sub(t) >= dwell);
        let mut reasons = Vec::new();
        let before = lc.state;
        let name = |i: usize| p.states[i].name.as_str();
        let mut reverted = false;
        if let Some(j) = judged {
            let text = format!("outcome of {} -> {}: {}", name(j.from), name(j.to), j.why);
            if j.kind == Kind::Reverted && lc.state == j.to {
                let hold = j.hold.unwrap_or_default();
                reasons.push(format!(
                    "{}: {text}; reverted, {} -> {} held off for {}",
                    name(j.from),
                    name(j.from),
                    name(j.to),
                    secs(hold)
                ));
                lc.state = j.from;
                reverted = true;
            }
            self.verdicts.push(Verdict {
                at_ms: now.as_millis() as u64,
                link: lc.estimator.link().name.clone(),
                from: name(j.from).to_owned(),
                to: name(j.to).to_owned(),
                verdict: j.kind.name().to_owned(),
                before: j.before,
                after: j.after,
                why: j.why,
                hold_s: j.hold.map(|h| h.as_secs_f64()),
            });
        }
        // Escalate to the worst state whose condition has held long enough, skipping levels
        // (and changes held off after reverts).
        let up = (lc.state + 1..p.states.len()).rev().find(|&j| {
            lc.enter_since[j].is_some_and(|t| now.saturating_sub(t) >= enter_after)
                && !lc.judge.held(lc.state, j, now)
        });
        let down_held = lc.state > 0 && lc.judge.held(lc.state, lc.state - 1, now);
        if reverted {
            // The revert is this tick's change: the ladder walks again from the next one.
        } else if let (Some(j), true) = (up, dwell_ok) {
            let held = now.saturating_sub(lc.enter_since[j].unwrap_or(now));
            let why = entered(&p.states[j].enter, &s).join(", ");
            reasons.push(format!("{}: {why} for {}", p.states[j].name, secs(held)));
            lc.state = j;
        } else if lc.state > 0 && !down_held {
            let cur = &p.states[lc.state];
            match all_exited(&cur.exit, &s) {
                true => {
                    let since = *lc.exit_since.get_or_insert(now);
                    if now.saturating_sub(since) >= exit_after && dwell_ok {
                        let why = exited(&cur.exit, &s).unwrap_or_default();
                        let next = &p.states[lc.state - 1];
                        reasons.push(format!(
                            "{}: {} cleared for {} ({})",
                            next.name,
                            cur.name,
                            secs(now.saturating_sub(since)),
                            why.join(", ")
                        ));
                        lc.state -= 1;
                    }
                }
                false => lc.exit_since = None,
            }
        }
        let state_changed = lc.state != before;
        if state_changed {
            lc.last_change = Some(now);
            lc.exit_since = None;
        }
        let prev_knobs = lc.knobs;
        let probe = Inputs {
            now,
            signals: &s,
            buffers: prev_knobs.map_or(p.bounds.buffers_min, |k| k.tcp_buffer_bytes),
            buffers_max: p.bounds.buffers_max,
            bdp_factor: p.bounds.buffers_bdp_factor,
            calm: lc.state == 0,
            window: Duration::from_nanos(p.estimator.window.0),
        };
        let rate = lc.probe.rate(lc.estimator.link().capacity_bps, &probe);
        let choice = match p.states[lc.state].knobs.compression {
            Setting::Auto => {
                let current = prev_knobs.map_or(p.bounds.codec_strongest, |k| k.compression);
                match (codec::carry_rate(rate, &s), s.baseline_ms) {
                    (Some(bps), Some(rtt)) => codec::choose(p, &mut lc.jobs, bps, rtt, current),
                    _ => None,
                }
            }
            Setting::Fixed(_) => None,
        };
        let chosen = choice.as_ref().map(|c| c.prediction.codec);
        let target = knobs_for(p, rate, lc.state, &s, prev_knobs.as_ref(), chosen, None);
        let knobs = match lc.knobs {
            None => target,
            Some(prev) => pace(prev, target, state_changed, now, dwell, &mut lc.knob_changed),
        };
        // Formatting the differences costs a dozen strings: only when there are any.
        let changes = match lc.knobs {
            Some(k) if k != knobs => k.changes(&knobs),
            _ => Vec::new(),
        };
        let first = lc.knobs.is_none();
        if state_changed {
            let judge = p.outcome.judge && !reverted && !first && !changes.is_empty();
            lc.judge.changed(before, lc.state, now, judge);
        }
        let reloaded = std::mem::take(&mut lc.reloaded);
        // The codec in force, chosen again without a change (the jobs' first load, say): its
        // prediction is shown and judged all the same, without a decision.
        if let Some(c) = choice.as_ref().filter(|c| c.prediction.codec == knobs.compression) {
            let kept = lc.knobs.is_some_and(|k| k.compression == knobs.compression);
            let unchecked =
                lc.codec_check.as_ref().is_none_or(|k| k.prediction.codec != knobs.compression);
            if kept && unchecked {
                let link = lc.estimator.link().name.clone();
                lc.codec_check = Some(Check::new(now, &link, c.prediction.clone()));
            }
        }
        if !first && !state_changed && !reloaded && changes.is_empty() {
            return None;
        }
        knobs_for(p, rate, lc.state, &s, prev_knobs.as_ref(), chosen, Some(&mut reasons));
        // A prediction stands for the codec in force: recorded (and then judged) when the
        // codec chosen is the one the knobs now carry and it is new.
        let codec_moved = first || prev_knobs.is_some_and(|k| k.compression != knobs.compression);
        let prediction =
            choice.filter(|c| c.prediction.codec == knobs.compression && codec_moved).map(|c| {
                reasons.push(c.why);
                c.prediction
            });
        if let Some(pred) = &prediction {
            let link = lc.estimator.link().name.clone();
            lc.codec_check = Some(Check::new(now, &link, pred.clone()));
        }
        if first {
            reasons.insert(0, format!("start in {}", p.states[lc.state].name));
        }
        if reloaded && !first {
            reasons.insert(0, format!("policy reloaded, in {}", p.states[lc.state].name));
        }
        // Only explain the knobs that moved.
        let moved: Vec<&str> = changes.iter().filter_map(|c| c.split(' ').next()).collect();
        reasons.retain(|r| {
            let knob = r.split(':').next().unwrap_or("");
            first
                || reloaded && r.starts_with("policy reloaded")
                || state_changed && p.states.iter().any(|st| st.name == knob)
                || moved.contains(&knob)
        });
        lc.knobs = Some(knobs);
        Some(Decision {
            id: 0,
            at_ms: now.as_millis() as u64,
            link: lc.estimator.link().name.clone(),
            state: p.states[lc.state].name.clone(),
            knobs,
            changes,
            reason: reasons.join("; "),
            signals: s,
            prediction,
        })
    }
}
