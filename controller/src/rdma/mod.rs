//! RDMA NIC signals from sysfs: devices, ports, their state and netdevs, and the congestion and
//! retransmission counters (`hw_counters`) that RoCE NICs keep in hardware, where the TC hooks
//! never see the traffic. The root is configurable so tests run on a fixture tree; a machine
//! without RDMA reports no devices and everything else keeps working.

pub(crate) mod netlink;
pub mod verbs;

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use serde::Serialize;

/// Where the kernel lists RDMA devices.
pub const SYSFS_ROOT: &str = "/sys/class/infiniband";

/// The `hw_counters` that carry congestion and loss signals, by their mlx5/bnxt/irdma names;
/// whichever of them a device has are read (others are kept too, under `other`).
pub const SIGNAL_COUNTERS: &[&str] = &[
    "np_ecn_marked_roce_packets",
    "np_cnp_sent",
    "rp_cnp_handled",
    "rp_cnp_ignored",
    "out_of_sequence",
    "packet_seq_err",
    "local_ack_timeout_err",
    "implied_nak_seq_err",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "duplicate_request",
    "rnr_nak_retry_err",
];

/// One port of one RDMA device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RdmaPort {
    pub device: String,
    pub port: u32,
    /// "ACTIVE", "DOWN", ... (the word after the number in `state`).
    pub state: String,
    /// "Ethernet" (RoCE) or "InfiniBand".
    pub link_layer: String,
    pub rate: String,
    /// Network devices of the port's GIDs (RoCE), deduplicated.
    pub netdevs: Vec<String>,
    /// The signal counters present on this port.
    pub signals: BTreeMap<String, u64>,
    /// Every other readable counter.
    pub other: BTreeMap<String, u64>,
    /// Counter files that could not be read as a number, with why.
    pub unreadable: Vec<String>,
}

/// Why sysfs could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading {path}: {source}")]
pub struct RdmaError {
    pub path: String,
    pub source: std::io::Error,
}

fn read_trimmed(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_owned())
}

fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// Every port of every RDMA device under `root`. A missing root means no RDMA devices.
pub fn discover(root: &Path) -> Result<Vec<RdmaPort>, RdmaError> {
    if !root.exists() {
        return Ok(Vec::new());
    }
    let err = |p: &Path| {
        let path = p.display().to_string();
        move |source| RdmaError { path, source }
    };
    fs::read_dir(root).map_err(err(root))?;
    let mut ports = Vec::new();
    for dev in sorted_entries(root) {
        let device = dev.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        for port_dir in sorted_entries(&dev.join("ports")) {
            let Some(port) = port_dir.file_name().and_then(|n| n.to_str()?.parse().ok()) else {
                continue;
            };
            ports.push(read_port(&device, port, &port_dir));
        }
    }
    Ok(ports)
}

fn read_port(device: &str, port: u32, dir: &Path) -> RdmaPort {
    let state = read_trimmed(&dir.join("state"))
        .map(|s| s.split_once(':').map_or(s.clone(), |(_, w)| w.trim().to_owned()))
        .unwrap_or_default();
    let mut netdevs: Vec<String> = sorted_entries(&dir.join("gid_attrs/ndevs"))
        .iter()
        .filter_map(|p| read_trimmed(p))
        .filter(|n| !n.is_empty())
        .collect();
    netdevs.sort();
    netdevs.dedup();
    let mut out = RdmaPort {
        device: device.to_owned(),
        port,
        state,
        link_layer: read_trimmed(&dir.join("link_layer")).unwrap_or_default(),
        rate: read_trimmed(&dir.join("rate")).unwrap_or_default(),
        netdevs,
        ..RdmaPort::default()
    };
    for file in sorted_entries(&dir.join("hw_counters")) {
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        match read_trimmed(&file).map(|v| v.parse::<u64>()) {
            Some(Ok(v)) if SIGNAL_COUNTERS.contains(&name.as_str()) => {
                out.signals.insert(name, v);
            }
            Some(Ok(v)) => {
                out.other.insert(name, v);
            }
            Some(Err(e)) => out.unreadable.push(format!("{name}: {e}")),
            None => out.unreadable.push(format!("{name}: unreadable")),
        }
    }
    out
}

/// Re-reads what changes tick to tick, the state and the signal counters, of ports found
/// by [`discover`] (a few files per port, where `discover` reads every counter and GID).
pub fn refresh(root: &Path, ports: &mut [RdmaPort]) {
    for p in ports {
        let dir = root.join(&p.device).join("ports").join(p.port.to_string());
        if let Some(s) = read_trimmed(&dir.join("state")) {
            p.state = s.split_once(':').map_or(s.clone(), |(_, w)| w.trim().to_owned());
        }
        for (name, value) in &mut p.signals {
            if let Some(v) =
                read_trimmed(&dir.join("hw_counters").join(name)).and_then(|v| v.parse().ok())
            {
                *value = v;
            }
        }
    }
}

/// The ports of the devices under `root` that serve this network namespace, with the netdevs
/// they serve here. For the kernel's own devices (`root` is [`SYSFS_ROOT`]) the kernel is
/// asked which netdev each port is bound to ([`crate::rdma::netlink`]): sysfs names are names in
/// whatever namespace each netdev lives in, so a daemon whose veth is `eth0` would otherwise
/// take the host's `eth0` port for its own. Another root (a fixture tree) is taken as it is.
pub fn discover_here(root: &Path) -> Result<Vec<RdmaPort>, RdmaError> {
    let ports = discover(root)?;
    if root != Path::new(SYSFS_ROOT) || ports.is_empty() {
        return Ok(ports);
    }
    let here = crate::rdma::netlink::port_netdevs()
        .map_err(|source| RdmaError { path: "RDMA netlink (port netdevs)".into(), source })?;
    Ok(in_namespace(ports, &here, |n| nix::net::if_::if_nametoindex(n).is_ok()))
}

/// Keeps the ports whose netdev the kernel named to this namespace (`here`), with that netdev
/// and those of their GIDs' netdevs (VLANs...) that are interfaces here too (`is_here`).
pub fn in_namespace(
    ports: Vec<RdmaPort>,
    here: &crate::rdma::netlink::PortNetdevs,
    is_here: impl Fn(&str) -> bool,
) -> Vec<RdmaPort> {
    ports
        .into_iter()
        .filter_map(|mut p| {
            let (_, netdev) = here.get(&(p.device.clone(), p.port))?;
            p.netdevs.retain(|n| n != netdev && is_here(n));
            p.netdevs.push(netdev.clone());
            p.netdevs.sort();
            Some(p)
        })
        .collect()
}

/// The ports whose netdev is `iface`, e.g. to attach NIC counters to a watched link.
pub fn ports_of<'a>(ports: &'a [RdmaPort], iface: &'a str) -> impl Iterator<Item = &'a RdmaPort> {
    ports.iter().filter(move |p| p.netdevs.iter().any(|n| n == iface))
}

/// `linkpilot rdma`: what libibverbs and sysfs show.
pub fn print(root: &std::path::Path, json: bool) -> anyhow::Result<()> {
    let verbs = crate::rdma::verbs::discover()?;
    let ports = crate::rdma::discover(root)?;
    if json {
        let out = serde_json::json!({ "verbs": verbs, "ports": ports });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    match (&verbs.unavailable, verbs.devices.is_empty()) {
        (Some(why), _) => println!("verbs: no RDMA devices ({why})"),
        (None, true) => println!("verbs: no RDMA devices"),
        (None, false) => {
            for d in &verbs.devices {
                match &d.port1 {
                    Ok(p) => println!(
                        "verbs: {} guid {} port 1 usable, {} GIDs, netdevs {:?}",
                        d.name, d.guid, p.gids, p.netdevs
                    ),
                    Err(e) => println!("verbs: {} guid {} port 1 not usable: {e}", d.name, d.guid),
                }
            }
        }
    }
    if ports.is_empty() {
        println!("sysfs: no RDMA devices (nothing under {})", root.display());
    }
    for p in &ports {
        println!(
            "sysfs: {} port {}: {} {} {} netdevs {:?}",
            p.device, p.port, p.state, p.link_layer, p.rate, p.netdevs
        );
        for (k, v) in &p.signals {
            println!("  {k:<28} {v}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs-infiniband")
    }

    #[test]
    fn reads_a_connectx_fixture() {
        let ports = discover(&fixture()).unwrap();
        assert_eq!(ports.len(), 3);
        let p = &ports[0];
        assert_eq!((p.device.as_str(), p.port, p.state.as_str()), ("mlx5_0", 1, "ACTIVE"));
        assert_eq!(
            (p.link_layer.as_str(), p.netdevs.clone()),
            ("Ethernet", vec!["eth2".to_owned()])
        );
        assert_eq!(p.signals["np_ecn_marked_roce_packets"], 18234);
        assert_eq!(p.signals["rp_cnp_handled"], 5121);
        assert_eq!(p.signals["out_of_sequence"], 37);
        assert_eq!(p.other["rx_write_requests"], 7340032);
        assert!(!p.signals.contains_key("lifespan"));
        assert_eq!(ports[1].state, "DOWN");
        let ib = &ports[2];
        assert_eq!((ib.link_layer.as_str(), ib.netdevs.len()), ("InfiniBand", 0));
        assert_eq!(ib.unreadable.len(), 1, "{:?}", ib.unreadable);
        assert_eq!(ports_of(&ports, "eth3").map(|p| p.port).collect::<Vec<_>>(), vec![2]);
    }

    #[test]
    fn refresh_rereads_state_and_signal_counters() {
        let root = std::env::temp_dir().join(format!("lp-rdma-refresh-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let out = std::process::Command::new("cp").arg("-r").arg(fixture()).arg(&root).status();
        assert!(out.is_ok_and(|s| s.success()));
        let mut ports = discover(&root).unwrap();
        let dir = root.join("mlx5_0/ports/1");
        fs::write(dir.join("hw_counters/rp_cnp_handled"), "6121\n").unwrap();
        fs::write(dir.join("state"), "1: DOWN\n").unwrap();
        refresh(&root, &mut ports);
        let _ = fs::remove_dir_all(&root);
        assert_eq!((ports[0].signals["rp_cnp_handled"], ports[0].state.as_str()), (6121, "DOWN"));
        assert_eq!(ports[0].signals["out_of_sequence"], 37);
    }

    #[test]
    fn a_port_serves_this_namespace_only_when_the_kernel_says_its_netdev_is_here() {
        // Port 1's GID names eth2; in a namespace whose own interface is also called eth2,
        // the name alone would take the host's port.
        let ports = discover(&fixture()).unwrap();
        assert_eq!(ports_of(&ports, "eth2").count(), 1, "by name, as sysfs says");
        let none = crate::rdma::netlink::PortNetdevs::new();
        let elsewhere = in_namespace(ports.clone(), &none, |_| true);
        assert_eq!(ports_of(&elsewhere, "eth2").count(), 0, "its netdev is not ours");
        // The kernel names it to us (as ens1f0 here): that name, plus GID netdevs that are
        // interfaces of ours.
        let here = [(("mlx5_0".to_owned(), 1), (7, "ens1f0".to_owned()))].into();
        let ours = in_namespace(ports.clone(), &here, |n| n == "eth2");
        assert_eq!(ours.len(), 1);
        assert_eq!(ours[0].netdevs, ["ens1f0", "eth2"]);
        let ours = in_namespace(ports, &here, |_| false);
        assert_eq!(ours[0].netdevs, ["ens1f0"], "a GID name that is no interface of ours");
    }

    #[test]
    fn no_rdma_is_not_an_error() {
        assert_eq!(discover(Path::new("/nonexistent/infiniband")).unwrap(), vec![]);
    }
}
