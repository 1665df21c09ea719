//! The benchmark's configurations: how the hosts are tuned, where the ranks run and how they
//! exchange gradients; and which scenarios the shipped policies were tuned on.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _};

use crate::run::workspace_root;

/// Scenarios whose figures the shipped policies were tuned against (`policies/hk-us.toml`'s
/// codecs came from the training day's oracle); every other scenario is held out.
pub const TUNED_ON: &[&str] = &["training-day"];

/// Scenarios of the full run: the one the policies were tuned on, and one they were not.
pub const FULL_SCENARIOS: &[&str] = &["training-day", "training-holdout"];
pub const QUICK_SCENARIO: &str = "training-quick";
/// Days of the reference regime (docs/reference-case.md): the exchange bandwidth-bound, as the
/// reference job's was. Every other day is the latency-bound regime.
pub const REFERENCE_REGIME: &[&str] = &["ref-day", "ref-reroute", "ref-droptail", "ref-fatpipe"];
/// The reference regime's batch per rank is this many times the latency-bound one's: ~1 s of
/// compute a step against the 180 ms round trip, as the reference job's step.
const REFERENCE_BATCH_FACTOR: u32 = 4;
/// The batch per rank (one rank a site) the reference regime was scaled at.
pub const REFERENCE_BATCH: u32 = BATCH * REFERENCE_BATCH_FACTOR;

/// Configurations of a held-out scenario (the comparisons the goals speak of; the oracle's fixed
/// codecs are run on the tuned scenario only).
const HELD_OUT_CONFIGS: &[&str] = &[
    "untuned",
    "static",
    "static-bbr",
    "adaptive",
    "adaptive-codec-auto",
    "colocated",
    "outer-static",
    "outer-expert",
    "adaptive-outer",
];
/// The quick form: adaptive against the strongest fixed baseline, and the negative controls of
/// its two checks (a hook that ignores its board; a policy pinned to the wrong codec).
const QUICK_CONFIGS: &[&str] = &["static-bbr", "adaptive", "board-ignored", "adaptive-none"];
/// Fixed codecs left out of the full run unless named: uncompressed and fp16 exchanges are the
/// slowest in every phase of the earlier training day (0.48 and 0.78 steps/s calm where int8 ran
/// 1.45) and cannot reach a late target within it, so they cannot be the oracle; the
/// co-located run is the uncompressed reference for loss per step. `adaptive-auto` (the policy
/// with `capacity = "auto"`) is run when named, and the quick form's negative controls only there;
/// so is outer-expert's H sweep.
const NOT_BY_DEFAULT: &[&str] =
    &["fixed-none", "fixed-fp16", "adaptive-auto", "board-ignored", "adaptive-none"];

/// A policy file the daemon runs with on every host: the shipped one, mirrored for the US site
/// (its peer is the HK prefix), its link's capacity the lab's (the shipped files describe the
/// 40 Gbit/s reference link; an operator declares the link they have) or `"auto"` (the daemon
/// measures it: no figure a deployment would not have), optionally with every state's
/// compression fixed.
#[derive(Clone, Debug)]
pub struct Policy {
    pub file: PathBuf,
    pub compression: Option<String>,
    pub capacity_auto: bool,
}

impl Policy {
    fn shipped(name: &str) -> Self {
        Self {
            file: workspace_root().join("policies").join(name),
            compression: None,
            capacity_auto: false,
        }
    }

    /// The policy text for a host of `site` ("Hk" or "Us").
    pub fn for_site(&self, site: &str, capacity_bps: Option<f64>) -> anyhow::Result<String> {
        let mut text = fs::read_to_string(&self.file)
            .with_context(|| format!("reading {}", self.file.display()))?;
        let capacity = match capacity_bps {
            _ if self.capacity_auto => Some("auto".to_owned()),
            Some(bps) => Some(format!("{}Mbit/s", (bps / 1e6).round())),
            None => None,
        };
        if let Some(capacity) = capacity {
            let declared =
                text.lines().filter(|l| l.trim_start().starts_with("capacity =")).count();
            if declared != 1 {
                bail!("{}: {declared} capacity lines, expected one", self.file.display());
            }
            text = replace_lines(&text, "capacity =", &format!("capacity = \"{capacity}\""));
        }
        if site == "Us" {
            // The far side of a US host is Hong Kong.
            for (from, to) in [
                ("\"198.18.2.0/24\"", "\"198.18.1.0/24\""),
                ("\"2001:db8:2::/64\"", "\"2001:db8:1::/64\""),
                ("name = \"us\"", "name = \"hk\""),
            ] {
                if !text.contains(from) {
                    bail!("{}: no {from} to mirror for the US site", self.file.display());
                }
                text = text.replace(from, to);
            }
        }
        if let Some(codec) = &self.compression {
            text = replace_lines(&text, "compression =", &format!("compression = \"{codec}\""));
        }
        Ok(text)
    }
}

fn outer_args(every: u32, fragments: u32, overlap: u32) -> Vec<String> {
    [
        ("--hook", "outer".to_owned()),
        ("--outer-every", every.to_string()),
        ("--fragments", fragments.to_string()),
        ("--overlap", overlap.to_string()),
    ]
    .into_iter()
    .flat_map(|(k, v)| [k.to_owned(), v])
    .collect()
}

fn replace_lines(text: &str, starting: &str, with: &str) -> String {
    let lines: Vec<&str> =
        text.lines().map(|l| if l.trim_start().starts_with(starting) { with } else { l }).collect();
    lines.join("\n") + "\n"
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// DDP's own all-reduce: nothing compressed.
    Ddp,
    /// linkpilot's hook following the host's board.
    Board,
    /// linkpilot's hook pointed at no board: it proposes its safe codec (none) on every step
    /// while the daemons decide. The negative control of the check that the ranks follow the
    /// boards: a hook broken this way must fail it.
    IgnoresBoard,
    /// Synchronization across sites every H steps (linkpilot.outer; DDP inside a site): the
    /// plan fixed, or following the host's board.
    Outer(OuterPlan),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OuterPlan {
    /// H steps a round in `fragments` fragments, each overlapped with `overlap` inner steps,
    /// with `codec`: fixed for the whole day.
    Fixed { every: u32, fragments: u32, overlap: u32, codec: &'static str },
    /// The board's plan: the policy's sync knobs, "auto" H resolved from the link's rates and
    /// the job's compute time; started from [`OUTER_START`].
    Board,
}

/// The plan an outer run starts with (the first round runs before any proposal is exchanged).
pub const OUTER_START: (u32, u32, u32) = (16, 4, 2);
/// The published runs' fixed H, scaled to this day's few hundred steps.
pub const OUTER_STATIC_EVERY: u32 = 50;
/// The whole model at once, blocking, int8: as INTELLECT-1 synchronized (int8 pseudo-gradients
/// every 100 steps; this day is shorter).
const OUTER_STATIC: OuterPlan =
    OuterPlan::Fixed { every: OUTER_STATIC_EVERY, fragments: 1, overlap: 0, codec: "int8" };
/// As an engineer sets it from the published runs (Streaming DiLoCo): the same H, the model in
/// 4 fragments streamed one after another, each overlapped with 5 inner steps (at most H /
/// fragments - 1), int8 pseudo-gradients.
const OUTER_EXPERT: OuterPlan = outer_expert(OUTER_STATIC_EVERY);
/// The H of the sweep that picks outer-expert's (`outer-expert-h{H}`, run when named): the
/// expert fixes H once, at the value best on the training day.
pub const OUTER_EXPERT_SWEEP: &[u32] = &[16, 25, 100];

/// The expert's plan at `every` steps a round: 4 fragments, each overlapped with 5 inner steps,
/// or fewer where a round is too short for that (a fragment's exchange must land before the
/// next one starts).
const fn outer_expert(every: u32) -> OuterPlan {
    let most = every / 4 - 1;
    OuterPlan::Fixed {
        every,
        fragments: 4,
        overlap: if most < 5 { most } else { 5 },
        codec: "int8",
    }
}

/// Where the ranks run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// One site's ranks on each side of the lab's WAN link.
    Wan,
    /// Every rank on the Hong Kong host, over loopback: no delay, no bottleneck. The same
    /// ranks, script and data: the fastest this machine trains, the ceiling of every other
    /// configuration.
    Colocated,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub name: String,
    pub per_site: u8,
    /// Sequences per rank and step: with two ranks per site it is halved, so every
    /// configuration trains on the same global batch, the same windows in the same order.
    pub batch: u32,
    pub hook: Hook,
    pub placement: Placement,
    pub policy: Option<Policy>,
    /// Oracle candidates: fixed configurations the per-phase ceiling is taken from.
    pub oracle_candidate: bool,
}

/// Fixed codecs the oracle chooses from, per phase, all on the strongest fixed hosts
/// (`static-bbr.toml`: the recipe with BBR).
const ORACLE_CODECS: &[&str] = &["none", "fp16", "int8", "int4", "topk:1%"];
/// Sequences per rank and step with one rank per site.
pub const BATCH: u32 = 8;

pub fn all() -> Vec<Config> {
    let base = |name: &str, hook, policy: Option<Policy>| Config {
        name: name.into(),
        per_site: 1,
        batch: BATCH,
        hook,
        placement: Placement::Wan,
        policy,
        oracle_candidate: false,
    };
    let mut v = vec![
        base("untuned", Hook::Ddp, None),
        Config { placement: Placement::Colocated, ..base("colocated", Hook::Ddp, None) },
        // The -2x configurations' ceiling: their four ranks' compute shares this machine's
        // cores as theirs does.
        Config {
            per_site: 2,
            batch: BATCH / 2,
            placement: Placement::Colocated,
            ..base("colocated-2x", Hook::Ddp, None)
        },
        base("static", Hook::Board, Some(Policy::shipped("static-handtuned.toml"))),
        // The strongest fixed baseline: the recipe plus BBR and no slow start after idle.
        base("static-bbr", Hook::Board, Some(Policy::shipped("static-bbr.toml"))),
        base("adaptive", Hook::Board, Some(Policy::shipped("hk-us.toml"))),
        // The shipped ladder with every state's codec "auto": chosen from the jobs' load.
        base(
            "adaptive-codec-auto",
            Hook::Board,
            Some(Policy { compression: Some("auto".into()), ..Policy::shipped("hk-us.toml") }),
        ),
        Config {
            per_site: 2,
            batch: BATCH / 2,
            ..base("adaptive-2x", Hook::Board, Some(Policy::shipped("hk-us.toml")))
        },
        base("board-ignored", Hook::IgnoresBoard, Some(Policy::shipped("hk-us.toml"))),
        // The negative control of the quick form's speed check: the shipped policy with every
        // state's codec pinned to none, wrong on a congested link. Its ranks follow their
        // boards, so only a check of what adaptation buys can fail it. (A policy whose codecs
        // go the other way, lighter as states worsen, is refused at load.)
        base(
            "adaptive-none",
            Hook::Board,
            Some(Policy { compression: Some("none".into()), ..Policy::shipped("hk-us.toml") }),
        ),
        base(
            "adaptive-auto",
            Hook::Board,
            Some(Policy { capacity_auto: true, ..Policy::shipped("hk-us.toml") }),
        ),
    ];
    // Every H steps: the static recipe's hosts with a fixed plan, and the shipped policy
    // choosing, with one and with two ranks per site.
    let outer_static = Hook::Outer(OUTER_STATIC);
    let adaptive_outer = Hook::Outer(OuterPlan::Board);
    v.push(base(
        "outer-expert",
        Hook::Outer(OUTER_EXPERT),
        Some(Policy::shipped("static-bbr.toml")),
    ));
    for every in OUTER_EXPERT_SWEEP {
        v.push(base(
            &format!("outer-expert-h{every}"),
            Hook::Outer(outer_expert(*every)),
            Some(Policy::shipped("static-bbr.toml")),
        ));
    }
    for (per_site, suffix) in [(1, ""), (2, "-2x")] {
        // `per_site` ranks a site, each with its share of the batch: the same global batch.
        let ranks = |c: Config| Config { per_site, batch: BATCH / u32::from(per_site), ..c };
        v.push(ranks(base(
            &format!("outer-static{suffix}"),
            outer_static,
            Some(Policy::shipped("static-handtuned.toml")),
        )));
        v.push(ranks(base(
            &format!("adaptive-outer{suffix}"),
            adaptive_outer,
            Some(Policy::shipped("hk-us.toml")),
        )));
    }
    for codec in ORACLE_CODECS {
        let mut policy = Policy::shipped("static-bbr.toml");
        policy.compression = Some((*codec).to_owned());
        v.push(Config {
            oracle_candidate: true,
            ..base(&format!("fixed-{}", codec.replace([':', '%'], "")), Hook::Board, Some(policy))
        });
    }
    v
}

/// The configurations to run over `scenario`: `--configs` by name, else the scenario's default
/// set (quick: static-bbr, adaptive and the negative controls; a held-out scenario: the goals'
/// comparisons; the tuned scenario: everything but the negative controls and the dominated
/// fixed codecs).
pub fn select(
    scenario: &str,
    quick: bool,
    names: Option<&[String]>,
) -> anyhow::Result<Vec<Config>> {
    let all = all();
    let names: Vec<String> = match names {
        Some(n) => n.to_vec(),
        None if quick => QUICK_CONFIGS.iter().map(|s| (*s).to_owned()).collect(),
        None if !TUNED_ON.contains(&scenario) => {
            HELD_OUT_CONFIGS.iter().map(|s| (*s).to_owned()).collect()
        }
        None => all
            .iter()
            .filter(|c| {
                !NOT_BY_DEFAULT.contains(&c.name.as_str()) && !c.name.starts_with("outer-expert-h")
            })
            .map(|c| c.name.clone())
            .collect(),
    };
    let factor = if REFERENCE_REGIME.contains(&scenario) { REFERENCE_BATCH_FACTOR } else { 1 };
    names
        .iter()
        .map(|n| {
            let c = all.iter().find(|c| &c.name == n).cloned().with_context(|| {
                let known: Vec<&str> = all.iter().map(|c| c.name.as_str()).collect();
                format!("no configuration {n:?}; known: {}", known.join(", "))
            })?;
            Ok(Config { batch: c.batch * factor, ..c })
        })
        .collect()
}

/// The reference regime's configurations at `batch` per rank (one rank a site) instead of the
/// batch the regime was scaled at; two ranks a site take half each, as before.
pub fn at_reference_batch(configs: Vec<Config>, batch: u32) -> Vec<Config> {
    configs.into_iter().map(|c| Config { batch: c.batch * batch / REFERENCE_BATCH, ..c }).collect()
}

impl Config {
    pub fn describe(&self) -> String {
        let hosts = match &self.policy {
            None => "hosts' defaults (CUBIC), no daemon".to_owned(),
            Some(p) => format!(
                "linkpilot run with {}{}",
                p.file.file_name().and_then(|f| f.to_str()).unwrap_or("?"),
                p.compression
                    .as_ref()
                    .map(|c| format!(", compression fixed to {c}"))
                    .unwrap_or_default()
                    + if p.capacity_auto { ", capacity auto" } else { "" }
            ),
        };
        let hook = match self.hook {
            Hook::Ddp => "DDP's all-reduce".to_owned(),
            Hook::Board => "the linkpilot hook on the host's board".to_owned(),
            Hook::IgnoresBoard => {
                "the linkpilot hook reading no board (its safe codec, none)".to_owned()
            }
            Hook::Outer(OuterPlan::Fixed { every, fragments: 1, overlap: 0, codec }) => {
                format!("synced across sites every {every} steps, whole, blocking, {codec}")
            }
            Hook::Outer(OuterPlan::Fixed { every, fragments, overlap, codec }) => format!(
                "synced across sites every {every} steps in {fragments} fragments, each \
                 overlapped with {overlap} steps, {codec}"
            ),
            Hook::Outer(OuterPlan::Board) => {
                "synced across sites every H steps as the host's board plans".to_owned()
            }
        };
        let place = match self.placement {
            Placement::Wan => format!("{} rank(s) per site", self.per_site),
            Placement::Colocated => {
                format!("all {} ranks on one host over loopback (no WAN)", 2 * self.per_site)
            }
        };
        format!("{place}, batch {} per rank; {hosts}; {hook}", self.batch)
    }

    /// The training script's arguments for this configuration, with the host's board and env
    /// file.
    pub fn rank_args(&self, board: &Path, env_file: &Path) -> Vec<String> {
        let mut a: Vec<String> = match self.hook {
            Hook::Ddp => vec!["--hook".into(), "none".into()],
            Hook::Board => vec![
                "--hook".into(),
                "linkpilot".into(),
                "--board".into(),
                board.display().to_string(),
            ],
            Hook::IgnoresBoard => vec![
                "--hook".into(),
                "linkpilot".into(),
                "--board".into(),
                board.with_extension("not-the-daemons").display().to_string(),
            ],
            // Blocking, as the published runs: every sync waits for its exchange.
            Hook::Outer(OuterPlan::Fixed { every, fragments, overlap, codec }) => {
                outer_args(every, fragments, overlap)
                    .into_iter()
                    .chain(["--outer-codec".into(), codec.into()])
                    .chain(["--outer-patience-s".into(), "30".into()])
                    .collect()
            }
            Hook::Outer(OuterPlan::Board) => {
                let (every, fragments, overlap) = OUTER_START;
                let mut a = outer_args(every, fragments, overlap);
                a.extend(["--board".into(), board.display().to_string()]);
                a
            }
        };
        a.extend(["--batch".into(), self.batch.to_string()]);
        if self.policy.is_some() {
            a.extend(["--env-file".into(), env_file.display().to_string()]);
        }
        // Sites matter to the cross-site hooks only: plain DDP is one group either way.
        if self.per_site > 1 && self.hook != Hook::Ddp {
            let sites: Vec<String> = (0..2)
                .map(|s| {
                    let n = usize::from(self.per_site);
                    (s * n..(s + 1) * n).map(|r| r.to_string()).collect::<Vec<_>>().join(",")
                })
                .collect();
            a.extend(["--sites".into(), sites.join("/")]);
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quick_forms_controls_run_there_only() {
        let quick = select(QUICK_SCENARIO, true, None).unwrap();
        let names: Vec<&str> = quick.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, QUICK_CONFIGS);
        let pinned = quick.iter().find(|c| c.name == "adaptive-none").unwrap();
        let policy = pinned.policy.as_ref().unwrap();
        assert_eq!(policy.compression.as_deref(), Some("none"));
        assert!(policy.file.ends_with("policies/hk-us.toml") && pinned.hook == Hook::Board);
        let full = select("training-day", false, None).unwrap();
        assert!(!full.iter().any(|c| c.name == "adaptive-none" || c.name == "board-ignored"));
    }

    #[test]
    fn the_h_sweep_varies_h_only_and_runs_when_named() {
        let named: Vec<String> = ["outer-expert", "outer-expert-h16", "outer-expert-h100"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let sweep = select("ref-day", false, Some(&named)).unwrap();
        let plans: Vec<OuterPlan> = sweep
            .iter()
            .map(|c| match c.hook {
                Hook::Outer(p) => p,
                other => panic!("{}: {other:?}", c.name),
            })
            .collect();
        let f = |every, overlap| OuterPlan::Fixed { every, fragments: 4, overlap, codec: "int8" };
        assert_eq!(plans, [f(50, 5), f(16, 3), f(100, 5)]);
        assert!(sweep.iter().all(|c| c.policy.as_ref().unwrap().file.ends_with("static-bbr.toml")));
        for day in ["ref-day", "training-day"] {
            let by_default = select(day, false, None).unwrap();
            assert!(by_default.iter().any(|c| c.name == "outer-expert"), "{day}");
            assert!(!by_default.iter().any(|c| c.name.starts_with("outer-expert-h")), "{day}");
        }
    }
}
