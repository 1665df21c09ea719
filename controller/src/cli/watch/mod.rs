//! `linkpilot watch`: per-interface rates once a second, from the probes' counters.

use std::time::Duration;

use std::collections::BTreeMap;

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use linkpilot_common::{
    DirCounters, DscpRule, FlowEvents, FlowKey, FlowState, IfaceStats, PeerStats, RoceCounters,
    RttCounters, ANY_PEER, MAX_DSCP_RULES,
};
use serde::{Deserialize, Serialize};

use crate::{kernel::iface::Iface, kernel::peers::PeerIds};

/// A `--dscp` rule before interface and peer names are resolved.
#[derive(Clone, Debug)]
pub struct DscpArg {
    /// The interface it applies on; `None`: every watched interface.
    pub iface: Option<String>,
    /// `None`: every peer.
    pub peer: Option<String>,
    pub ports: (u16, u16),
    pub dscp: u8,
}

/// Parses `[IF/]PEER[:LO[-HI]]=DSCP`, PEER a name or `*`. Interface names cannot hold '/'.
pub fn parse_dscp(s: &str) -> Result<DscpArg, String> {
    let (selector, dscp) =
        s.rsplit_once('=').ok_or_else(|| format!("{s:?} is not SELECTOR=DSCP"))?;
    let dscp: u8 = dscp
        .parse()
        .ok()
        .filter(|d| *d < 64)
        .ok_or_else(|| format!("DSCP {dscp:?} is not 0 to 63"))?;
    let (iface, selector) = match selector.split_once('/') {
        Some(("", _)) => return Err(format!("{s:?}: an empty interface before '/'")),
        Some((i, rest)) => (Some(i.to_owned()), rest),
        None => (None, selector),
    };
    let (peer, ports) = match selector.split_once(':') {
        Some((p, range)) => {
            let (lo, hi) = range.split_once('-').unwrap_or((range, range));
            let port =
                |x: &str| x.parse::<u16>().map_err(|_| format!("port {x:?} is not 0 to 65535"));
            let (lo, hi) = (port(lo)?, port(hi)?);
            if lo > hi {
                return Err(format!("port range {range:?} is empty"));
            }
            (p, (lo, hi))
        }
        None => (selector, (0, u16::MAX)),
    };
    let peer = match peer {
        "*" => None,
        "" => return Err("the selector needs a peer name or *".into()),
        name => Some(name.to_owned()),
    };
    Ok(DscpArg { iface, peer, ports, dscp })
}

/// The map's rules for `--dscp` arguments, in their order: a rule on each interface it names
/// (every watched one without `IF/`), since the programs match a rule on its interface only.
pub fn dscp_rules(
    args: &[DscpArg],
    ifaces: &[Iface],
    peers: &PeerIds,
) -> anyhow::Result<Vec<DscpRule>> {
    let mut rules = Vec::new();
    for d in args {
        let peer = match &d.peer {
            None => ANY_PEER,
            Some(name) => peers.id(name).ok_or_else(|| {
                anyhow::anyhow!("--dscp names peer {name:?}, which no --peer defines")
            })?,
        };
        let on: Vec<&Iface> = match &d.iface {
            None => ifaces.iter().collect(),
            Some(name) => vec![ifaces.iter().find(|i| i.name == *name).ok_or_else(|| {
                anyhow::anyhow!("--dscp names interface {name:?}, which no --iface watches")
            })?],
        };
        rules.extend(on.into_iter().map(|i| DscpRule {
            enabled: 1,
            ifindex: i.ifindex,
            peer,
            port_lo: d.ports.0,
            port_hi: d.ports.1,
            dscp: d.dscp,
            _pad: [0; 3],
        }));
    }
    anyhow::ensure!(
        rules.len() <= MAX_DSCP_RULES as usize,
        "--dscp makes {} rules (one per interface it applies on: {} watched for a rule without \
         IF/); at most {MAX_DSCP_RULES} fit",
        rules.len(),
        ifaces.len()
    );
    Ok(rules)
}

/// Rates of one interface over one interval.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    pub rx_packets_per_s: f64,
    pub rx_bytes_per_s: f64,
    pub tx_packets_per_s: f64,
    pub tx_bytes_per_s: f64,
    pub retrans_segs_per_s: f64,
}

/// One direction of one peer, as printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirTotals {
    pub packets: u64,
    pub bytes: u64,
    pub not_ect: u64,
    pub ect1: u64,
    pub ect0: u64,
    pub ce: u64,
    pub tcp_ece: u64,
    pub tcp_cwr: u64,
    pub unparsed: u64,
}

impl From<DirCounters> for DirTotals {
    fn from(d: DirCounters) -> Self {
        Self {
            packets: d.packets,
            bytes: d.bytes,
            not_ect: d.ecn[0],
            ect1: d.ecn[1],
            ect0: d.ecn[2],
            ce: d.ecn[3],
            tcp_ece: d.tcp_ece,
            tcp_cwr: d.tcp_cwr,
            unparsed: d.unparsed,
        }
    }
}

/// RoCEv2 counters of one direction of one peer, as printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoceTotals {
    pub packets: u64,
    pub rc: u64,
    pub uc: u64,
    pub ud: u64,
    pub xrc: u64,
    pub cnp: u64,
    pub ack: u64,
    pub nak_rnr: u64,
    pub nak_psn_seq: u64,
    pub nak_other: u64,
    pub retransmitted: u64,
    pub truncated: u64,
}

impl From<RoceCounters> for RoceTotals {
    fn from(r: RoceCounters) -> Self {
        Self {
            packets: r.packets,
            rc: r.by_class[0],
            uc: r.by_class[1],
            ud: r.by_class[3],
            xrc: r.by_class[5],
            cnp: r.cnp,
            ack: r.ack,
            nak_rnr: r.nak_rnr,
            nak_psn_seq: r.nak_psn_seq,
            nak_other: r.nak_other,
            retransmitted: r.retransmitted,
            truncated: r.truncated,
        }
    }
}

/// RTT samples of one peer since it was watched (smoothed RTTs of its flows, in ms).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RttTotals {
    pub samples: u64,
    pub sum_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
}

impl From<RttCounters> for RttTotals {
    fn from(r: RttCounters) -> Self {
        Self {
            samples: r.samples,
            sum_ms: r.sum_us as f64 / 1e3,
            min_ms: r.min_us as f64 / 1e3,
            max_ms: r.max_us as f64 / 1e3,
        }
    }
}

/// Mean RTT of the samples taken between two readings, ms (`None` without samples).
pub fn mean_rtt_ms(prev: &RttTotals, now: &RttTotals) -> Option<f64> {
    let n = now.samples.saturating_sub(prev.samples);
    (n > 0).then(|| (now.sum_ms - prev.sum_ms) / n as f64)
}

/// A flow as `watch --flows` prints it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlowSample {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub peer: u32,
    pub srtt_ms: f64,
    pub min_srtt_ms: f64,
    pub rtt_samples: u64,
    pub retrans_segs: u64,
    pub snd_cwnd: u32,
}

fn unmap(a: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(a);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

impl FlowSample {
    pub fn new(k: &FlowKey, f: &FlowState) -> Self {
        Self {
            local: SocketAddr::new(unmap(k.local), k.local_port),
            remote: SocketAddr::new(unmap(k.remote), k.remote_port),
            peer: f.peer,
            srtt_ms: f64::from(f.srtt_us) / 1e3,
            min_srtt_ms: f64::from(f.min_srtt_us) / 1e3,
            rtt_samples: f.rtt_samples,
            retrans_segs: f.retrans_segs,
            snd_cwnd: f.snd_cwnd,
        }
    }
}

/// Totals of one peer on one interface since it was watched.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerTotals {
    pub peer: String,
    pub rx: DirTotals,
    pub tx: DirTotals,
    pub rx_roce: RoceTotals,
    pub tx_roce: RoceTotals,
    pub rtt: RttTotals,
    /// TCP segments retransmitted to this peer.
    pub retrans_segs: u64,
    pub flows: FlowEvents,
    /// Egress segments by DSCP, non-zero entries only.
    pub tx_dscp: BTreeMap<u8, u64>,
}

impl PeerTotals {
    pub fn new(peer: &str, s: &PeerStats) -> Self {
        Self {
            peer: peer.to_owned(),
            rx: s.rx.into(),
            tx: s.tx.into(),
            rx_roce: s.rx_roce.into(),
            tx_roce: s.tx_roce.into(),
            rtt: s.rtt.into(),
            retrans_segs: s.retrans_segs,
            flows: s.flows,
            tx_dscp: (0u8..64).zip(s.tx_dscp).filter(|(_, n)| *n > 0).collect(),
        }
    }
}

/// Share of ECN-capable packets that arrived CE-marked between two readings (0 when none were
/// ECN-capable).
pub fn ce_fraction(prev: &DirTotals, now: &DirTotals) -> f64 {
    let ce = now.ce.saturating_sub(prev.ce);
    let ect = ce + now.ect0.saturating_sub(prev.ect0) + now.ect1.saturating_sub(prev.ect1);
    if ect == 0 {
        0.0
    } else {
        ce as f64 / ect as f64
    }
}

/// Rates between two readings `elapsed` apart. Counters are u64 and only reset when the
/// interface is re-added, so a reading below the previous one is a reset: the delta is then the
/// new value (counted since the reset) rather than a huge wrapped number.
pub fn rates(prev: &IfaceStats, now: &IfaceStats, elapsed: Duration) -> Rates {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return Rates::default();
    }
    let d = |a: u64, b: u64| if b >= a { (b - a) as f64 / secs } else { b as f64 / secs };
    Rates {
        rx_packets_per_s: d(prev.rx_packets, now.rx_packets),
        rx_bytes_per_s: d(prev.rx_bytes, now.rx_bytes),
        tx_packets_per_s: d(prev.tx_packets, now.tx_packets),
        tx_bytes_per_s: d(prev.tx_bytes, now.tx_bytes),
        retrans_segs_per_s: d(prev.retrans_segs, now.retrans_segs),
    }
}

/// One line of `watch --json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Sample {
    /// Wall-clock time of the reading, milliseconds since the Unix epoch.
    pub unix_ms: u128,
    pub iface: String,
    pub ifindex: u32,
    /// Seconds covered by `rates`.
    pub interval_s: f64,
    pub rates: Rates,
    /// Totals since the interface was attached.
    pub totals: IfaceStats,
    /// Per-peer totals (configured peers, then "other").
    pub peers: Vec<PeerTotals>,
    /// Flows on this interface (with `--flows`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flows: Option<Vec<FlowSample>>,
    /// True on the last line, printed after detaching.
    pub last: bool,
}

impl Sample {
    /// The totals of peer `name`, if it is watched.
    pub fn peer(&self, name: &str) -> Option<&PeerTotals> {
        self.peers.iter().find(|p| p.peer == name)
    }
}

/// The human table's header.
pub fn table_header() -> String {
    format!(
        "{:<16} {:>10} {:>12} {:>10} {:>12} {:>10}",
        "IFACE", "RX pkt/s", "RX bit/s", "TX pkt/s", "TX bit/s", "RETRANS/s"
    )
}

/// One row of the human table.
pub fn table_row(iface: &str, r: &Rates) -> String {
    format!(
        "{:<16} {:>10.0} {:>12} {:>10.0} {:>12} {:>10.0}",
        iface,
        r.rx_packets_per_s,
        human_bits(r.rx_bytes_per_s * 8.0),
        r.tx_packets_per_s,
        human_bits(r.tx_bytes_per_s * 8.0),
        r.retrans_segs_per_s
    )
}

/// One peer row of the human table: rates over the interval and the CE share of ECN-capable
/// arrivals.
pub fn peer_row(prev: &PeerTotals, now: &PeerTotals, secs: f64) -> String {
    let rate = |a: u64, b: u64| if secs > 0.0 { b.saturating_sub(a) as f64 / secs } else { 0.0 };
    let rtt = mean_rtt_ms(&prev.rtt, &now.rtt).map_or("-".to_owned(), |ms| format!("{ms:.1}ms"));
    format!(
        "  {:<14} {:>10.0} {:>12} {:>10.0} {:>12} {:>10.0}  CE in {:.1}%  RTT {rtt}",
        now.peer,
        rate(prev.rx.packets, now.rx.packets),
        human_bits(rate(prev.rx.bytes, now.rx.bytes) * 8.0),
        rate(prev.tx.packets, now.tx.packets),
        human_bits(rate(prev.tx.bytes, now.tx.bytes) * 8.0),
        rate(prev.retrans_segs, now.retrans_segs),
        ce_fraction(&prev.rx, &now.rx) * 100.0
    )
}

/// `1234567.0` -> `"1.23M"`.
pub fn human_bits(bits_per_s: f64) -> String {
    const UNITS: [(f64, &str); 3] = [(1e9, "G"), (1e6, "M"), (1e3, "k")];
    UNITS
        .iter()
        .find(|(scale, _)| bits_per_s >= *scale)
        .map(|(scale, unit)| format!("{:.2}{unit}", bits_per_s / scale))
        .unwrap_or_else(|| format!("{bits_per_s:.0}"))
}

/// `--peer NAME=CIDR` (a bare address is a host prefix).
pub fn parse_peer(s: &str) -> Result<(String, ipnet::IpNet), String> {
    let (name, cidr) = s.split_once('=').ok_or_else(|| format!("{s:?} is not NAME=CIDR"))?;
    if name.is_empty() || name == "other" {
        return Err(format!("peer name {name:?} is empty or reserved"));
    }
    if name.contains('/') {
        return Err(format!("peer name {name:?} contains '/', which --dscp reads as IF/PEER"));
    }
    // A bare address is a host prefix.
    let net: ipnet::IpNet = cidr
        .parse()
        .or_else(|_| cidr.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("{cidr:?} is neither a CIDR prefix nor an address"))?;
    Ok((name.to_owned(), net.trunc()))
}

#[cfg(test)]
mod tests;

pub mod run;
