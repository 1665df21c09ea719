//! Decisions judged by their outcome: a simulated job whose step time depends on the state the
//! core is in (as a real one's does on the codec the state sets) runs beside the link.

use super::{
    decide::{Core, Decision},
    outcome::Verdict,
    policy::Policy,
    replay,
    tests::{snap, POLICY},
};
use crate::sense::sensors::{JobProgress, Snapshot};

/// The test ladder with a judge of 10 s windows, 2 s settling, holds of 20 s doubling to 60 s.
fn policy(extra: &str) -> Policy {
    let src = format!(
        "{}\n[outcome]\nwindow = \"10s\"\nsettle = \"2s\"\nmin_steps = 3\n\
         hold = \"20s\"\nhold_max = \"60s\"\n{extra}",
        *POLICY
    );
    Policy::parse(&src, "test").unwrap_or_else(|e| panic!("{e}"))
}

/// A job stepping with `step_s(state)` seconds per step, reporting once a second.
struct Job {
    done: u64,
    secs: f64,
    partial: f64,
}

struct Run {
    decisions: Vec<Decision>,
    verdicts: Vec<Verdict>,
    trace: Vec<Snapshot>,
}

/// `ticks` ticks of 100 ms: CE 5% from 15 s on (the congested state's condition), retransmitted
/// share `retrans(t)`; the job steps at the pace its state gives it.
fn run(
    p: Policy,
    ticks: u64,
    step_s: impl Fn(&str) -> f64,
    codec: impl Fn(&str) -> &'static str,
    retrans: impl Fn(u64) -> f64,
) -> Run {
    let mut core = Core::new(p);
    let mut job = Job { done: 0, secs: 0.0, partial: 0.0 };
    let mut out = Run { decisions: Vec::new(), verdicts: Vec::new(), trace: Vec::new() };
    for t in 0..ticks {
        let state = core.current().first().map_or("healthy".to_owned(), |c| c.1.to_owned());
        let len = step_s(&state);
        job.partial += 0.1 / len;
        if job.partial >= 1.0 {
            job.partial -= 1.0;
            job.done += 1;
            job.secs += len;
        }
        let mut s = snap(t * 100, 180.0, 185.0, if t >= 150 { 0.05 } else { 0.0 }, retrans(t));
        if t % 10 == 0 {
            s.jobs = Some(vec![JobProgress {
                job: "lm".into(),
                link: "wan".into(),
                rank_steps: job.done,
                step_seconds: job.secs,
                codec: codec(&state).into(),
                ..JobProgress::default()
            }]);
        }
        out.decisions.extend(core.step(&s));
        out.verdicts.extend(core.take_verdicts());
        out.trace.push(s);
    }
    out
}

fn codec(state: &str) -> &'static str {
    if state == "healthy" {
        "none"
    } else {
        "int8"
    }
}

fn states(ds: &[Decision]) -> Vec<(u64, &str)> {
    let mut out: Vec<(u64, &str)> = Vec::new();
    for d in ds {
        if out.last().is_none_or(|(_, s)| *s != d.state) {
            out.push((d.at_ms, &d.state));
        }
    }
    out
}

#[test]
fn a_change_that_slows_the_job_is_reverted_and_held_off_ever_longer() {
    // Steps take 1 s when healthy and 2 s when congested: the change halves progress.
    let r = run(policy(""), 1200, |s| if s == "healthy" { 1.0 } else { 2.0 }, codec, |_| 0.0);
    let got = states(&r.decisions);
    // Congested at 15.3 s, judged 12 s later and reverted; held 20 s, re-entered, reverted and
    // held 40 s; re-entered at the end of that.
    let at: Vec<(u64, &str)> = got.iter().map(|&(t, s)| (t / 100 * 100, s)).collect();
    assert_eq!(
        at,
        [
            (0, "healthy"),
            (15300, "congested"),
            (27300, "healthy"),
            (47300, "congested"),
            (59300, "healthy"),
            (99300, "congested"),
            (111300, "healthy"),
        ],
        "{got:?}"
    );
    let reverts: Vec<&Decision> =
        r.decisions.iter().filter(|d| d.reason.contains("reverted")).collect();
    assert_eq!(reverts.len(), 3, "{:#?}", r.decisions);
    assert!(reverts[0].reason.contains("held off for 20.0 s"), "{}", reverts[0].reason);
    assert!(reverts[1].reason.contains("held off for 40.0 s"), "{}", reverts[1].reason);
    assert!(reverts[2].reason.contains("held off for 60.0 s"), "capped: {}", reverts[2].reason);
    assert!(reverts[0].reason.contains("jobs 50% slower"), "{}", reverts[0].reason);
    assert!(reverts[0].changes.iter().any(|c| c == "compression int8 -> none"), "{reverts:?}");
    let kinds: Vec<&str> = r.verdicts.iter().map(|v| v.verdict.as_str()).collect();
    assert_eq!(kinds, ["reverted", "reverted", "reverted"]);
    let v = &r.verdicts[0];
    assert_eq!((v.from.as_str(), v.to.as_str()), ("healthy", "congested"));
    let (b, a) = (v.before.expect("before"), v.after.expect("after"));
    assert!((b - 1.0).abs() < 1e-9 && (a - 0.5).abs() < 1e-9, "{v:?}");
}

/// Why the one change of a run that ended congested was kept (checking that it was).
fn kept_why(r: &Run) -> &str {
    assert_eq!(states(&r.decisions).last().map(|s| s.1), Some("congested"));
    assert_eq!(r.verdicts.len(), 1, "{:?}", r.verdicts);
    assert_eq!(r.verdicts[0].verdict, "kept");
    &r.verdicts[0].why
}

#[test]
fn a_change_that_helps_the_job_is_kept() {
    let r = run(policy(""), 400, |s| if s == "healthy" { 1.0 } else { 0.5 }, codec, |_| 0.0);
    assert!(r.decisions.iter().all(|d| !d.reason.contains("reverted")), "{:#?}", r.decisions);
    let why = kept_why(&r);
    assert!(why.starts_with("jobs not slower: 1.000 -> 2.000 steps/s"), "{why}");
}

#[test]
fn a_slower_job_on_a_worse_link_keeps_the_change() {
    // Retransmissions appear with the change: the link, not the decision, slowed the job.
    let lossy = |t: u64| if t >= 160 { 0.03 } else { 0.0 };
    let r = run(policy(""), 400, |s| if s == "healthy" { 1.0 } else { 2.0 }, codec, lossy);
    let why = kept_why(&r);
    assert!(why.contains("the link worsened: retransmitted 0.00% -> 3.00%"), "{why}");
}

#[test]
fn progress_counts_the_steps_a_codec_needs_to_reach_the_same_loss() {
    // int8 steps twice as fast, but the policy says it needs 2.5x the steps: 20% less progress.
    let p = policy("steps_to_loss = { int8 = 2.5 }");
    let r = run(p, 400, |s| if s == "healthy" { 1.0 } else { 0.5 }, codec, |_| 0.0);
    assert_eq!(
        r.verdicts.first().map(|v| v.verdict.as_str()),
        Some("reverted"),
        "{:?}",
        r.verdicts
    );
    let a = r.verdicts[0].after.expect("after");
    assert!((a - 0.8).abs() < 1e-9, "{:?}", r.verdicts);
}

#[test]
fn without_job_reports_nothing_is_judged_and_nothing_reverted() {
    let mut core = Core::new(policy(""));
    let mut ds = Vec::new();
    let mut verdicts = Vec::new();
    for t in 0..400 {
        ds.extend(core.step(&snap(t * 100, 180.0, 185.0, if t >= 150 { 0.05 } else { 0.0 }, 0.0)));
        verdicts.extend(core.take_verdicts());
    }
    assert_eq!(states(&ds).last().map(|s| s.1), Some("congested"));
    assert_eq!(verdicts.len(), 1);
    assert_eq!(
        (verdicts[0].verdict.as_str(), verdicts[0].why.as_str()),
        ("unjudged", "no job reported through both windows")
    );
}

#[test]
fn judging_off_keeps_every_change() {
    let r = run(
        policy("judge = false"),
        400,
        |s| if s == "healthy" { 1.0 } else { 2.0 },
        codec,
        |_| 0.0,
    );
    assert_eq!(states(&r.decisions).last().map(|s| s.1), Some("congested"));
    assert!(r.verdicts.is_empty(), "{:?}", r.verdicts);
}

#[test]
fn a_recorded_trace_with_job_progress_replays_to_the_same_decisions() {
    let p = policy("");
    let live = run(p.clone(), 600, |s| if s == "healthy" { 1.0 } else { 2.0 }, codec, |_| 0.0);
    let text: String =
        live.trace.iter().map(|s| serde_json::to_string(s).expect("json") + "\n").collect();
    let snaps = replay::read_trace(text.as_bytes(), "trace.jsonl").expect("trace");
    let replayed = replay::run(&p, &snaps);
    assert!(live.decisions.iter().any(|d| d.reason.contains("reverted")));
    assert_eq!(replayed.decisions, live.decisions);
}
