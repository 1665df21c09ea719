//! The lab's topology and lifetime: namespaces for two sites and a WAN router, the TUN delay
//! line between them, teardown on drop and cleanup of a crashed run.
//!
//! ```text
//!  lpl-NAME-hk0 (eth0 198.18.1.10) ─┐                                ┌─ lpl-NAME-us0 (eth0 198.18.2.10)
//!  lpl-NAME-hk1 (eth0 198.18.1.11) ─┤ br-hk ── wan-h2u ⇄ delay line ⇄ │
//!                                   └──────── lpl-NAME-wan ── wan-u2h ── br-us ─┘
//! ```
//! In the router namespace, `ip rule iif br-hk lookup 100` sends everything arriving from the
//! HK site into the TUN `wan-h2u` (table 100 has only a default route to it); the delay line
//! writes each packet back into the same TUN at its delivery time, where it arrives with
//! iif wan-h2u, so the main table forwards it to br-us. Likewise for the other direction.

use std::{
    fs,
    net::{Ipv4Addr, Ipv6Addr},
    path::PathBuf,
    process::Command,
    sync::{atomic::AtomicBool, Arc},
    thread::JoinHandle,
    time::Instant,
};

use nix::sched::{setns, CloneFlags};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::{
    cmd::{self, CommandError},
    delayline::{self, DirectionStats, Report, StatsSnapshot},
    scenario::{Direction, Scenario},
    tun,
};

/// Where running labs record what they created.
pub const STATE_DIR: &str = "/run/linkpilot-lab";

/// Why a lab could not start.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("lab name {0:?} is invalid: use 1 to 12 characters of a-z and 0-9")]
    BadName(String),
    #[error("hosts per site must be 1 to 8, not {0}")]
    BadHostCount(u8),
    #[error("lab {name:?} is already running (pid {pid}); stop it or choose another --name")]
    Busy { name: String, pid: i32 },
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LabError {
    let what = what.into();
    move |source| LabError::Io { what, source }
}

/// A site of the lab.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Site {
    Hk,
    Us,
}

impl Site {
    fn tag(self) -> &'static str {
        match self {
            Site::Hk => "hk",
            Site::Us => "us",
        }
    }

    fn subnet(self) -> u8 {
        match self {
            Site::Hk => 1,
            Site::Us => 2,
        }
    }
}

/// A host of a site: a namespace with one Ethernet interface toward the WAN.
#[derive(Clone, Debug, Serialize)]
pub struct Host {
    pub site: Site,
    pub netns: String,
    pub iface: &'static str,
    pub ipv4: Ipv4Addr,
    pub ipv6: Ipv6Addr,
}

impl Host {
    /// A command to run inside this host's namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.netns, program]);
        c
    }

    /// Runs `args` in this host and returns stdout.
    pub fn exec(&self, args: &[&str]) -> Result<String, CommandError> {
        cmd::in_ns(&self.netns, args)
    }

    /// Runs `f` on a thread inside this host's namespace; sockets it opens live there.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> JoinHandle<T> {
        let path = format!("/run/netns/{}", self.netns);
        std::thread::spawn(move || {
            enter_netns(&path).unwrap_or_else(|e| panic!("entering {path}: {e}"));
            f()
        })
    }
}

fn enter_netns(path: &str) -> std::io::Result<()> {
    let f = fs::File::open(path)?;
    setns(f, CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)
}

/// How to build a lab.
#[derive(Clone, Debug)]
pub struct LabConfig {
    /// Distinguishes concurrent labs; part of every namespace name.
    pub name: String,
    pub hosts_per_site: u8,
    /// Seed of the link model's randomness, for repeatable runs.
    pub seed: u64,
}

impl Default for LabConfig {
    fn default() -> Self {
        Self { name: "lab".into(), hosts_per_site: 1, seed: 1 }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct State {
    pid: i32,
    /// Process start time (clock ticks since boot), so a reused pid is not mistaken for us.
    starttime: u64,
    namespaces: Vec<String>,
}

/// A running lab. Dropping it stops the delay line and deletes everything it created.
pub struct Lab {
    pub name: String,
    pub scenario: Arc<Scenario>,
    hosts: Vec<Host>,
    wan: String,
    namespaces: Vec<String>,
    stats: [Arc<DirectionStats>; 2],
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Report>>,
    origin: Instant,
    state_path: PathBuf,
}

impl std::fmt::Debug for Lab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lab").field("name", &self.name).field("hosts", &self.hosts).finish()
    }
}

fn ns_names(name: &str, hosts: u8) -> (String, Vec<(Site, String)>) {
    let hosts = [Site::Hk, Site::Us]
        .into_iter()
        .flat_map(|s| (0..hosts).map(move |i| (s, format!("lpl-{name}-{}{i}", s.tag()))))
        .collect();
    (format!("lpl-{name}-wan"), hosts)
}

impl Lab {
    /// Builds the topology and starts the delay line on `scenario`.
    pub fn start(config: LabConfig, scenario: Scenario) -> Result<Self, LabError> {
        let name = config.name.clone();
        if name.is_empty()
            || name.len() > 12
            || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            return Err(LabError::BadName(name));
        }
        if !(1..=8).contains(&config.hosts_per_site) {
            return Err(LabError::BadHostCount(config.hosts_per_site));
        }
        cleanup_stale(&name)?;
        let (wan, host_ns) = ns_names(&name, config.hosts_per_site);
        let mut namespaces = vec![wan.clone()];
        namespaces.extend(host_ns.iter().map(|(_, n)| n.clone()));
        let state_path = PathBuf::from(STATE_DIR).join(format!("{name}.json"));
        // Record before creating, so a crash half-way is still cleaned up next time.
        fs::create_dir_all(STATE_DIR).map_err(io(format!("creating {STATE_DIR}")))?;
        let state = State {
            pid: std::process::id() as i32,
            starttime: starttime(std::process::id() as i32).unwrap_or(0),
            namespaces: namespaces.clone(),
        };
        fs::write(&state_path, serde_json::to_vec(&state).unwrap_or_default())
            .map_err(io(format!("writing {}", state_path.display())))?;

        let mut lab = Lab {
            name,
            scenario: Arc::new(scenario),
            hosts: Vec::new(),
            wan: wan.clone(),
            namespaces: Vec::new(),
            stats: [Arc::default(), Arc::default()],
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
            origin: Instant::now(),
            state_path,
        };
        // From here on, an error drops `lab`, which deletes what was made.
        for ns in &namespaces {
            cmd::run(&["ip", "netns", "add", ns])?;
            lab.namespaces.push(ns.clone());
            cmd::run(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
            cmd::sysctl(ns, "net.ipv6.conf.default.accept_dad", "0")?;
        }
        lab.build_router()?;
        for (i, (site, ns)) in host_ns.iter().enumerate() {
            let index = (i % usize::from(config.hosts_per_site)) as u8;
            lab.hosts.push(lab.build_host(*site, index, ns)?);
        }
        let tuns = lab.build_delay_line()?;
        lab.origin = Instant::now();
        for (dir, file) in tuns {
            let stats = lab.stats[dir as usize].clone();
            let seed = config.seed.wrapping_mul(2).wrapping_add(dir as u64);
            let handle = delayline::spawn(
                dir,
                file,
                lab.scenario.clone(),
                lab.origin,
                stats,
                lab.stop.clone(),
                seed,
            )
            .map_err(io("starting a delay-line thread"))?;
            lab.threads.push(handle);
        }
        info!(lab = %lab.name, scenario = %lab.scenario.name, "lab running");
        Ok(lab)
    }

    fn build_router(&self) -> Result<(), LabError> {
        let w = self.wan.as_str();
        for (k, v) in [
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv6.conf.all.forwarding", "1"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
        ] {
            cmd::sysctl(w, k, v)?;
        }
        for site in [Site::Hk, Site::Us] {
            let br = format!("br-{}", site.tag());
            let n = site.subnet();
            cmd::run(&["ip", "-n", w, "link", "add", &br, "type", "bridge"])?;
            cmd::run(&["ip", "-n", w, "addr", "add", &format!("198.18.{n}.1/24"), "dev", &br])?;
            cmd::run(&[
                "ip",
                "-n",
                w,
                "addr",
                "add",
                &format!("2001:db8:{n}::1/64"),
                "dev",
                &br,
                "nodad",
            ])?;
            cmd::run(&["ip", "-n", w, "link", "set", &br, "up"])?;
        }
        Ok(())
    }

    fn build_host(&self, site: Site, index: u8, ns: &str) -> Result<Host, LabError> {
        let w = self.wan.as_str();
        let n = site.subnet();
        let port = format!("{}{index}", site.tag());
        cmd::run(&[
            "ip", "-n", w, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
            ns,
        ])?;
        cmd::run(&[
            "ip",
            "-n",
            w,
            "link",
            "set",
            &port,
            "master",
            &format!("br-{}", site.tag()),
            "up",
        ])?;
        let ipv4 = Ipv4Addr::new(198, 18, n, 10 + index);
        let ipv6: Ipv6Addr =
            format!("2001:db8:{n}::{:x}", 0x10 + u16::from(index)).parse().expect("valid IPv6");
        cmd::run(&["ip", "-n", ns, "addr", "add", &format!("{ipv4}/24"), "dev", "eth0"])?;
        cmd::run(&["ip", "-n", ns, "addr", "add", &format!("{ipv6}/64"), "dev", "eth0", "nodad"])?;
        cmd::run(&["ip", "-n", ns, "link", "set", "eth0", "up"])?;
        cmd::run(&["ip", "-n", ns, "route", "add", "default", "via", &format!("198.18.{n}.1")])?;
        cmd::run(&[
            "ip",
            "-n",
            ns,
            "-6",
            "route",
            "add",
            "default",
            "via",
            &format!("2001:db8:{n}::1"),
        ])?;
        Ok(Host { site, netns: ns.to_owned(), iface: "eth0", ipv4, ipv6 })
    }

    /// Creates the two TUN devices in the router namespace and the policy routes into them.
    fn build_delay_line(&self) -> Result<Vec<(Direction, fs::File)>, LabError> {
        let w = self.wan.clone();
        let path = format!("/run/netns/{w}");
        let files = std::thread::spawn(move || -> std::io::Result<Vec<fs::File>> {
            enter_netns(&path)?;
            Ok(vec![tun::open("wan-h2u")?, tun::open("wan-u2h")?])
        })
        .join()
        .map_err(|_| LabError::Io {
            what: "TUN thread".into(),
            source: std::io::Error::other("panicked"),
        })?
        .map_err(io("creating the TUN devices"))?;
        let w = self.wan.as_str();
        for (tun_name, from_bridge, table) in
            [("wan-h2u", "br-hk", "100"), ("wan-u2h", "br-us", "101")]
        {
            cmd::run(&["ip", "-n", w, "link", "set", tun_name, "txqueuelen", "10000", "up"])?;
            // pfifo rather than the default qdisc, which may be an AQM of its own (fq_codel).
            cmd::run(&[
                "ip", "netns", "exec", w, "tc", "qdisc", "replace", "dev", tun_name, "root",
                "pfifo", "limit", "10000",
            ])?;
            cmd::sysctl(w, &format!("net.ipv4.conf.{tun_name}.rp_filter"), "0")?;
            for family in ["-4", "-6"] {
                cmd::run(&[
                    "ip",
                    family,
                    "-n",
                    w,
                    "rule",
                    "add",
                    "iif",
                    from_bridge,
                    "lookup",
                    table,
                    "pref",
                    "100",
                ])?;
                cmd::run(&[
                    "ip", family, "-n", w, "route", "add", "default", "dev", tun_name, "table",
                    table,
                ])?;
            }
        }
        let mut files = files.into_iter();
        Ok(vec![
            (Direction::HkToUs, files.next().expect("two TUN files")),
            (Direction::UsToHk, files.next().expect("two TUN files")),
        ])
    }

    /// The hosts of `site`.
    pub fn hosts(&self, site: Site) -> impl Iterator<Item = &Host> {
        self.hosts.iter().filter(move |h| h.site == site)
    }

    /// Host `index` of `site`.
    pub fn host(&self, site: Site, index: usize) -> &Host {
        self.hosts(site).nth(index).expect("host index within hosts_per_site")
    }

    /// The first host of each site, HK's and US's, as owned values.
    pub fn hk_us(&self) -> (Host, Host) {
        (self.host(Site::Hk, 0).clone(), self.host(Site::Us, 0).clone())
    }

    /// The router namespace.
    pub fn wan_netns(&self) -> &str {
        &self.wan
    }

    /// Ground-truth counters of `dir`.
    pub fn stats(&self, dir: Direction) -> StatsSnapshot {
        self.stats[dir as usize].snapshot()
    }

    /// Time since the scenario started.
    pub fn elapsed(&self) -> std::time::Duration {
        self.origin.elapsed()
    }

    /// Stops the delay line and returns each direction's report; the topology is deleted when
    /// the lab is dropped.
    pub fn stop(&mut self) -> Vec<Report> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.threads.drain(..).filter_map(|t| t.join().ok()).collect()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop();
        for ns in self.namespaces.iter().rev() {
            if let Err(e) = cmd::run(&["ip", "netns", "del", ns]) {
                warn!("{e}");
            }
        }
        let _ = fs::remove_file(&self.state_path);
        info!(lab = %self.name, "lab torn down");
    }
}

/// Field 22 of /proc/PID/stat.
fn starttime(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses; fields resume after the last ')'.
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// Deletes what a crashed run of lab `name` left: exactly the namespaces its state file lists.
/// Returns their names. Fails if that run is still alive.
pub fn cleanup_stale(name: &str) -> Result<Vec<String>, LabError> {
    let path = PathBuf::from(STATE_DIR).join(format!("{name}.json"));
    let Ok(raw) = fs::read(&path) else { return Ok(Vec::new()) };
    let state: State = match serde_json::from_slice(&raw) {
        Ok(s) => s,
        Err(e) => {
            warn!("ignoring unreadable {}: {e}", path.display());
            let _ = fs::remove_file(&path);
            return Ok(Vec::new());
        }
    };
    let alive = starttime(state.pid).is_some_and(|t| t == state.starttime);
    if alive {
        return Err(LabError::Busy { name: name.to_owned(), pid: state.pid });
    }
    let existing = cmd::run(&["ip", "netns", "list"])?;
    let mut deleted = Vec::new();
    for ns in state
        .namespaces
        .iter()
        .filter(|ns| existing.lines().any(|l| l.split_whitespace().next() == Some(ns.as_str())))
    {
        cmd::run(&["ip", "netns", "del", ns])?;
        deleted.push(ns.clone());
    }
    fs::remove_file(&path).map_err(io(format!("removing {}", path.display())))?;
    if !deleted.is_empty() {
        warn!(lab = name, ?deleted, "removed what a previous run left behind");
    }
    Ok(deleted)
}
