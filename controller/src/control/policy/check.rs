//! Checks a policy as written and builds the [`Policy`]: every problem is recorded with its
//! location; any problem means no policy.

use ipnet::IpNet;
use linkpilot_common::{board::BOARD_MAX_LINKS, units::Bytes, MAX_DSCP_RULES, MAX_PEERS};

use toml::Spanned;

use super::sections::{check_env, check_host, check_nccl, check_outcome, check_transport, CcUses};
use super::{
    file::{RawBounds, RawPolicy, RawState, Setting},
    higher_is_worse, secs, Bounds, Errors, EstimatorConfig, Hysteresis, Link, Policy, State,
    StateKnobs, Thresholds,
};

/// Why a link, peer or state name cannot be used, if it cannot: names go into the env file
/// (`KEY=value` lines), the knob board (31 bytes) and metrics labels.
fn bad_name(name: &str) -> Option<&'static str> {
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

fn check_bounds(b: &RawBounds, e: &mut Errors) -> Bounds {
    let c = b.chunk.get_ref();
    if c.min.0 == 0 || c.min > c.max {
        e.at(
            b.chunk.span(),
            format!("chunk bounds: min {} must be above 0 and at most max {}", c.min, c.max),
        );
    }
    if c.initial < c.min || c.initial > c.max {
        e.at(
            b.chunk.span(),
            format!("chunk initial {} must lie within min {} and max {}", c.initial, c.min, c.max),
        );
    }
    if c.in_flight == 0 {
        e.at(b.chunk.span(), "chunk in_flight must be at least 1");
    }
    let t = b.tcp_buffers.get_ref();
    if t.min.0 == 0 || t.min > t.max {
        e.at(
            b.tcp_buffers.span(),
            format!("tcp_buffers bounds: min {} must be above 0 and at most max {}", t.min, t.max),
        );
    }
    // The kernel's buffer sysctls are C ints.
    if t.max.0 > i32::MAX as u64 {
        e.at(
            b.tcp_buffers.span(),
            format!("tcp_buffers max {} must be below 2GiB (a C int)", t.max),
        );
    }
    if !(t.bdp_factor > 0.0 && t.bdp_factor.is_finite()) {
        e.at(b.tcp_buffers.span(), "tcp_buffers bdp_factor must be above 0");
    }
    let i = b.nccl_ib_timeout.get_ref();
    if i.min == 0 || i.max > 31 || i.min > i.max {
        e.at(
            b.nccl_ib_timeout.span(),
            format!(
                "nccl_ib_timeout bounds {}..={} must lie within 1..=31, min first",
                i.min, i.max
            ),
        );
    }
    if !(i.k > 0.0 && i.k.is_finite()) {
        e.at(b.nccl_ib_timeout.span(), "nccl_ib_timeout k must be above 0");
    }
    let w = b.watchdog.get_ref();
    if w.min.0 < 1_000_000_000 || w.min > w.max {
        e.at(
            b.watchdog.span(),
            format!("watchdog bounds: min {} must be at least 1s and at most max {}", w.min, w.max),
        );
    }
    if !(w.rtt_multiple > 0.0 && w.rtt_multiple.is_finite()) {
        e.at(b.watchdog.span(), "watchdog rtt_multiple must be above 0");
    }
    let y = b.sync_every.get_ref();
    if y.min == 0 || y.min > y.max {
        e.at(
            b.sync_every.span(),
            format!(
                "sync_every bounds: min {} must be at least 1 and at most max {}",
                y.min, y.max
            ),
        );
    }
    if y.max_drift < y.max {
        e.at(
            b.sync_every.span(),
            format!(
                "sync_every max_drift {} must be at least max {}: a site may always finish a round",
                y.max_drift, y.max
            ),
        );
    }
    if !(y.margin.0 >= 0.0 && y.margin.0.is_finite()) {
        e.at(b.sync_every.span(), "sync_every margin must be 0% or more");
    }
    let z = b.compression.get_ref();
    if z.weakest.ratio() < z.strongest.ratio() {
        e.at(
            b.compression.span(),
            format!(
                "compression bounds: weakest {} sends less than strongest {}",
                z.weakest, z.strongest
            ),
        );
    }
    if !(z.margin.0 >= 0.0 && z.margin.0.is_finite()) {
        e.at(b.compression.span(), "compression margin must be 0% or more");
    }
    if !(z.latency_rtts >= 0.0 && z.latency_rtts <= 100.0) {
        e.at(
            b.compression.span(),
            format!("compression latency_rtts {} must be from 0 to 100", z.latency_rtts),
        );
    }
    for (span, step) in [
        (b.chunk.span(), c.max_step),
        (b.tcp_buffers.span(), t.max_step),
        (b.watchdog.span(), w.max_step),
    ] {
        if step < 1.0 || !step.is_finite() {
            e.at(span, format!("max_step {step} must be at least 1 (a factor per change)"));
        }
    }
    Bounds {
        chunk_min: c.min.0,
        chunk_max: c.max.0,
        chunk_initial: c.initial.0,
        chunk_in_flight: c.in_flight,
        chunk_max_step: c.max_step,
        buffers_min: t.min.0,
        buffers_max: t.max.0,
        buffers_bdp_factor: t.bdp_factor,
        buffers_max_step: t.max_step,
        ib_timeout_k: i.k,
        ib_timeout_min: i.min,
        ib_timeout_max: i.max,
        watchdog_min_s: secs(w.min),
        watchdog_max_s: secs(w.max),
        watchdog_rtt_multiple: w.rtt_multiple,
        watchdog_max_step: w.max_step,
        sync_min: y.min,
        sync_max: y.max,
        sync_margin: y.margin.0,
        max_drift: y.max_drift,
        codec_weakest: z.weakest,
        codec_strongest: z.strongest,
        codec_margin: z.margin.0,
        codec_latency_rtts: z.latency_rtts,
    }
}

fn check_states(raw: &[Spanned<RawState>], b: &Bounds, e: &mut Errors) -> (Vec<State>, CcUses) {
    let mut ccs = Vec::new();
    if raw.is_empty() {
        e.at(0..0, "no [[state]]: a policy needs at least one state (the healthy one)");
    }
    let mut states: Vec<State> = Vec::new();
    for (i, s) in raw.iter().enumerate() {
        let span = s.span();
        let s = s.get_ref();
        let name = s.name.get_ref().clone();
        if states.iter().any(|o| o.name == name) {
            e.at(s.name.span(), format!("state name {name:?} is used twice"));
        }
        if let Some(why) = bad_name(&name) {
            e.at(s.name.span(), format!("state name {name:?} {why}"));
        }
        let enter = s.enter.as_ref().map(|t| *t.get_ref()).unwrap_or_default();
        let enter_span = s.enter.as_ref().map_or(span.clone(), |t| t.span());
        if i == 0 && !enter.conditions().is_empty() {
            e.at(enter_span.clone(), format!("state {name:?} is the first (healthiest) state: it has no enter thresholds; remove them or put a healthier state first"));
        }
        if i > 0 && enter.conditions().is_empty() {
            e.at(enter_span.clone(), format!("state {name:?} needs enter thresholds (any of rtt_inflation, cross_rtt_inflation, rtt_p99, jitter, ce_fraction, cross_ce_fraction, retrans, cnp_rate, goodput_below, unanswered)"));
        }
        let exit = match &s.exit {
            None => enter,
            Some(x) => {
                let exit = *x.get_ref();
                if i == 0 {
                    e.at(
                        x.span(),
                        format!("state {name:?} is the first state: there is nothing to exit to"),
                    );
                }
                let enter_c = enter.conditions();
                for (sig, v, written) in exit.conditions() {
                    match enter_c.iter().find(|(n, _, _)| *n == sig) {
                        None => e.at(x.span(), format!("state {name:?}: exit threshold {sig} has no enter threshold to pair with")),
                        Some((_, ev, ew)) => {
                            let ok = if higher_is_worse(sig) { v <= *ev } else { v >= *ev };
                            if !ok {
                                let rel = if higher_is_worse(sig) { "at or below" } else { "at or above" };
                                e.at(x.span(), format!("state {name:?}: exit {sig} {written} must be {rel} its enter threshold {ew}, or the state could never be left"));
                            }
                        }
                    }
                }
                // Signals with an enter threshold and no exit one exit at the enter threshold.
                let mut merged = enter;
                merge(&mut merged, &exit);
                merged
            }
        };
        // Each state must be entered at worse signals than every healthier one.
        for prev in &states {
            for (sig, v, written) in enter.conditions() {
                if let Some((_, pv, pw)) =
                    prev.enter.conditions().into_iter().find(|(n, _, _)| *n == sig)
                {
                    let ordered = if higher_is_worse(sig) { v > pv } else { v < pv };
                    if !ordered {
                        e.at(enter_span.clone(), format!("state {name:?}: {sig} {written} overlaps state {:?} ({pw}); states are ordered healthiest first, so its threshold must be {}", prev.name, if higher_is_worse(sig) { "higher" } else { "lower" }));
                    }
                }
            }
        }
        let k = s.knobs.get_ref();
        let kspan = s.knobs.span();
        if let Some(d) = k.dscp.0.filter(|d| *d > 63) {
            e.at(kspan.clone(), format!("state {name:?}: dscp {d} must be 0..=63, or \"keep\""));
        }
        // A knob is left alone on the whole ladder or on none of it: a state that "keeps" after
        // one that set a value would leave that value behind rather than the host's own.
        if let Some(first) = states.first() {
            let mixed = [
                ("dscp", first.knobs.dscp.is_some(), k.dscp.0.is_some()),
                (
                    "roce_traffic_class",
                    first.knobs.roce_traffic_class.is_some(),
                    k.roce_traffic_class.0.is_some(),
                ),
                ("tcp_buffers", first.knobs.tcp_buffers.is_some(), k.tcp_buffers.0.is_some()),
            ];
            for (knob, _, set_here) in mixed.into_iter().filter(|(_, a, b)| a != b) {
                let (here, there) = if set_here { ("sets", "keeps") } else { ("keeps", "sets") };
                e.at(kspan.clone(), format!("state {name:?} {here} {knob} while state {:?} {there} it; \"keep\" (or leaving it out) applies to every state of the ladder or to none", first.name));
            }
        }
        if k.nccl_ib_retry_cnt > 7 {
            e.at(
                kspan.clone(),
                format!(
                    "state {name:?}: nccl_ib_retry_cnt {} must be 0..=7 (a 3-bit field)",
                    k.nccl_ib_retry_cnt
                ),
            );
        }
        let mut outside = |knob: &str, v: String, lo: String, hi: String| {
            e.at(
                kspan.clone(),
                format!("state {name:?}: {knob} {v} lies outside the bounds {lo}..={hi}"),
            );
        };
        if let Setting::Fixed(c) = k.chunk {
            if c.0 < b.chunk_min || c.0 > b.chunk_max {
                outside(
                    "chunk",
                    c.to_string(),
                    Bytes(b.chunk_min).to_string(),
                    Bytes(b.chunk_max).to_string(),
                );
            }
        }
        if let Setting::Fixed(t) = k.nccl_ib_timeout {
            if t < b.ib_timeout_min || t > b.ib_timeout_max {
                outside(
                    "nccl_ib_timeout",
                    t.to_string(),
                    b.ib_timeout_min.to_string(),
                    b.ib_timeout_max.to_string(),
                );
            }
        }
        if let Setting::Fixed(w) = k.watchdog {
            let s = secs(w);
            if s < b.watchdog_min_s || s > b.watchdog_max_s {
                outside(
                    "watchdog",
                    format!("{s}s"),
                    format!("{}s", b.watchdog_min_s),
                    format!("{}s", b.watchdog_max_s),
                );
            }
        }
        if let Some(Setting::Fixed(t)) = k.tcp_buffers.0 {
            if t.0 < b.buffers_min || t.0 > b.buffers_max {
                outside(
                    "tcp_buffers",
                    t.to_string(),
                    Bytes(b.buffers_min).to_string(),
                    Bytes(b.buffers_max).to_string(),
                );
            }
        }
        check_sync(&name, k, b, kspan.clone(), e);
        // "auto" chooses from the link and the jobs, whatever the state: only fixed codecs
        // form a ladder.
        let fixed_before = states.iter().rev().find_map(|st: &State| match st.knobs.compression {
            Setting::Fixed(c) => Some((c, st.name.as_str())),
            Setting::Auto => None,
        });
        if let (Setting::Fixed(c), Some((prev, prev_name))) = (k.compression, fixed_before) {
            if c.ratio() > prev.ratio() {
                e.at(kspan.clone(), format!("state {name:?}: compression {c} is lighter than {prev} in the healthier state {prev_name:?}; compression may only get stronger as states worsen"));
            }
        }
        let transport = s.transport.as_ref().map(|t| check_transport(&name, t, b, e, &mut ccs));
        if k.tcp_buffers.0.is_none()
            && transport.as_ref().is_some_and(|t| t.socket_buffers == Some(Setting::Auto))
        {
            e.at(
                kspan.clone(),
                format!(
                    "state {name:?}: transport socket_buffers \"auto\" is the state's \
                     tcp_buffers, which is \"keep\": give socket_buffers a size"
                ),
            );
        }
        states.push(State {
            name,
            enter,
            exit,
            knobs: StateKnobs {
                compression: k.compression,
                chunk: map_setting(k.chunk, |b| b.0),
                nccl_ib_timeout: k.nccl_ib_timeout,
                nccl_ib_retry_cnt: k.nccl_ib_retry_cnt,
                watchdog_s: map_setting(k.watchdog, secs),
                dscp: k.dscp.0,
                roce_traffic_class: k.roce_traffic_class.0,
                tcp_buffers: k.tcp_buffers.0.map(|s| map_setting(s, |b| b.0)),
                sync_every: k.sync_every,
                outer_compression: k.outer_codec,
                fragments: k.fragments,
                overlap: k.overlap,
                transport,
            },
        });
    }
    (states, ccs)
}

/// A state's synchronization knobs: H within the bounds, fragments no more than the steps of a
/// round, and each fragment's overlap below the steps between two sends.
fn check_sync(
    name: &str,
    k: &super::file::RawKnobs,
    b: &Bounds,
    span: std::ops::Range<usize>,
    e: &mut Errors,
) {
    let h = match k.sync_every {
        Setting::Fixed(h) => {
            if h != 1 && (h < b.sync_min || h > b.sync_max) {
                e.at(
                    span.clone(),
                    format!(
                        "state {name:?}: sync_every {h} lies outside the bounds {}..={} (1, the \
                         per-step exchange, is always allowed)",
                        b.sync_min, b.sync_max
                    ),
                );
            }
            h
        }
        // The shortest round "auto" may choose.
        Setting::Auto => b.sync_min,
    };
    let f = u32::from(k.fragments);
    if f == 0 || f > h.max(1) {
        e.at(
            span.clone(),
            format!(
                "state {name:?}: fragments {f} must be from 1 to sync_every's {}{h} (one send a \
                 step at most)",
                if matches!(k.sync_every, Setting::Auto) { "smallest, " } else { "" }
            ),
        );
    } else if u32::from(k.overlap) >= h / f {
        e.at(
            span,
            format!(
                "state {name:?}: overlap {} must be below the {} steps between two sends \
                 (sync_every {h} / fragments {f})",
                k.overlap,
                h / f
            ),
        );
    }
}

pub(super) fn map_setting<T, U>(s: Setting<T>, f: impl FnOnce(T) -> U) -> Setting<U> {
    match s {
        Setting::Auto => Setting::Auto,
        Setting::Fixed(t) => Setting::Fixed(f(t)),
    }
}

/// Overrides `into`'s thresholds with those `from` sets.
fn merge(into: &mut Thresholds, from: &Thresholds) {
    macro_rules! take {
        ($($f:ident),*) => {$( if from.$f.is_some() { into.$f = from.$f; } )*};
    }
    take!(
        rtt_inflation,
        cross_rtt_inflation,
        rtt_p99,
        jitter,
        ce_fraction,
        cross_ce_fraction,
        retrans,
        cnp_rate,
        goodput_below,
        unanswered
    );
}
