//! Per-peer transport: where the sock_ops program goes (chosen at start), and each peer's
//! profile following its link's state.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::{
    control::{
        policy::Policy,
        transport::{describe, Transport},
        Plan,
    },
    kernel::{peers::PeerIds, probes::ProbeError, probes::Probes},
};

/// How the policy's `[state.transport]` profiles reach connections on this host.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(tag = "path", rename_all = "snake_case")]
pub enum TransportPath {
    /// The policy has no `[state.transport]`: nothing attached.
    #[default]
    Unneeded,
    /// The sock_ops program, attached to this cgroup v2 directory.
    SockOps { cgroup: PathBuf },
    /// No sock_ops here: the profiles are not applied; the socket-buffer sysctls still are.
    Sysctl { why: String },
}

impl std::fmt::Display for TransportPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unneeded => f.write_str("none (the policy sets no [state.transport])"),
            Self::SockOps { cgroup } => write!(f, "sock_ops on cgroup {}", cgroup.display()),
            Self::Sysctl { why } => write!(f, "sysctls only: {why}"),
        }
    }
}

/// cgroup2's statfs magic.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

fn is_cgroup2(p: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else { return false };
    // SAFETY: a NUL-terminated path and an out-buffer statfs fills.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0) && st.f_type as i64 == CGROUP2_SUPER_MAGIC
}

/// The cgroup v2 directory to attach to: `flag` if given (it must be one), else the unified
/// hierarchy's root where systemd mounts it (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on
/// hybrid hosts).
pub fn find_cgroup(flag: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = flag {
        return if is_cgroup2(p) {
            Ok(p.to_owned())
        } else {
            Err(format!("--cgroup {} is not a cgroup v2 directory", p.display()))
        };
    }
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .iter()
        .map(PathBuf::from)
        .find(|p| is_cgroup2(p))
        .ok_or_else(|| "no cgroup v2 hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified".into())
}

/// Chooses the path at start: sock_ops when the policy needs it and the program attaches.
pub fn start(probes: &mut Probes, policy: &Policy, cgroup: Option<&Path>) -> TransportPath {
    if !policy.has_transport() {
        return TransportPath::Unneeded;
    }
    let attached = find_cgroup(cgroup)
        .and_then(|c| probes.attach_sock_ops(&c).map(|()| c).map_err(|e| format!("{e}")));
    match attached {
        Ok(cgroup) => {
            info!("transport profiles by sock_ops on cgroup {}", cgroup.display());
            TransportPath::SockOps { cgroup }
        }
        Err(why) => {
            warn!("no per-peer transport profiles: {why}; socket buffers by sysctl only");
            TransportPath::Sysctl { why }
        }
    }
}

/// Each peer's profile as last written, with its generation.
#[derive(Default)]
pub struct Profiles {
    written: BTreeMap<u32, (Option<Transport>, u32)>,
}

impl Profiles {
    /// Each named peer gets the transport of the first link naming it (None: left alone from
    /// now on); a changed profile gets a new generation, which established connections pick up
    /// at their next RTT sample. Returns what is wanted, `link=profile ...`.
    pub fn apply(
        &mut self,
        plan: &Plan,
        peers: &PeerIds,
        probes: &mut Probes,
    ) -> Result<String, ProbeError> {
        let mut want: BTreeMap<u32, Option<Transport>> = BTreeMap::new();
        let mut wanted = Vec::new();
        for l in &plan.links {
            wanted.push(format!("{}={}", l.link, describe(l.knobs.transport)));
            for id in l.peers.iter().filter_map(|p| peers.id(p)) {
                want.entry(id).or_insert(l.knobs.transport);
            }
        }
        // Peers a reload dropped (or renumbered) are left alone from now on.
        for id in self.written.keys().copied().collect::<Vec<_>>() {
            want.entry(id).or_insert(None);
        }
        for (id, t) in want {
            let (prev, generation) = self.written.get(&id).copied().unwrap_or((None, 0));
            if self.written.contains_key(&id) && prev == t {
                continue;
            }
            let generation = generation.wrapping_add(1).max(1);
            let mut profile = t.unwrap_or_default().profile(generation);
            profile.enabled = u32::from(t.is_some());
            probes.set_transport(id, profile)?;
            self.written.insert(id, (t, generation));
        }
        Ok(wanted.join(" "))
    }
}

/// What status shows: the path, and per link the program's figures summed over its peers (a
/// peer two links name counts for the first, whose profile it gets).
pub fn status(
    path: &TransportPath,
    plan: &Plan,
    peers: &PeerIds,
    probes: &Probes,
) -> Result<TransportStatus, ProbeError> {
    let mut st = TransportStatus { path: path.to_string(), links: Vec::new() };
    if !matches!(path, TransportPath::SockOps { .. }) {
        return Ok(st);
    }
    let totals = probes.transport_state()?;
    let mut counted: Vec<u32> = Vec::new();
    for l in &plan.links {
        let mut t = LinkTransport {
            link: l.link.clone(),
            profile: describe(l.knobs.transport),
            ..LinkTransport::default()
        };
        for id in l.peers.iter().filter_map(|p| peers.id(p)) {
            if counted.contains(&id) {
                continue;
            }
            counted.push(id);
            let Some(p) = totals.get(&id) else { continue };
            t.connections += p.connections;
            t.current += p.current;
            t.profiled += p.counters.profiled;
            t.updated += p.counters.updated;
            t.closed += p.counters.closed;
            t.refused += p.counters.refused;
        }
        st.links.push(t);
    }
    Ok(st)
}

/// A policy naming congestion controls this host lacks is refused where it would run, with
/// each one's place in the file. One the kernel does not offer yet is asked for first, which
/// loads its module where the kernel has it (BBR is a module nothing loads by default).
pub fn check_algorithms(policy: &Policy, sysctl_root: &std::path::Path) -> anyhow::Result<()> {
    use crate::kernel::checks::{congestion_controls, load_congestion_control};
    if policy.congestion_controls.is_empty() {
        return Ok(());
    }
    let read = || {
        congestion_controls(sysctl_root).with_context(|| {
            format!("reading the available congestion controls under {}", sysctl_root.display())
        })
    };
    let mut available = read()?;
    let mut asked = Vec::new();
    for (name, _) in &policy.congestion_controls {
        let name = name.as_str();
        if available.iter().any(|a| a == name) || asked.contains(&name) {
            continue;
        }
        asked.push(name);
        match load_congestion_control(name) {
            Ok(()) => tracing::info!("congestion control {name} loaded: the policy names it"),
            Err(e) => tracing::debug!("congestion control {name} could not be loaded: {e}"),
        }
    }
    if !asked.is_empty() {
        available = read()?;
    }
    Ok(policy.check_algorithms(&available)?)
}

/// How `[state.transport]` profiles reach connections (chosen at start), and per link what
/// the sock_ops program has done.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TransportStatus {
    /// "sock_ops on cgroup DIR", "sysctls only: why", or "none (...)".
    pub path: String,
    pub links: Vec<LinkTransport>,
}

/// One link's peers' connections under the sock_ops program.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkTransport {
    pub link: String,
    /// The profile the link's state gives ("untouched" when it has none).
    pub profile: String,
    /// Connections carrying a profile now, and those with the current one.
    pub connections: u64,
    pub current: u64,
    /// Since start: profiled when established, updated, closed, options the kernel refused.
    pub profiled: u64,
    pub updated: u64,
    pub closed: u64,
    pub refused: u64,
}

/// The transport path, and per link its peers' connections under the sock_ops program.
pub fn render(t: &TransportStatus) -> String {
    if t.path.is_empty() {
        return String::new();
    }
    let mut out = format!("transport: {}\n", t.path);
    for l in &t.links {
        out += &format!(
            "  {:<12} {}: {} connections ({} current), {} profiled, {} updated, {} closed, {} \
             refused\n",
            l.link, l.profile, l.connections, l.current, l.profiled, l.updated, l.closed, l.refused
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::status::{render as render_status, Status};

    #[test]
    fn the_transport_section_says_the_path_and_each_links_connections() {
        let t = TransportStatus {
            path: "sock_ops on cgroup /sys/fs/cgroup".into(),
            links: vec![LinkTransport {
                link: "wan".into(),
                profile: "cc=bbr".into(),
                connections: 3,
                current: 2,
                profiled: 5,
                updated: 1,
                closed: 2,
                refused: 0,
            }],
        };
        let text = render_status(&Status { transport: t, ..Status::default() });
        assert!(text.contains("transport: sock_ops on cgroup /sys/fs/cgroup\n  wan          cc=bbr: 3 connections (2 current), 5 profiled, 1 updated, 2 closed, 0 refused\n"), "{text}");
        assert!(!render_status(&Status::default()).contains("transport:"));
    }
}
