//! Outside oracles: the kernel's own counters (nstat) and bpftool.

use serde_json::Value;

use crate::{netns::Netns, sh};

/// Absolute values of the kernel's SNMP counters in `ns`, read with `nstat -asz` (which neither
/// uses nor updates nstat's history file).
pub fn nstat(ns: &Netns, counters: &[&str]) -> Vec<u64> {
    nstat_in(&ns.name, counters)
}

/// [`nstat`] in the named network namespace (a lab host's, say).
pub fn nstat_in(netns: &str, counters: &[&str]) -> Vec<u64> {
    let out = crate::sh(&[&["ip", "netns", "exec", netns, "nstat", "-asz"], counters].concat());
    counters
        .iter()
        .map(|c| {
            out.lines()
                .find_map(|l| {
                    let mut it = l.split_whitespace();
                    (it.next() == Some(*c)).then(|| it.next()?.parse().ok()).flatten()
                })
                .unwrap_or_else(|| panic!("nstat printed no {c}:\n{out}"))
        })
        .collect()
}

/// Names of all BPF programs loaded in the kernel (`bpftool prog show`).
pub fn loaded_program_names() -> Vec<String> {
    let out = sh(&["bpftool", "prog", "show", "--json"]);
    let progs: Value = serde_json::from_str(&out).expect("bpftool prints JSON");
    progs
        .as_array()
        .expect("bpftool prog show --json is an array")
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect()
}

/// BPF links in the kernel as (link type, program name), from `bpftool link show` and
/// `bpftool prog show`. bpftool 7.1 (Debian 12) prints TCX links as type 11 without the device,
/// so the type is returned as bpftool prints it: "11" for TCX, "perf_event" for tracepoints.
pub fn links() -> Vec<(String, String)> {
    let progs: Value =
        serde_json::from_str(&sh(&["bpftool", "prog", "show", "--json"])).expect("JSON");
    let name_of = |id: &Value| {
        progs
            .as_array()
            .and_then(|a| a.iter().find(|p| p["id"] == *id))
            .and_then(|p| p["name"].as_str())
            .unwrap_or("?")
            .to_owned()
    };
    let links: Value =
        serde_json::from_str(&sh(&["bpftool", "link", "show", "--json"])).expect("JSON");
    links
        .as_array()
        .expect("bpftool link show --json is an array")
        .iter()
        .map(|l| {
            let ty = match &l["type"] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (ty, name_of(&l["prog_id"]))
        })
        .collect()
}
