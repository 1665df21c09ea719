//! The transport settings of a run: pinned before it, read back from the kernel while it
//! trains, and the part of a policy's recipe a lab namespace cannot take applied where it takes
//! effect, never silently dropped.
//!
//! Every lab namespace starts with CUBIC, the common distribution default (a new namespace would
//! inherit this machine's BBR). A namespace other than the initial one may only choose an
//! algorithm of `net.ipv4.tcp_allowed_congestion_control` (EPERM otherwise), a global list: the
//! benchmark adds CUBIC to it for the run where it is missing. `net.core.rmem_max`/`wmem_max` are read-only in a namespace other
//! than the initial one and `netdev_max_backlog` does not exist there: on this kernel all three
//! are global, read from the initial namespace by every other (seen on Linux 6.18: a value
//! written there reads back in a new namespace; every run's read-back records both). So for a
//! run whose policy asks for them, the benchmark writes them in the initial namespace for the
//! run's duration and restores them after, also after an interrupted run: the originals wait
//! in a state file until restored.

use std::{fs, path::Path};

use anyhow::{bail, Context as _};
use linkpilot_common::units::Bytes;
use serde_json::{json, Map, Value};

use super::config::Policy;
use crate::lab::{in_ns, Host};

/// The congestion control every lab host starts with unless `--cc` says otherwise: the common
/// distribution default.
pub const DEFAULT_CC: &str = "cubic";

/// Read back in each namespace (relative to /proc/sys).
const PER_NAMESPACE: &[&str] = &[
    "net/ipv4/tcp_congestion_control",
    "net/ipv4/tcp_ecn",
    "net/ipv4/tcp_rmem",
    "net/ipv4/tcp_wmem",
    "net/ipv4/tcp_slow_start_after_idle",
    "net/core/rmem_max",
    "net/core/wmem_max",
    "net/core/netdev_max_backlog",
];
const RMEM_MAX: &str = "net/core/rmem_max";
const WMEM_MAX: &str = "net/core/wmem_max";
const BACKLOG: &str = "net/core/netdev_max_backlog";
const ALLOWED_CC: &str = "net/ipv4/tcp_allowed_congestion_control";
/// Every global sysctl the benchmark may change.
const GLOBALS: [&str; 4] = [RMEM_MAX, WMEM_MAX, BACKLOG, ALLOWED_CC];

fn dotted(key: &str) -> String {
    key.replace('/', ".")
}

/// Whether this kernel offers `cc` (a located error if not: nothing has started yet).
pub fn check_cc(cc: &str) -> anyhow::Result<()> {
    let have = read_here("net/ipv4/tcp_available_congestion_control").unwrap_or_default();
    if !have.split_whitespace().any(|a| a == cc) {
        bail!("--cc {cc}: this kernel offers {have:?} (net.ipv4.tcp_available_congestion_control)");
    }
    Ok(())
}

/// Sets every host's congestion control to `cc` and checks it took.
pub fn pin_defaults(hosts: &[Host], cc: &str) -> anyhow::Result<()> {
    for h in hosts {
        set_in(h, "net.ipv4.tcp_congestion_control", cc)?;
        let now = read_in(&h.netns, "net/ipv4/tcp_congestion_control");
        if now.as_deref() != Some(cc) {
            bail!("{}: congestion control reads {now:?} after setting {cc}", h.netns);
        }
    }
    Ok(())
}

/// `sysctl -w key=value` in `h`'s namespace; its stderr in the error.
pub fn set_in(h: &Host, key: &str, value: &str) -> anyhow::Result<()> {
    let set = format!("{key}={value}");
    let out = in_ns(&h.netns, &["sysctl", "-q", "-w", &set]).output()?;
    if !out.status.success() {
        bail!("{}: sysctl -w {set}: {}", h.netns, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

fn read_in(netns: &str, key: &str) -> Option<String> {
    let out = in_ns(netns, &["cat", &format!("/proc/sys/{key}")]).output().ok()?;
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout).split_whitespace().collect::<Vec<_>>().join(" ")
    })
}

fn read_here(key: &str) -> Option<String> {
    fs::read_to_string(Path::new("/proc/sys").join(key))
        .ok()
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
}

fn write_here(key: &str, value: &str) -> anyhow::Result<()> {
    fs::write(Path::new("/proc/sys").join(key), value)
        .with_context(|| format!("writing {} = {value} in the initial namespace", dotted(key)))
}

/// What a policy's recipe asks of the global sysctls: the socket buffer limit (its largest
/// `tcp_buffers`, which the daemon writes to rmem_max/wmem_max where it can) and the backlog.
fn global_wants(policy: &Policy) -> anyhow::Result<Vec<(&'static str, String)>> {
    let text = fs::read_to_string(&policy.file)
        .with_context(|| format!("reading {}", policy.file.display()))?;
    let doc: toml::Table =
        text.parse().with_context(|| format!("parsing {}", policy.file.display()))?;
    let mut wants = Vec::new();
    let buffers = doc
        .get("bounds")
        .and_then(|b| b.get("tcp_buffers"))
        .and_then(|t| t.get("max"))
        .and_then(|m| m.as_str());
    if let Some(max) = buffers {
        let bytes: Bytes = max.parse().map_err(|e: String| {
            anyhow::anyhow!("{}: tcp_buffers.max: {e}", policy.file.display())
        })?;
        wants.push((RMEM_MAX, bytes.0.to_string()));
        wants.push((WMEM_MAX, bytes.0.to_string()));
    }
    if let Some(backlog) =
        doc.get("host").and_then(|h| h.get("netdev_max_backlog")).and_then(|b| b.as_integer())
    {
        wants.push((BACKLOG, backlog.to_string()));
    }
    Ok(wants)
}

/// Where the originals of the global sysctls wait while a run has them changed.
fn state_file() -> std::path::PathBuf {
    crate::run::workspace_root().join("target/bench-training-sysctl-originals.json")
}

/// Restores what an interrupted run left changed (its state file), then forgets it.
pub fn restore_interrupted() -> anyhow::Result<()> {
    let path = state_file();
    let Ok(text) = fs::read_to_string(&path) else { return Ok(()) };
    let saved: Map<String, Value> = serde_json::from_str(&text)
        .with_context(|| format!("{}: not the benchmark's state file", path.display()))?;
    for (key, value) in &saved {
        if !GLOBALS.contains(&key.as_str()) {
            bail!("{}: {key} is not a sysctl the benchmark changes", path.display());
        }
        let value = value.as_str().with_context(|| format!("{}: {key}", path.display()))?;
        write_here(key, value)?;
        eprintln!(
            "bench-training: restored {} = {value} (left by an interrupted run)",
            dotted(key)
        );
    }
    fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))
}

/// The global sysctls a run changed in the initial namespace, restored when dropped.
pub struct Globals {
    saved: Vec<(&'static str, String)>,
    /// What was applied, for the run's record: `{"net.core.rmem_max": "1073741824", ...}`.
    pub applied: Map<String, Value>,
}

impl Globals {
    /// Allows `cc` in every namespace, and applies what `policy` asks of the global sysctls.
    pub fn apply(policy: Option<&Policy>, cc: &str) -> anyhow::Result<Self> {
        let mut g = Self { saved: Vec::new(), applied: Map::new() };
        let allowed =
            read_here(ALLOWED_CC).with_context(|| format!("reading {}", dotted(ALLOWED_CC)))?;
        let mut wants = Vec::new();
        if !allowed.split_whitespace().any(|a| a == cc) {
            wants.push((ALLOWED_CC, format!("{allowed} {cc}")));
        }
        if let Some(policy) = policy {
            wants.extend(global_wants(policy)?);
        }
        let mut originals = Map::new();
        for (key, _) in &wants {
            let before = read_here(key).with_context(|| format!("reading {} here", dotted(key)))?;
            originals.insert((*key).to_owned(), Value::String(before.clone()));
            g.saved.push((key, before));
        }
        if !originals.is_empty() {
            fs::write(state_file(), serde_json::to_string(&originals)?)
                .with_context(|| format!("writing {}", state_file().display()))?;
        }
        for (key, value) in wants {
            write_here(key, &value)?;
            g.applied.insert(dotted(key), Value::String(value));
        }
        Ok(g)
    }
}

impl Drop for Globals {
    fn drop(&mut self) {
        if self.saved.is_empty() {
            return;
        }
        let mut all = true;
        for (key, value) in self.saved.drain(..).rev() {
            if let Err(e) = write_here(key, &value) {
                eprintln!("bench-training: could not restore {}: {e:#}", dotted(key));
                all = false;
            }
        }
        if all {
            let _ = fs::remove_file(state_file());
        }
    }
}

/// The settings in force, read from the kernel: per host namespace every sysctl of
/// [`PER_NAMESPACE`] ("absent" where it does not exist), the initial namespace's global ones,
/// and the congestion control of the host's established TCP connections (`ss -tiH`).
pub fn read_back(hosts: &[Host]) -> Value {
    let mut per_host = Map::new();
    for h in hosts {
        let mut m = Map::new();
        for key in PER_NAMESPACE {
            let v = read_in(&h.netns, key).unwrap_or_else(|| "absent".to_owned());
            m.insert(dotted(key), Value::String(v));
        }
        m.insert("connections_cc".into(), connections_cc(&h.netns));
        per_host.insert(h.netns.clone(), Value::Object(m));
    }
    let mut init = Map::new();
    for key in [RMEM_MAX, WMEM_MAX, BACKLOG] {
        init.insert(dotted(key), read_here(key).map_or(Value::Null, Value::String));
    }
    json!({ "hosts": per_host, "initial_namespace": init })
}

/// `{"cubic": 3}`: how many established TCP connections use each congestion control.
fn connections_cc(netns: &str) -> Value {
    let Ok(out) = in_ns(netns, &["ss", "-tinH", "state", "established"]).output() else {
        return Value::Null;
    };
    let mut counts = Map::new();
    for word in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        if let Some(cc) = ["cubic", "bbr", "reno", "dctcp", "bbr2", "bbr3", "htcp", "vegas"]
            .iter()
            .find(|cc| word == **cc)
        {
            let n = counts.get(*cc).and_then(Value::as_u64).unwrap_or(0);
            counts.insert((*cc).to_owned(), json!(n + 1));
        }
    }
    Value::Object(counts)
}
