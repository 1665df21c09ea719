//! Whether the ranks followed the boards: every step's codec against what the daemons on the
//! ranks' hosts published (their decision logs, with wall-clock times), within the one step the
//! ranks take to agree; and CI's checks of the quick form built on it.

use anyhow::bail;
use serde_json::Value;

use super::runs::Run;

/// The hook reads its board during a step's backward pass; a decision is logged a moment before
/// its board is published. A board codec counts for a step if it was in force at any time from
/// this long before the step began to its end.
const SLACK_S: f64 = 0.25;
/// Fewer steps than this cannot show that anything was followed.
const MIN_STEPS: usize = 10;

/// Codecs from the weakest compression to the strongest, as the hook orders them when the
/// ranks agree (the strongest proposal wins); top-k ratios: smaller is stronger.
fn strength(codec: &str) -> (usize, f64) {
    const ORDER: [&str; 6] = ["none", "fp16", "bf16", "int8", "int4", "topk"];
    let (name, ratio) = codec.split_once(':').unwrap_or((codec, ""));
    let rank = ORDER.iter().position(|n| *n == name).unwrap_or(ORDER.len());
    let ratio = match ratio.strip_suffix('%') {
        Some(pct) => pct.parse::<f64>().map_or(0.0, |p| p / 100.0),
        None => ratio.parse::<f64>().unwrap_or(0.0),
    };
    (rank, -ratio)
}

/// The daemon writes top-k as "topk:1%", the hook as "topk:0.01": one spelling.
fn normalized(codec: &str) -> String {
    match codec.split_once(':') {
        Some(("topk", _)) => format!("topk:{}", -strength(codec).1),
        _ => codec.to_owned(),
    }
}

/// One host's board over time: (unix seconds, codec) of each decision, in order.
fn board_of(decisions: &[Value]) -> Vec<(f64, String)> {
    let mut b: Vec<(f64, String)> = decisions
        .iter()
        .filter_map(|d| {
            Some((d["unix_ms"].as_f64()? / 1e3, normalized(d["knobs"]["compression"].as_str()?)))
        })
        .collect();
    b.sort_by(|x, y| x.0.total_cmp(&y.0));
    b
}

/// Codecs the board showed at some time in [from, to].
fn shown(board: &[(f64, String)], from: f64, to: f64) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if let Some((_, c)) = board.iter().rev().find(|(t, _)| *t <= from) {
        out.push(c.clone());
    }
    for (_, c) in board.iter().filter(|(t, _)| *t > from && *t <= to) {
        if !out.contains(c) {
            out.push(c.clone());
        }
    }
    out
}

#[derive(Debug)]
pub struct Follow {
    pub steps_checked: usize,
    /// The agreed codecs, each time it changed (step, codec).
    pub changes: Vec<(u64, String)>,
    /// The codecs the boards published while the ranks trained.
    pub board_codecs: Vec<String>,
    pub violations: Vec<String>,
}

impl Follow {
    pub fn passed(&self) -> bool {
        // Step 0 runs the safe codec and step 1 the first agreed one: a change after that is
        // the boards being followed.
        self.violations.is_empty()
            && self.steps_checked >= MIN_STEPS
            && self.changes.iter().any(|(step, _)| *step >= 2)
            && self.board_codecs.len() >= 2
    }

    pub fn summary(&self) -> String {
        let changes: Vec<String> =
            self.changes.iter().map(|(s, c)| format!("{c} from step {s}")).collect();
        format!(
            "{} steps checked; codecs {}; boards published {}; {} step(s) off the boards{}",
            self.steps_checked,
            changes.join(", "),
            self.board_codecs.join(", "),
            self.violations.len(),
            self.violations.first().map(|v| format!(" (first: {v})")).unwrap_or_default()
        )
    }
}

/// Checks every step's agreed codec against the boards of the ranks' hosts (rank r runs on the
/// run's r-th host): the codec of step s must be the strongest of one codec per rank that its
/// host's board showed while that rank took step s-1.
pub fn follows_boards(run: &Run) -> Follow {
    let boards: Vec<Vec<(f64, String)>> = run
        .hosts
        .iter()
        .map(|h| run.decisions.get(h).map(|d| board_of(d)).unwrap_or_default())
        .collect();
    let steps: Vec<&Value> = run.steps().collect();
    let (first, last) = (
        steps.first().and_then(|s| s["t_start"].as_f64()).unwrap_or(0.0),
        steps.last().and_then(|s| s["t_end"].as_f64()).unwrap_or(0.0),
    );
    let mut board_codecs: Vec<String> = Vec::new();
    for b in &boards {
        for c in shown(b, first, last) {
            if !board_codecs.contains(&c) {
                board_codecs.push(c);
            }
        }
    }
    let mut f =
        Follow { steps_checked: 0, changes: Vec::new(), board_codecs, violations: Vec::new() };
    for s in &steps {
        let (Some(step), Some(codec)) = (s["step"].as_u64(), s["codec"].as_str()) else { continue };
        let codec = normalized(codec);
        if f.changes.last().is_none_or(|(_, c)| *c != codec) {
            f.changes.push((step, codec.clone()));
        }
        if step == 0 {
            continue; // the safe codec, before any agreement
        }
        // Per rank, what its board showed during the step before.
        let mut allowed: Vec<Vec<String>> = Vec::new();
        for (r, rank) in run.ranks.iter().enumerate() {
            let Some(prev) = rank.iter().find(|p| p["step"].as_u64() == Some(step - 1)) else {
                continue;
            };
            let (t0, t1) =
                (prev["t_start"].as_f64().unwrap_or(0.0), prev["t_end"].as_f64().unwrap_or(0.0));
            allowed.push(boards.get(r).map(|b| shown(b, t0 - SLACK_S, t1)).unwrap_or_default());
        }
        if allowed.len() != run.ranks.len() || allowed.iter().any(Vec::is_empty) {
            f.violations.push(format!("step {step}: no board published for every rank's host"));
            continue;
        }
        f.steps_checked += 1;
        let expected = strongest_of_each(&allowed);
        if !expected.contains(&codec) {
            f.violations.push(format!(
                "step {step}: {codec}, where the boards allowed {}",
                expected.join(" or ")
            ));
        }
    }
    f
}

/// Every codec that is the strongest of one pick from each rank's list.
fn strongest_of_each(allowed: &[Vec<String>]) -> Vec<String> {
    let mut picks: Vec<String> = vec![String::new()];
    for choices in allowed {
        let mut next = Vec::new();
        for p in &picks {
            for c in choices {
                let best = if p.is_empty() || strength(c) > strength(p) { c } else { p };
                if !next.contains(best) {
                    next.push(best.clone());
                }
            }
        }
        picks = next;
    }
    picks
}

/// CI's judgement of the quick form:
/// - adaptive's ranks follow the boards and the codec changed; the same check fails the hook
///   that ignores its board (so it can fail);
/// - adaptive is faster in the congested phase than the strongest fixed baseline (static-bbr:
///   the recipe's int8 on BBR hosts); the same bar fails the shipped policy pinned to no
///   compression (so it can fail: a codec too weak for the phase, or a transport profile that
///   leaves CUBIC to back off from the phase's marks, falls below it);
/// - no failed collective, and every rank of a step on one codec.
pub fn quick(runs: &[Run]) -> anyhow::Result<()> {
    let find = |name: &str| runs.iter().find(|r| r.config == name);
    let (Some(baseline), Some(adaptive), Some(ignored), Some(pinned)) =
        (find("static-bbr"), find("adaptive"), find("board-ignored"), find("adaptive-none"))
    else {
        bail!(
            "the quick benchmark needs the static-bbr, adaptive, board-ignored and \
             adaptive-none configurations"
        );
    };
    let follow = follows_boards(adaptive);
    println!("bench-training --quick: adaptive: {}", follow.summary());
    if !follow.passed() {
        bail!("adaptive's ranks did not follow the boards: {}", follow.summary());
    }
    let control = follows_boards(ignored);
    println!("bench-training --quick: board-ignored (must fail): {}", control.summary());
    if control.passed() {
        bail!(
            "the codec check passed a hook that ignores its board, so it proves nothing: {}",
            control.summary()
        );
    }
    let (rb, codecs) = congested(baseline);
    println!(
        "bench-training --quick: static-bbr {rb:.3} steps/s in the congested phase ({codecs})"
    );
    let faster = |r: &Run| {
        let (rate, codecs) = congested(r);
        println!(
            "bench-training --quick: {} {rate:.3} steps/s in the congested phase ({codecs})",
            r.config
        );
        rate > rb
    };
    if !faster(adaptive) {
        bail!("adaptive is not faster than static-bbr in the congested phase");
    }
    if faster(pinned) {
        bail!(
            "the speed check passed adaptive-none, pinned to no compression on a congested \
             link, so it proves nothing"
        );
    }
    if !adaptive.failed.is_empty() {
        bail!("adaptive had failed collectives: {:?}", adaptive.failed);
    }
    if !adaptive.codec_disagreements().is_empty() {
        bail!(
            "adaptive's ranks used different codecs at steps {:?}",
            adaptive.codec_disagreements()
        );
    }
    Ok(())
}

/// Rank 0's steps per second in the congested phase, and the codecs of every rank's steps
/// there ("int4 x 41").
fn congested(r: &Run) -> (f64, String) {
    let Some(p) = r.phases().into_iter().find(|p| p.name == "congested") else {
        return (0.0, "no congested phase".into());
    };
    let run = r.in_phase(&p);
    let codecs: Vec<String> = run.codecs.iter().map(|(c, n)| format!("{c} x {n}")).collect();
    (run.steps_per_s, codecs.join(", "))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    /// Two ranks (hk0, us0) stepping once a second from t=100; both daemons publish int8 at 90,
    /// the US one int4 at 110.5. `codec(step)` is what the ranks report.
    fn run(codec: impl Fn(u64) -> &'static str) -> Run {
        let ranks = (0..2)
            .map(|r| {
                (0..30u64)
                    .map(|s| {
                        let t = 100.0 + s as f64;
                        json!({ "rank": r, "step": s, "t_start": t, "t_end": t + 0.9,
                                "codec": codec(s) })
                    })
                    .collect()
            })
            .collect();
        let decision =
            |t: f64, c: &str| json!({ "unix_ms": t * 1e3, "knobs": { "compression": c } });
        let mut decisions = BTreeMap::new();
        decisions.insert("hk0".to_owned(), vec![decision(90.0, "int8")]);
        decisions.insert("us0".to_owned(), vec![decision(90.0, "int8"), decision(110.5, "int4")]);
        Run {
            config: "adaptive".into(),
            setup: None,
            repeat: 0,
            pass_s: 60.0,
            pass_end: 200.0,
            failed: Vec::new(),
            ranks,
            evals: Vec::new(),
            eval_noise: None,
            timeline: Vec::new(),
            decisions,
            transport: Value::Null,
            cc: "cubic".into(),
            applied: Value::Null,
            hosts: vec!["hk0".into(), "us0".into()],
            t0: 100.0,
        }
    }

    #[test]
    fn a_hook_that_follows_the_boards_passes() {
        // Step 10 ran 110-110.9: the US board switched during it, so step 11 may use either;
        // from step 12 on int4 is the only codec the boards allow.
        let f = follows_boards(&run(|s| match s {
            0 => "none",
            1..=11 => "int8",
            _ => "int4",
        }));
        assert!(f.passed(), "{}", f.summary());
        assert_eq!(f.changes, vec![(0, "none".into()), (1, "int8".into()), (12, "int4".into())]);
        assert_eq!(f.board_codecs, vec!["int8", "int4"]);
    }

    #[test]
    fn a_hook_that_ignores_the_boards_or_lags_them_fails() {
        let ignoring = follows_boards(&run(|_| "none"));
        assert!(!ignoring.passed());
        assert_eq!(ignoring.violations.len(), 29, "{}", ignoring.summary());
        let late = follows_boards(&run(|s| match s {
            0 => "none",
            1..=12 => "int8",
            _ => "int4",
        }));
        assert!(!late.passed());
        assert_eq!(late.violations, vec!["step 12: int8, where the boards allowed int4"]);
        // Following boards that never changed proves nothing about following.
        let mut still = run(|s| if s == 0 { "none" } else { "int8" });
        still.decisions.insert(
            "us0".into(),
            vec![json!({ "unix_ms": 9e4, "knobs": { "compression": "int8" } })],
        );
        let still = follows_boards(&still);
        assert!(still.violations.is_empty() && !still.passed(), "{}", still.summary());
    }

    #[test]
    fn codecs_are_ordered_and_spelled_one_way() {
        assert!(strength("int4") > strength("int8") && strength("int8") > strength("none"));
        assert!(strength("topk:0.01") > strength("topk:0.1"));
        assert_eq!(normalized("topk:1%"), normalized("topk:0.01"));
        assert_eq!(
            strongest_of_each(&[vec!["int8".into()], vec!["none".into(), "int4".into()]]),
            vec!["int8".to_owned(), "int4".to_owned()]
        );
    }

    #[test]
    fn a_board_shows_what_was_in_force_and_what_came_during() {
        let b =
            vec![(10.0, "int8".to_owned()), (20.0, "int4".to_owned()), (30.0, "int8".to_owned())];
        assert_eq!(shown(&b, 12.0, 15.0), vec!["int8"]);
        assert_eq!(shown(&b, 15.0, 25.0), vec!["int8", "int4"]);
        assert!(shown(&b, 1.0, 5.0).is_empty());
    }
}
