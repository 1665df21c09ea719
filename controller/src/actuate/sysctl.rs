//! TCP buffer sysctls sized to the bandwidth-delay product, and the host sysctls a policy fixes
//! (`[host]`: tcp_ecn, netdev_max_backlog, tcp_slow_start_after_idle), changed reversibly: the original values are saved
//! in a state file (`crash_state`) before the first change, restored on exit and, after a
//! crash, on the next start. A value someone else changed (neither what we last wrote nor the
//! original) is theirs: we log it and stop managing (and restoring) that sysctl, also when we
//! find it so at restore. Sysctls absent or read-only here (a network namespace other than the
//! initial one) are left alone.

use std::{
    collections::BTreeMap,
    fs, io,
    path::{Path, PathBuf},
};

use tracing::{info, warn};

use crate::actuate::crash_state::{CrashState, StateError};

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
/// net.ipv4.tcp_slow_start_after_idle (`[host] tcp_slow_start_after_idle`).
pub const SLOW_START_AFTER_IDLE: &str = "net/ipv4/tcp_slow_start_after_idle";
/// The host sysctls a policy may fix, relative to /proc/sys: single integers, set as given.
pub const HOST: [&str; 3] = [TCP_ECN, NETDEV_MAX_BACKLOG, SLOW_START_AFTER_IDLE];

/// Whether a key read back from the state file is one we manage: anything else (an absolute
/// path, `..`) would reach outside the sysctl root.
fn managed_key(key: &str) -> Result<(), String> {
    if MANAGED.contains(&key) || HOST.contains(&key) {
        Ok(())
    } else {
        Err("not a sysctl linkpilot sets".to_owned())
    }
}

/// The host sysctls `host` asks for, as [`Sysctls::apply_host`] takes them.
pub fn host_values(host: &crate::control::policy::Host) -> Vec<(&'static str, i64)> {
    let mut v = Vec::new();
    if let Some(ecn) = host.tcp_ecn {
        v.push((TCP_ECN, i64::from(ecn)));
    }
    if let Some(backlog) = host.netdev_max_backlog {
        v.push((NETDEV_MAX_BACKLOG, i64::from(backlog)));
    }
    if let Some(idle) = host.tcp_slow_start_after_idle {
        v.push((SLOW_START_AFTER_IDLE, i64::from(idle)));
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
    #[error(transparent)]
    State(#[from] StateError),
}

/// The sysctls under one root, and what we did to them.
pub struct Sysctls {
    root: PathBuf,
    /// The originals, crash-safe.
    state: CrashState,
    /// What we last wrote (or found as asked), per sysctl; a value read back that is neither
    /// this nor the original means someone else wrote.
    written: BTreeMap<String, String>,
    /// Sysctls handed back to the administrator.
    released: Vec<String>,
    /// Sysctls absent or read-only here.
    unmanaged: Vec<String>,
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
    /// `key`'s value, or `None` when it is not in this network namespace's /proc/sys: then it
    /// is listed as not ours to manage.
    fn read_managed(&mut self, key: &str, path: &Path) -> Result<Option<String>, SysctlError> {
        match read(path) {
            Ok(v) => Ok(Some(v)),
            Err(e) if absent(&e) => {
                warn!(sysctl = key, "absent here; not managed");
                self.unmanaged.push(key.to_owned());
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Opens the sysctls under `root` with originals kept in `state`. If a state file is left
    /// from a run that died, its originals are restored first; a file naming a sysctl we do not
    /// manage is refused, with nothing changed.
    pub fn open(root: &Path, state: &Path) -> Result<Self, SysctlError> {
        let left = state.exists();
        let mut s = Self {
            root: root.to_owned(),
            state: CrashState::load(state, managed_key)?,
            written: BTreeMap::new(),
            released: Vec::new(),
            unmanaged: Vec::new(),
        };
        if left {
            warn!(state = %state.display(), "a previous run left sysctls changed; restoring them");
            s.restore()?;
        }
        Ok(s)
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    fn skipped(&self, key: &str) -> bool {
        self.released.iter().chain(&self.unmanaged).any(|k| k == key)
    }

    /// Whether `now` at `key` is someone else's: neither what we last wrote nor the original.
    fn taken_over(&self, key: &str, now: &str) -> bool {
        self.written.get(key).is_some_and(|w| w != now) && self.state.original(key) != Some(now)
    }

    /// Hands `key` to whoever changed it: no longer managed, nor restored.
    fn release(&mut self, key: &str, now: &str) -> Result<(), SysctlError> {
        let ours = self.written.remove(key).unwrap_or_default();
        warn!(sysctl = key, ours, now, "changed by someone else; no longer managed");
        self.released.push(key.to_owned());
        Ok(self.state.forget(key)?)
    }

    /// Sets every managed sysctl's maximum to `bytes`, never below its original maximum: the
    /// host's own setting is a floor for everything else on it. Originals are saved (state
    /// file first) before the first change of each.
    pub fn apply(&mut self, bytes: u64) -> Result<Vec<String>, SysctlError> {
        // Read and check everything first: a value we cannot interpret changes nothing.
        let mut plan = Vec::new();
        for key in MANAGED {
            if self.skipped(key) {
                continue;
            }
            let path = self.path(key);
            let Some(now) = self.read_managed(key, &path)? else { continue };
            let original = self.state.original(key).unwrap_or(&now);
            let floor = max_of(original).unwrap_or(0);
            let want = with_max(&path, &now, bytes.max(floor))?;
            plan.push((key, path, now, Some(want)));
        }
        self.carry_out(plan)
    }

    /// Carries out a plan of (key, path, value now, value wanted) read and checked beforehand:
    /// a key someone else took over is released, one wanted at `None` gets its original back
    /// and is forgotten. Returns what changed.
    fn carry_out(
        &mut self,
        plan: Vec<(&str, PathBuf, String, Option<String>)>,
    ) -> Result<Vec<String>, SysctlError> {
        let mut changed = Vec::new();
        for (key, path, now, target) in plan {
            if self.taken_over(key, &now) {
                self.release(key, &now)?;
                continue;
            }
            let Some(want) = target else {
                // No longer asked for: the original back, then forgotten.
                self.written.remove(key);
                if let Some(original) = self.state.original(key).map(str::to_owned) {
                    if original != now {
                        write(&path, &original)?;
                        info!(sysctl = key, to = original, "restored (no longer in the policy)");
                        changed.push(format!("{key} {now} -> {original}"));
                    }
                    self.state.forget(key)?;
                }
                continue;
            };
            if let Some(c) = self.set(key, &path, now, &want)? {
                changed.push(c);
            }
        }
        Ok(changed)
    }

    /// Writes `want` over `now` (the state file first: the original, and both values as
    /// possibly ours) and reads it back; `None` when nothing changed or the key turned out
    /// read-only here.
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
        self.state.before_write(key, &now, want)?;
        match write(path, want) {
            Ok(()) => {}
            // Read-only here (e.g. net.core.rmem_max outside the initial network namespace).
            Err(e) if read_only(&e) => {
                warn!(sysctl = key, "read-only here; not managed");
                self.unmanaged.push(key.to_owned());
                self.state.forget(key)?;
                return Ok(None);
            }
            Err(e) => return Err(e),
        }
        // Read back: the kernel may normalise what it was given.
        let back = read(path)?;
        self.state.after_write(key, &back)?;
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
            if self.skipped(key) {
                continue;
            }
            let target = match want.iter().find(|(k, _)| *k == key) {
                Some((_, v)) => Some(v.to_string()),
                // Dropped by the policy: ours to put back, if we ever touched it.
                None if self.written.contains_key(key) || self.state.original(key).is_some() => {
                    None
                }
                None => continue,
            };
            let path = self.path(key);
            let Some(now) = self.read_managed(key, &path)? else { continue };
            if now.parse::<i64>().is_err() {
                return Err(SysctlError::Format { path: path.display().to_string(), value: now });
            }
            plan.push((key, path, now, target));
        }
        self.carry_out(plan)
    }

    /// Puts every original back (those still ours: a value that is neither ours nor the
    /// original is the administrator's, left as it is) and removes the state file. A failure
    /// does not stop the rest: what failed stays in the state file for the next start.
    pub fn restore(&mut self) -> Result<(), SysctlError> {
        let root = self.root.clone();
        let r = self.state.restore(
            |key| match read(&root.join(key)) {
                Ok(v) => Ok(Some(v)),
                Err(e) if absent(&e) => Ok(None),
                Err(e) => Err(e),
            },
            |key, value| write(&root.join(key), value),
        );
        for (key, value) in &r.restored {
            info!(sysctl = %key, to = %value, "restored");
        }
        for key in &r.gone {
            warn!(sysctl = %key, "absent now; nothing to restore");
        }
        for key in r.released {
            warn!(sysctl = %key, "changed by someone else; left as it is, not restored");
            self.released.push(key);
        }
        self.written.clear();
        self.state.finish()?;
        r.error.map_or(Ok(()), Err)
    }

    /// Sysctls an administrator took over.
    pub fn released(&self) -> &[String] {
        &self.released
    }

    /// Sysctls absent or read-only here, left alone.
    pub fn unmanaged(&self) -> &[String] {
        &self.unmanaged
    }
}

#[cfg(test)]
mod tests;
