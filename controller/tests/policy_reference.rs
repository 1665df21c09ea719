//! docs/policy.md against the parser: every table the reference documents lists exactly the keys
//! the parser accepts there (the parser's own list, from the error it gives for an unknown key),
//! and the reference's example policies pass the checks.

use std::{collections::BTreeMap, path::PathBuf};

use linkpilot::control::Policy;

fn reference() -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/policy.md");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The TOML table paths a heading documents: "`[bounds.chunk]`" -> ["bounds.chunk"], "Top
/// level" -> [""], "Thresholds (`[state.enter]`, `[state.exit]`)" -> both.
fn paths_of(heading: &str) -> Vec<String> {
    if heading.trim() == "Top level" {
        return vec![String::new()];
    }
    heading
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|t| t.trim_matches(|c| c == '[' || c == ']').to_owned())
        .collect()
}

/// Each documented table path with the keys of its table (first column, in backquotes).
fn documented() -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current: Vec<String> = Vec::new();
    for line in reference().lines() {
        if let Some(h) = line.strip_prefix("### ").or_else(|| line.strip_prefix("#### ")) {
            current = paths_of(h);
            continue;
        }
        if let Some(h) = line.strip_prefix("## ") {
            // Sections other than the top level's explain; they document no table.
            current = if h == "Top level" { paths_of(h) } else { Vec::new() };
            continue;
        }
        let Some(first) = line.strip_prefix("| `") else { continue };
        let key = first.split('`').next().unwrap_or_default().to_owned();
        for p in &current {
            out.entry(p.clone()).or_default().push(key.clone());
        }
    }
    out
}

/// A valid policy with a spot in every table for a stray key.
const BASE: &str = r#"#TOP
[[link]]
name = "wan"
interfaces = ["eth0"]
capacity = "1Gbit/s"
#LINK
[[link.peer]]
name = "p"
cidrs = ["10.0.0.0/8"]
#PEER
[[state]]
name = "healthy"
#STATE
[state.knobs]
compression = "none"
dscp = 0
roce_traffic_class = 0
#KNOBS
[[state]]
name = "bad"
[state.enter]
retrans = "5%"
#ENTER
[state.exit]
retrans = "1%"
#EXIT
[state.knobs]
compression = "int8"
dscp = 0
roce_traffic_class = 0
"#;

const STRAY: &str = "zz_not_a_key = 1";

/// The policy with a stray key in the table at `path`.
fn with_stray(path: &str) -> String {
    let marker = match path {
        "" => "#TOP",
        "link" => "#LINK",
        "link.peer" => "#PEER",
        "state" => "#STATE",
        "state.knobs" => "#KNOBS",
        "state.enter" => "#ENTER",
        "state.exit" => "#EXIT",
        // Any other table is written on its own at the end.
        p => {
            let p = p.replace(".NAME", ".healthy");
            return format!("{BASE}[{p}]\n{STRAY}\n");
        }
    };
    BASE.replacen(marker, STRAY, 1)
}

/// The keys the parser accepts in the table at `path`: the list in its "unknown field" error.
fn accepted(path: &str) -> Vec<String> {
    let err = match Policy::parse(&with_stray(path), "ref.toml") {
        Ok(_) => panic!("[{path}] accepted {STRAY}"),
        Err(e) => e.to_string(),
    };
    // serde: "expected one of `a`, `b`", or "expected `a`" for a table of one key.
    let (_, list) = err
        .split_once(&format!("unknown field `{}`, expected", STRAY.split(' ').next().unwrap()))
        .unwrap_or_else(|| panic!("[{path}]: no list of keys in the error: {err}"));
    let list = list.lines().next().unwrap_or_default();
    list.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

#[test]
fn the_base_policy_is_valid() {
    let clean = ["#TOP", "#LINK", "#PEER", "#STATE", "#KNOBS", "#ENTER", "#EXIT"]
        .iter()
        .fold(BASE.to_owned(), |s, m| s.replace(m, ""));
    Policy::parse(&clean, "base.toml").unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn every_documented_table_lists_exactly_the_keys_the_parser_accepts() {
    let doc = documented();
    // The tables the parser has, each documented (env is free-form: any name).
    let tables = [
        "",
        "daemon",
        "estimator",
        "hysteresis",
        "bounds",
        "bounds.chunk",
        "bounds.tcp_buffers",
        "bounds.nccl_ib_timeout",
        "bounds.watchdog",
        "bounds.sync_every",
        "bounds.compression",
        "link",
        "link.peer",
        "state",
        "state.enter",
        "state.exit",
        "state.knobs",
        "state.transport",
        "nccl",
        "nccl.state.NAME",
        "host",
        "outcome",
    ];
    let mut wrong = Vec::new();
    for t in tables {
        let mut want = accepted(t);
        want.sort();
        let mut got = doc.get(t).cloned().unwrap_or_default();
        got.sort();
        if want != got {
            wrong.push(format!("[{t}]: the parser accepts {want:?}, the reference lists {got:?}"));
        }
    }
    let extra: Vec<&String> = doc.keys().filter(|k| !tables.contains(&k.as_str())).collect();
    assert!(extra.is_empty(), "the reference documents tables the test does not know: {extra:?}");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_reference_examples_pass_the_checks() {
    let text = reference();
    let blocks: Vec<&str> =
        text.split("```toml\n").skip(1).filter_map(|b| b.split("```").next()).collect();
    assert_eq!(blocks.len(), 2, "two worked examples");
    for b in blocks {
        Policy::parse(b, "example.toml").unwrap_or_else(|e| panic!("{e}\n{b}"));
    }
}
