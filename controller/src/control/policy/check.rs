//! Checks a policy as written and builds the [`Policy`]: every problem is recorded with its
//! location; any problem means no policy. This file checks the whole and its links; the bounds
//! and the ladder of states each have their own file.

use ipnet::IpNet;
use linkpilot_common::{board::BOARD_MAX_LINKS, MAX_DSCP_RULES, MAX_PEERS};

use super::sections::{check_env, check_host, check_nccl, check_outcome};
use super::{
    file::{RawPolicy, Setting},
    Errors, EstimatorConfig, Hysteresis, Link, Policy,
};

mod bounds;
mod states;

use bounds::check_bounds;
use states::check_states;

/// Why a link, peer or state name cannot be used, if it cannot: names go into the env file
/// (`KEY=value` lines), the knob board (31 bytes) and metrics labels.
pub(super) fn bad_name(name: &str) -> Option<&'static str> {
    if name.is_empty() || name.len() > 31 {
        Some("must be 1 to 31 bytes long")
    } else if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
        Some("may only use letters, digits, '.', '_' and '-'")
    } else {
        None
    }
}

pub(super) fn check(raw: RawPolicy, e: &mut Errors) -> Policy {
    let tick = *raw.daemon.tick.get_ref();
    if tick.0 < 10_000_000 || tick.0 > 10_000_000_000 {
        e.at(raw.daemon.tick.span(), format!("tick {tick} must be between 10ms and 10s"));
    }
    let est_span = raw.estimator.span();
    let est = raw.estimator.into_inner();
    for (name, v) in [
        ("baseline_window", est.baseline_window),
        ("window", est.window),
        ("ewma_half_life", est.ewma_half_life),
        ("peak_window", est.peak_window),
    ] {
        if v.0 == 0 {
            e.at(est_span.clone(), format!("estimator {name} must be above 0"));
        }
    }
    // The RTT percentile window keeps ~6.5 KB per second of it for every (interface, peer).
    if est.window.0 > 60_000_000_000 {
        e.at(
            est_span.clone(),
            format!("estimator window {}s must be at most 60s", est.window.0 as f64 / 1e9),
        );
    }
    if !(est.min_packet_rate.0 >= 0.0 && est.min_packet_rate.0.is_finite()) {
        e.at(est_span.clone(), "estimator min_packet_rate must be a rate of 0/s or more");
    }
    let estimator = EstimatorConfig {
        baseline_window: est.baseline_window,
        window: est.window,
        ewma_half_life: est.ewma_half_life,
        peak_window: est.peak_window,
        min_packet_rate: est.min_packet_rate.0,
    };
    let h = raw.hysteresis;
    let hysteresis =
        Hysteresis { enter_after: h.enter_after, exit_after: h.exit_after, min_dwell: h.min_dwell };
    let bounds = check_bounds(&raw.bounds, e);
    if raw.links.is_empty() {
        e.at(0..0, "no [[link]]: a policy needs at least one link (name, interfaces, capacity)");
    }
    if raw.links.len() > BOARD_MAX_LINKS {
        let span = raw.links[BOARD_MAX_LINKS].span();
        e.at(span, format!("at most {BOARD_MAX_LINKS} links: the knob board holds that many"));
    }
    let mut links: Vec<Link> = Vec::new();
    for l in &raw.links {
        let span = l.span();
        let l = l.get_ref();
        if links.iter().any(|o| o.name == l.name) {
            e.at(span.clone(), format!("link name {:?} is used twice", l.name));
        }
        for i in &l.interfaces {
            if let Some(o) = links.iter().find(|o| o.interfaces.contains(i)) {
                e.at(
                    span.clone(),
                    format!(
                        "interface {i:?} is already on link {:?}: a link per interface",
                        o.name
                    ),
                );
            }
        }
        if let Some(why) = bad_name(&l.name) {
            e.at(span.clone(), format!("link name {:?} {why}", l.name));
        }
        if l.interfaces.is_empty() {
            e.at(span.clone(), format!("link {:?} lists no interfaces", l.name));
        }
        let mut peers = Vec::new();
        for p in &l.peers {
            let mut nets = Vec::new();
            for c in &p.cidrs {
                match c.get_ref().parse::<IpNet>() {
                    Ok(n) => nets.push(n),
                    Err(_) => e.at(
                        c.span(),
                        format!(
                            "peer {:?}: {:?} is not a CIDR such as \"198.18.2.0/24\"",
                            p.name,
                            c.get_ref()
                        ),
                    ),
                }
            }
            if p.name.is_empty() || p.name == "other" {
                e.at(span.clone(), format!("peer name {:?} is empty or reserved", p.name));
            } else if let Some(why) = bad_name(&p.name) {
                e.at(span.clone(), format!("peer name {:?} {why}", p.name));
            }
            peers.push((p.name.clone(), nets));
        }
        links.push(Link {
            name: l.name.clone(),
            interfaces: l.interfaces.clone(),
            capacity_bps: match l.capacity {
                Setting::Fixed(c) => Some(c.0),
                Setting::Auto => None,
            },
            peers,
        });
    }
    let mut names: Vec<&str> =
        links.iter().flat_map(|l| l.peers.iter().map(|(n, _)| n.as_str())).collect();
    names.sort_unstable();
    names.dedup();
    if names.len() > MAX_PEERS as usize {
        e.at(0..0, format!("{} peers named; the programs count at most {MAX_PEERS}", names.len()));
    } else {
        // What the daemon loads into the programs' peer trie: prefixes of all links' peers,
        // each of one peer, at most MAX_PEER_PREFIXES.
        let prefixes = links.iter().flat_map(|l| {
            l.peers.iter().flat_map(|(n, nets)| nets.iter().map(move |net| (n.as_str(), *net)))
        });
        if let Err(err) = crate::kernel::peers::PeerIds::assign(prefixes) {
            e.at(0..0, err.to_string());
        }
    }
    // One egress DSCP rule per interface and peer of a link (per interface for a link that names
    // no peer): the programs hold MAX_DSCP_RULES.
    let per_link: Vec<(&str, usize, usize)> =
        links.iter().map(|l| (l.name.as_str(), l.interfaces.len(), l.peers.len().max(1))).collect();
    let rules: usize = per_link.iter().map(|(_, i, p)| i * p).sum();
    if rules > MAX_DSCP_RULES as usize {
        let terms: Vec<String> =
            per_link.iter().map(|(n, i, p)| format!("{n:?} {i} x {p}")).collect();
        e.at(
            0..0,
            format!(
                "{rules} DSCP rules needed (each link's interfaces x its peers, or x 1 without \
                 peers: {}); at most {MAX_DSCP_RULES} fit: name fewer interfaces or peers",
                terms.join(" + ")
            ),
        );
    }
    let (states, congestion_controls) = check_states(&raw.states, &bounds, e);
    // goodput_below is a share of the nominal capacity, which "auto" does not have.
    let by_goodput =
        states.iter().find(|s| s.enter.goodput_below.is_some() || s.exit.goodput_below.is_some());
    // "keep" socket buffer maxima: nothing to size the probe's or the sockets' buffers with.
    let kept_buffers = states.first().is_some_and(|s| s.knobs.tcp_buffers.is_none());
    for (l, raw) in links.iter().zip(&raw.links) {
        if kept_buffers && l.capacity_bps.is_none() {
            e.at(
                raw.span(),
                format!(
                    "link {:?} has capacity \"auto\", which probes the rate by raising the \
                     socket buffer maxima, but tcp_buffers is \"keep\": give the link's \
                     capacity, or let linkpilot set the buffers",
                    l.name
                ),
            );
        }
        if let (None, Some(st)) = (l.capacity_bps, by_goodput) {
            e.at(
                raw.span(),
                format!(
                    "link {:?} has capacity \"auto\" (no capacity given), but state {:?} uses \
                     goodput_below, a share of the nominal capacity: give the link's capacity",
                    l.name, st.name
                ),
            );
        }
    }
    let nccl = check_nccl(&raw.nccl, &states, e);
    let host = check_host(&raw.host, e);
    let env = check_env(&raw.env, e);
    let outcome = check_outcome(&raw.outcome, e);
    Policy {
        tick,
        job_namespaces: raw.daemon.job_namespaces,
        estimator,
        hysteresis,
        bounds,
        links,
        states,
        nccl,
        host,
        env,
        outcome,
        congestion_controls,
    }
}

pub(super) fn map_setting<T, U>(s: Setting<T>, f: impl FnOnce(T) -> U) -> Setting<U> {
    match s {
        Setting::Auto => Setting::Auto,
        Setting::Fixed(t) => Setting::Fixed(f(t)),
    }
}
