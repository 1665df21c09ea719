//! The benchmark's configurations: how the hosts are tuned and how the ranks exchange gradients.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _};

use crate::run::workspace_root;

/// A policy file the daemon runs with on every host: the shipped one, mirrored for the US site
/// (its peer is the HK prefix), its link's capacity the lab's (the shipped files describe the
/// 40 Gbit/s reference link; an operator declares the link they have), optionally with every
/// state's compression fixed.
#[derive(Clone, Debug)]
pub struct Policy {
    pub file: PathBuf,
    pub compression: Option<String>,
}

impl Policy {
    fn shipped(name: &str) -> Self {
        Self { file: workspace_root().join("policies").join(name), compression: None }
    }

    /// The policy text for a host of `site` ("Hk" or "Us").
    pub fn for_site(&self, site: &str, capacity_bps: Option<f64>) -> anyhow::Result<String> {
        let mut text = fs::read_to_string(&self.file)
            .with_context(|| format!("reading {}", self.file.display()))?;
        if let Some(bps) = capacity_bps {
            let declared =
                text.lines().filter(|l| l.trim_start().starts_with("capacity =")).count();
            if declared != 1 {
                bail!("{}: {declared} capacity lines, expected one", self.file.display());
            }
            text = text
                .lines()
                .map(|l| {
                    if l.trim_start().starts_with("capacity =") {
                        format!("capacity = \"{}Mbit/s\"", (bps / 1e6).round())
                    } else {
                        l.to_owned()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n")
                + "\n";
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
            let lines: Vec<String> = text
                .lines()
                .map(|l| {
                    if l.trim_start().starts_with("compression =") {
                        format!("compression = \"{codec}\"")
                    } else {
                        l.to_owned()
                    }
                })
                .collect();
            text = lines.join("\n") + "\n";
        }
        Ok(text)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// DDP's own all-reduce: nothing compressed.
    Ddp,
    /// linkpilot's hook following the host's board.
    Board,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub name: String,
    pub per_site: u8,
    pub hook: Hook,
    pub policy: Option<Policy>,
    /// Oracle candidates: fixed configurations the per-phase ceiling is taken from.
    pub oracle_candidate: bool,
}

/// Fixed codecs the oracle chooses from, per phase, all with the hand-tuned host settings.
const ORACLE_CODECS: &[&str] = &["none", "fp16", "int8", "int4", "topk:1%"];

pub fn all() -> Vec<Config> {
    let mut v = vec![
        Config {
            name: "untuned".into(),
            per_site: 1,
            hook: Hook::Ddp,
            policy: None,
            oracle_candidate: false,
        },
        Config {
            name: "static".into(),
            per_site: 1,
            hook: Hook::Board,
            policy: Some(Policy::shipped("static-handtuned.toml")),
            oracle_candidate: false,
        },
        Config {
            name: "adaptive".into(),
            per_site: 1,
            hook: Hook::Board,
            policy: Some(Policy::shipped("hk-us.toml")),
            oracle_candidate: false,
        },
        Config {
            name: "adaptive-2x".into(),
            per_site: 2,
            hook: Hook::Board,
            policy: Some(Policy::shipped("hk-us.toml")),
            oracle_candidate: false,
        },
    ];
    for codec in ORACLE_CODECS {
        let mut policy = Policy::shipped("static-handtuned.toml");
        policy.compression = Some((*codec).to_owned());
        v.push(Config {
            name: format!("fixed-{}", codec.replace([':', '%'], "")),
            per_site: 1,
            hook: Hook::Board,
            policy: Some(policy),
            oracle_candidate: true,
        });
    }
    v
}

/// The configurations to run: `--configs` by name, else all (quick: untuned and adaptive).
pub fn select(quick: bool, names: Option<&[String]>) -> anyhow::Result<Vec<Config>> {
    let all = all();
    let names: Vec<String> = match names {
        Some(n) => n.to_vec(),
        None if quick => vec!["untuned".into(), "adaptive".into()],
        None => return Ok(all),
    };
    names
        .iter()
        .map(|n| {
            all.iter().find(|c| &c.name == n).cloned().with_context(|| {
                let known: Vec<&str> = all.iter().map(|c| c.name.as_str()).collect();
                format!("no configuration {n:?}; known: {}", known.join(", "))
            })
        })
        .collect()
}

impl Config {
    pub fn describe(&self) -> String {
        let hosts = match &self.policy {
            None => "hosts' defaults, no daemon".to_owned(),
            Some(p) => format!(
                "linkpilot run with {}{}",
                p.file.file_name().and_then(|f| f.to_str()).unwrap_or("?"),
                p.compression
                    .as_ref()
                    .map(|c| format!(", compression fixed to {c}"))
                    .unwrap_or_default()
            ),
        };
        let hook = match self.hook {
            Hook::Ddp => "DDP's all-reduce",
            Hook::Board => "the linkpilot hook on the host's board",
        };
        format!("{} rank(s) per site; {hosts}; {hook}", self.per_site)
    }

    /// The training script's arguments for this configuration.
    pub fn rank_args(&self, board: &Path, env_file: &Path) -> Vec<String> {
        let mut a: Vec<String> = match self.hook {
            Hook::Ddp => vec!["--hook".into(), "none".into()],
            Hook::Board => vec![
                "--hook".into(),
                "linkpilot".into(),
                "--board".into(),
                board.display().to_string(),
            ],
        };
        if self.policy.is_some() {
            a.extend(["--env-file".into(), env_file.display().to_string()]);
        }
        if self.per_site > 1 {
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
