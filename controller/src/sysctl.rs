//! TCP buffer sysctls sized to the bandwidth-delay product, and the host sysctls a policy fixes
//! (`[host]`: tcp_ecn, netdev_max_backlog), changed reversibly: the original values are saved
//! in a state file before the first change, restored on exit and, after a crash, on the next
//! start. A value someone else changed since our last write is theirs: we log it and stop
//! managing (and restoring) that sysctl. Sysctls absent or read-only here (a network namespace
//! other than the initial one) are left alone.

use std::{
    collections::BTreeMap,
    fs, io,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::envfile::write_atomic;

/// Where the kernel's sysctls are.
pub const PROC_SYS: &str = "/proc/sys";
/// Where the originals are kept while linkpilot manages them.
pub const DEFAULT_STATE: &str = "/run/linkpilot/sysctl-originals.json";

/// The sysctls linkpilot sizes, relative to /proc/sys. The two triples (`min default max`)
/// only get their maximum changed.
pub const MANAGED: [&str; 4] =
    ["net/core/rmem_max", "net/core/wmem_max", "net/ipv4/tcp_rmem", "net/ipv4/tcp_wmem"];

/// net.ipv4.tcp_ecn (`[host] tcp_ecn`).
pub const TCP_ECN: &str = "net/ipv4/tcp_ecn";
/// net.core.netdev_max_backlog (`[host] netdev_max_backlog`); not in other network namespaces
/// on most kernels.
pub const NETDEV_MAX_BACKLOG: &str = "net/core/netdev_max_backlog";
/// The host sysctls a policy may fix, relative to /proc/sys: single integers, set as given.
pub const HOST: [&str; 2] = [TCP_ECN, NETDEV_MAX_BACKLOG];

/// The host sysctls `host` asks for, as [`Sysctls::apply_host`] takes them.
pub fn host_values(host: &crate::control::policy::Host) -> Vec<(&'static str, i64)> {
    let mut v = Vec::new();
    if let Some(ecn) = host.tcp_ecn {
        v.push((TCP_ECN, i64::from(ecn)));
    }
    if let Some(backlog) = host.netdev_max_backlog {
        v.push((NETDEV_MAX_BACKLOG, i64::from(backlog)));
    }
    v
}

/// Whether a write failed because the sysctl is read-only here.
fn read_only(e: &SysctlError) -> bool {
    matches!(e, SysctlError::Io { source, .. }
        if matches!(source.kind(), io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem))
}

/// Whether a read failed because the sysctl does not exist here.
fn absent(e: &SysctlError) -> bool {
    matches!(e, SysctlError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
}

#[derive(Debug, thiserror::Error)]
pub enum SysctlError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path}: unexpected value {value:?}")]
    Format { path: String, value: String },
    #[error("{path}: {source}")]
    State { path: String, source: serde_json::Error },
}

/// What the state file holds: each managed sysctl's value before linkpilot touched it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Originals {
    values: BTreeMap<String, String>,
}

/// The sysctls under one root, and what we did to them.
pub struct Sysctls {
    root: PathBuf,
    state: PathBuf,
    originals: Originals,
    /// What we last wrote, per sysctl; a different value read back means someone else wrote.
    written: BTreeMap<String, String>,
    /// Sysctls handed back to the administrator.
    released: Vec<String>,
}

fn read(path: &Path) -> Result<String, SysctlError> {
    fs::read_to_string(path)
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .map_err(|source| SysctlError::Io { path: path.display().to_string(), source })
}

fn write(path: &Path, value: &str) -> Result<(), SysctlError> {
    fs::write(path, value)
        .map_err(|source| SysctlError::Io { path: path.display().to_string(), source })
}

/// The maximum of a single number or of a `min default max` triple.
fn max_of(value: &str) -> Option<u64> {
    value.split(' ').next_back()?.parse().ok()
}

/// `value` with its maximum set to `bytes`: the whole value for a single number, the third
/// field of a `min default max` triple.
fn with_max(path: &Path, value: &str, bytes: u64) -> Result<String, SysctlError> {
    let fields: Vec<&str> = value.split(' ').collect();
    let bad = || SysctlError::Format { path: path.display().to_string(), value: value.to_owned() };
    match fields.as_slice() {
        [one] if one.parse::<u64>().is_ok() => Ok(bytes.to_string()),
        [min, def, max] if [min, def, max].iter().all(|f| f.parse::<u64>().is_ok()) => {
            Ok(format!("{min} {def} {bytes}"))
        }
        _ => Err(bad()),
    }
}

impl Sysctls {
    /// Opens the sysctls under `root` with originals kept in `state`. If a state file is left
    /// from a run that died, its originals are restored first.
    pub fn open(root: &Path, state: &Path) -> Result<Self, SysctlError> {
        let mut s = Self {
            root: root.to_owned(),
            state: state.to_owned(),
            originals: Originals::default(),
            written: BTreeMap::new(),
            released: Vec::new(),
        };
        // Not through a symlink: what it holds is written to the sysctls.
        let io_err = |source| SysctlError::Io { path: state.display().to_string(), source };
        let file = match crate::files::open_nofollow(state, fs::OpenOptions::new().read(true)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            r => Some(r.map_err(io_err)?),
        };
        if let Some(mut file) = file {
            let mut text = String::new();
            io::Read::read_to_string(&mut file, &mut text).map_err(io_err)?;
            s.originals = serde_json::from_str(&text).map_err(|source| SysctlError::State {
                path: state.display().to_string(),
                source,
            })?;
            warn!(state = %state.display(), "a previous run left sysctls changed; restoring them");
            s.restore()?;
        }
        Ok(s)
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    /// Sets every managed sysctl's maximum to `bytes`, never below its original maximum: the
    /// host's own setting is a floor for everything else on it. Originals are saved (state
    /// file first) before the first change of each.
    pub fn apply(&mut self, bytes: u64) -> Result<Vec<String>, SysctlError> {
        // Read and check everything first: a value we cannot interpret changes nothing.
        let mut plan = Vec::new();
        for key in MANAGED {
            if self.released.iter().any(|k| k == key) {
                continue;
            }
            let path = self.path(key);
            let now = match read(&path) {
                Ok(v) => v,
                // Not in this network namespace's /proc/sys: not ours to manage.
                Err(e) if absent(&e) => {
                    warn!(sysctl = key, "absent here; not managed");
                    self.released.push(key.to_owned());
                    continue;
                }
                Err(e) => return Err(e),
            };
            let original = self.originals.values.get(key).unwrap_or(&now);
            let floor = max_of(original).unwrap_or(0);
            let want = with_max(&path, &now, bytes.max(floor))?;
            plan.push((key, path, now, want));
        }
        let mut changed = Vec::new();
        for (key, path, now, want) in plan {
            if let Some(ours) = self.written.get(key) {
                if *ours != now {
                    warn!(sysctl = key, ours, now, "changed by someone else; no longer managed");
                    self.released.push(key.to_owned());
                    self.originals.values.remove(key);
                    self.save()?;
                    continue;
                }
            }
            if let Some(c) = self.set(key, &path, now, &want)? {
                changed.push(c);
            }
        }
        Ok(changed)
    }

    /// Writes `want` over `now` (the original saved first, state file before the write) and
    /// reads it back; `None` when nothing changed or the key turned out read-only here.
    fn set(
        &mut self,
        key: &str,
        path: &Path,
        now: String,
        want: &str,
    ) -> Result<Option<String>, SysctlError> {
        if want == now {
            self.written.insert(key.to_owned(), now);
            return Ok(None);
        }
        if !self.originals.values.contains_key(key) {
            self.originals.values.insert(key.to_owned(), now.clone());
            self.save()?;
        }
        match write(path, want) {
            Ok(()) => {}
            // Read-only here (e.g. net.core.rmem_max outside the initial network namespace).
            Err(e) if read_only(&e) => {
                warn!(sysctl = key, "read-only here; not managed");
                self.released.push(key.to_owned());
                self.originals.values.remove(key);
                self.save()?;
                return Ok(None);
            }
            Err(e) => return Err(e),
        }
        // Read back: the kernel may normalise what it was given.
        let back = read(path)?;
        info!(sysctl = key, from = now, to = back, "set");
        self.written.insert(key.to_owned(), back.clone());
        Ok(Some(format!("{key} {now} -> {back}")))
    }

    /// Sets each host sysctl of `want` (a [`HOST`] key and its value) and puts back the
    /// original of each one managed before that `want` no longer names (a reloaded policy that
    /// dropped it). Everything is read and checked first; originals are saved (state file first)
    /// before the first change of each.
    pub fn apply_host(&mut self, want: &[(&str, i64)]) -> Result<Vec<String>, SysctlError> {
        let mut plan = Vec::new();
        for key in HOST {
            if self.released.iter().any(|k| k == key) {
                continue;
            }
            let target = match want.iter().find(|(k, _)| *k == key) {
                Some((_, v)) => Some(v.to_string()),
                // Dropped by the policy: ours to put back, if we ever touched it.
                None if self.written.contains_key(key)
                    || self.originals.values.contains_key(key) =>
                {
                    None
                }
                None => continue,
            };
            let path = self.path(key);
            let now = match read(&path) {
                Ok(v) => v,
                Err(e) if absent(&e) => {
                    warn!(sysctl = key, "absent here; not managed");
                    self.released.push(key.to_owned());
                    continue;
                }
                Err(e) => return Err(e),
            };
            if now.parse::<i64>().is_err() {
                return Err(SysctlError::Format { path: path.display().to_string(), value: now });
            }
            plan.push((key, path, now, target));
        }
        let mut changed = Vec::new();
        for (key, path, now, target) in plan {
            if let Some(ours) = self.written.get(key) {
                if *ours != now {
                    warn!(sysctl = key, ours, now, "changed by someone else; no longer managed");
                    self.released.push(key.to_owned());
                    self.written.remove(key);
                    self.originals.values.remove(key);
                    self.save()?;
                    continue;
                }
            }
            let Some(want) = target else {
                // No longer asked for: the original back, then forgotten.
                self.written.remove(key);
                if let Some(original) = self.originals.values.get(key).cloned() {
                    if original != now {
                        write(&path, &original)?;
                        info!(sysctl = key, to = original, "restored (no longer in the policy)");
                        changed.push(format!("{key} {now} -> {original}"));
                    }
                    self.originals.values.remove(key);
                    self.save()?;
                }
                continue;
            };
            if let Some(c) = self.set(key, &path, now, &want)? {
                changed.push(c);
            }
        }
        Ok(changed)
    }

    fn save(&self) -> Result<(), SysctlError> {
        let text = serde_json::to_string_pretty(&self.originals).map_err(|source| {
            SysctlError::State { path: self.state.display().to_string(), source }
        })?;
        write_atomic(&self.state, &text)
            .map_err(|source| SysctlError::Io { path: self.state.display().to_string(), source })
    }

    /// Puts every original back (those still ours) and removes the state file.
    /// A failure does not stop the rest: what failed stays in the state file for the next start.
    pub fn restore(&mut self) -> Result<(), SysctlError> {
        let mut failed = Originals::default();
        let mut first = None;
        for (key, value) in &self.originals.values {
            match write(&self.path(key), value) {
                Ok(()) => info!(sysctl = %key, to = %value, "restored"),
                Err(e) => {
                    failed.values.insert(key.clone(), value.clone());
                    first.get_or_insert(e);
                }
            }
        }
        self.originals = failed;
        self.written.clear();
        if let Some(e) = first {
            self.save()?;
            return Err(e);
        }
        match fs::remove_file(&self.state) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(SysctlError::Io { path: self.state.display().to_string(), source: e })
            }
            _ => Ok(()),
        }
    }

    /// Sysctls an administrator took over.
    pub fn released(&self) -> &[String] {
        &self.released
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A /proc/sys look-alike with the defaults of a stock kernel.
    fn tree(name: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("lp-sysctl-{}-{name}", std::process::id()));
        let root = dir.join("sys");
        fs::create_dir_all(root.join("net/core")).unwrap();
        fs::create_dir_all(root.join("net/ipv4")).unwrap();
        fs::write(root.join("net/core/rmem_max"), "212992\n").unwrap();
        fs::write(root.join("net/core/wmem_max"), "212992\n").unwrap();
        fs::write(root.join("net/ipv4/tcp_rmem"), "4096\t131072\t6291456\n").unwrap();
        fs::write(root.join("net/ipv4/tcp_wmem"), "4096\t16384\t4194304\n").unwrap();
        fs::write(root.join(TCP_ECN), "2\n").unwrap();
        fs::write(root.join(NETDEV_MAX_BACKLOG), "1000\n").unwrap();
        (root, dir.join("state.json"))
    }

    fn get(root: &Path, key: &str) -> String {
        read(&root.join(key)).unwrap()
    }

    #[test]
    fn apply_then_restore() {
        let (root, state) = tree("restore");
        let mut s = Sysctls::open(&root, &state).unwrap();
        let changed = s.apply(128 << 20).unwrap();
        assert_eq!(changed.len(), 4, "{changed:?}");
        assert_eq!(get(&root, "net/core/rmem_max"), "134217728");
        assert_eq!(get(&root, "net/ipv4/tcp_wmem"), "4096 16384 134217728");
        assert!(state.exists(), "originals saved before the change");
        assert!(s.apply(128 << 20).unwrap().is_empty(), "nothing to do the second time");
        s.restore().unwrap();
        assert_eq!(get(&root, "net/core/rmem_max"), "212992");
        assert_eq!(get(&root, "net/ipv4/tcp_rmem"), "4096 131072 6291456");
        assert!(!state.exists());
        let _ = fs::remove_dir_all(root.parent().unwrap());
    }

    #[test]
    fn the_hosts_own_maximum_is_a_floor() {
        let (root, state) = tree("floor");
        let mut s = Sysctls::open(&root, &state).unwrap();
        // 1 MiB is above rmem_max (208 KiB) but below tcp_rmem's 6 MiB: only raises happen.
        s.apply(1 << 20).unwrap();
        assert_eq!(get(&root, "net/core/rmem_max"), "1048576");
        assert_eq!(get(&root, "net/ipv4/tcp_rmem"), "4096 131072 6291456", "never lowered");
        s.apply(128 << 20).unwrap();
        s.apply(1 << 20).unwrap();
        assert_eq!(get(&root, "net/ipv4/tcp_rmem"), "4096 131072 6291456", "back to the floor");
        s.restore().unwrap();
        assert_eq!(get(&root, "net/core/rmem_max"), "212992");
        let _ = fs::remove_dir_all(root.parent().unwrap());
    }

    #[test]
    fn a_crashed_run_is_undone_at_the_next_start() {
        let (root, state) = tree("crash");
        let mut s = Sysctls::open(&root, &state).unwrap();
        s.apply(64 << 20).unwrap();
        s.apply(256 << 20).unwrap();
        std::mem::forget(s); // SIGKILL: no restore
        assert_eq!(get(&root, "net/core/wmem_max"), "268435456");
        let _s = Sysctls::open(&root, &state).unwrap();
        // The originals from before the first change, not the intermediate 64 MiB.
        assert_eq!(get(&root, "net/core/wmem_max"), "212992");
        assert_eq!(get(&root, "net/ipv4/tcp_wmem"), "4096 16384 4194304");
        assert!(!state.exists());
        let _ = fs::remove_dir_all(root.parent().unwrap());
    }

    #[test]
    fn an_administrators_change_is_left_alone() {
        let (root, state) = tree("admin");
        let mut s = Sysctls::open(&root, &state).unwrap();
        s.apply(128 << 20).unwrap();
        fs::write(root.join("net/core/rmem_max"), "999999\n").unwrap();
        s.apply(256 << 20).unwrap();
        assert_eq!(get(&root, "net/core/rmem_max"), "999999", "not overwritten");
        assert_eq!(s.released(), ["net/core/rmem_max"]);
        assert_eq!(get(&root, "net/core/wmem_max"), "268435456", "the others still managed");
        s.restore().unwrap();
        assert_eq!(get(&root, "net/core/rmem_max"), "999999", "not restored over the admin");
        assert_eq!(get(&root, "net/core/wmem_max"), "212992");
        let _ = fs::remove_dir_all(root.parent().unwrap());
    }

    #[test]
    fn unexpected_values_are_errors_not_guesses() {
        let (root, state) = tree("bad");
        fs::write(root.join("net/ipv4/tcp_rmem"), "lots\n").unwrap();
        let mut s = Sysctls::open(&root, &state).unwrap();
        let err = s.apply(1 << 20).unwrap_err().to_string();
        assert!(err.contains("tcp_rmem") && err.contains("unexpected value"), "{err}");
        assert_eq!(get(&root, "net/core/rmem_max"), "212992", "nothing changed");
        assert!(!state.exists());
        let _ = fs::remove_dir_all(root.parent().unwrap());
    }

    /// The reference case's `[host]`.
    const RECIPE: [(&str, i64); 2] = [(TCP_ECN, 1), (NETDEV_MAX_BACKLOG, 250_000)];

    #[test]
    fn host_settings_follow_the_policy_and_go_back() {
        let (root, state) = tree("host");
        let mut s = Sysctls::open(&root, &state).unwrap();
        s.apply(128 << 20).unwrap();
        let changed = s.apply_host(&RECIPE).unwrap();
        assert_eq!(
            changed,
            ["net/ipv4/tcp_ecn 2 -> 1", "net/core/netdev_max_backlog 1000 -> 250000"]
        );
        assert_eq!(
            (get(&root, TCP_ECN), get(&root, NETDEV_MAX_BACKLOG)),
            ("1".into(), "250000".into())
        );
        let saved = fs::read_to_string(&state).unwrap();
        assert!(saved.contains("\"net/ipv4/tcp_ecn\": \"2\""), "{saved}");
        assert!(s.apply_host(&RECIPE).unwrap().is_empty(), "nothing to do the second time");
        // A reloaded policy with another value, then without tcp_ecn at all.
        s.apply_host(&[(TCP_ECN, 0), (NETDEV_MAX_BACKLOG, 250_000)]).unwrap();
        assert_eq!(get(&root, TCP_ECN), "0");
        let changed = s.apply_host(&[(NETDEV_MAX_BACKLOG, 250_000)]).unwrap();
        assert_eq!(changed, ["net/ipv4/tcp_ecn 0 -> 2"]);
        assert_eq!(get(&root, TCP_ECN), "2", "dropped: the original back");
        assert!(!fs::read_to_string(&state).unwrap().contains("tcp_ecn"), "and forgotten");
        // Asked for again: managed again, from the value now there.
        s.apply_host(&RECIPE).unwrap();
        assert_eq!(get(&root, TCP_ECN), "1");
        s.restore().unwrap();
        assert_eq!(
            (get(&root, TCP_ECN), get(&root, NETDEV_MAX_BACKLOG)),
            ("2".into(), "1000".into())
        );
        assert_eq!(get(&root, "net/core/rmem_max"), "212992");
        assert!(!state.exists());
        let _ = fs::remove_dir_all(root.parent().unwrap());
    }

    #[test]
    fn host_settings_after_a_crash_an_administrator_or_in_a_namespace() {
        let (root, state) = tree("host-crash");
        let mut s = Sysctls::open(&root, &state).unwrap();
        s.apply_host(&RECIPE).unwrap();
        std::mem::forget(s); // SIGKILL: no restore
        let mut s = Sysctls::open(&root, &state).unwrap();
        assert_eq!(
            (get(&root, TCP_ECN), get(&root, NETDEV_MAX_BACKLOG)),
            ("2".into(), "1000".into())
        );
        // An administrator's value is theirs: not overwritten, not restored.
        s.apply_host(&RECIPE).unwrap();
        fs::write(root.join(TCP_ECN), "0\n").unwrap();
        s.apply_host(&RECIPE).unwrap();
        assert_eq!(get(&root, TCP_ECN), "0");
        assert_eq!(s.released(), [TCP_ECN]);
        s.restore().unwrap();
        assert_eq!(
            (get(&root, TCP_ECN), get(&root, NETDEV_MAX_BACKLOG)),
            ("0".into(), "1000".into())
        );
        // Absent (net.core outside the initial network namespace): left alone, the rest applies.
        fs::remove_file(root.join(NETDEV_MAX_BACKLOG)).unwrap();
        let mut s = Sysctls::open(&root, &state).unwrap();
        assert_eq!(s.apply_host(&RECIPE).unwrap(), ["net/ipv4/tcp_ecn 0 -> 1"]);
        assert_eq!(s.released(), [NETDEV_MAX_BACKLOG]);
        assert!(!root.join(NETDEV_MAX_BACKLOG).exists());
        s.restore().unwrap();
        assert_eq!(get(&root, TCP_ECN), "0");
        let _ = fs::remove_dir_all(root.parent().unwrap());
    }

    #[test]
    fn host_settings_are_all_checked_before_any_is_written() {
        let (root, state) = tree("host-bad");
        fs::write(root.join(NETDEV_MAX_BACKLOG), "many\n").unwrap();
        let mut s = Sysctls::open(&root, &state).unwrap();
        let err = s.apply_host(&RECIPE).unwrap_err().to_string();
        assert!(err.contains("netdev_max_backlog") && err.contains("unexpected value"), "{err}");
        assert_eq!(get(&root, TCP_ECN), "2", "nothing changed");
        assert!(!state.exists());
        let host = crate::control::policy::Host { tcp_ecn: Some(1), netdev_max_backlog: None };
        assert_eq!(host_values(&host), [(TCP_ECN, 1)]);
        let _ = fs::remove_dir_all(root.parent().unwrap());
    }
}
