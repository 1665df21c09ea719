//! Policy files: links, estimator windows, the ladder of link states with their thresholds and
//! knobs, hysteresis, and knob bounds. A policy is parsed and checked whole: any error (named by
//! file, line and column, saying what would be valid) means no policy at all.

use std::{fmt, ops::Range};

use ipnet::IpNet;
use linkpilot_common::units::{BitRate, Bytes, Fraction, Nanos, PerSecond, Percent};
use serde::Deserialize;
use toml::Spanned;

use super::knobs::Compression;

/// Where policies live unless told otherwise.
pub const DEFAULT_PATH: &str = "/etc/linkpilot/policy.toml";

/// The policies shipped in `policies/`, by name.
pub const SHIPPED: &[(&str, &str)] = &[
    ("default", include_str!("../../../policies/default.toml")),
    ("hk-us", include_str!("../../../policies/hk-us.toml")),
    ("static-handtuned", include_str!("../../../policies/static-handtuned.toml")),
];

/// A policy that cannot be used, with where the problem is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: {}", self.file, self.line, self.column, self.message)
    }
}

/// Every error of one policy file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyErrors(pub Vec<PolicyError>);

impl fmt::Display for PolicyErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PolicyErrors {}

// ---- The file as written -------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(default)]
    daemon: RawDaemon,
    #[serde(default)]
    estimator: RawEstimator,
    #[serde(default)]
    hysteresis: RawHysteresis,
    #[serde(default)]
    bounds: RawBounds,
    #[serde(rename = "link", default)]
    links: Vec<Spanned<RawLink>>,
    #[serde(rename = "state", default)]
    states: Vec<Spanned<RawState>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDaemon {
    #[serde(default = "d_tick")]
    tick: Spanned<Nanos>,
}

fn d_tick() -> Spanned<Nanos> {
    unspanned(Nanos(100_000_000))
}

/// A default value: errors about it point at the start of the file.
fn unspanned<T>(v: T) -> Spanned<T> {
    Spanned::new(0..0, v)
}

impl Default for RawDaemon {
    fn default() -> Self {
        Self { tick: d_tick() }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawEstimator {
    /// Windowed-min RTT baseline, BBR-style.
    baseline_window: Nanos,
    /// Maxima (delivery rate) over this window; the daemon sizes the sensors' RTT percentile
    /// window from it too (replays take the percentiles recorded in the trace).
    window: Nanos,
    /// Half-life of the EWMAs of CE fraction, retransmissions, CNPs, goodput, RTT.
    ewma_half_life: Nanos,
    /// Peak RTT p99 the watchdog is sized from, over this (long) window.
    peak_window: Nanos,
}

impl Default for RawEstimator {
    fn default() -> Self {
        Self {
            baseline_window: Nanos(10_000_000_000),
            window: Nanos(10_000_000_000),
            ewma_half_life: Nanos(500_000_000),
            peak_window: Nanos(600_000_000_000),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawHysteresis {
    enter_after: Nanos,
    exit_after: Nanos,
    min_dwell: Nanos,
}

impl Default for RawHysteresis {
    fn default() -> Self {
        Self {
            enter_after: Nanos(300_000_000),
            exit_after: Nanos(10_000_000_000),
            min_dwell: Nanos(2_000_000_000),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawBounds {
    chunk: Spanned<RawChunkBounds>,
    tcp_buffers: Spanned<RawBufferBounds>,
    nccl_ib_timeout: Spanned<RawIbTimeout>,
    watchdog: Spanned<RawWatchdog>,
}

impl Default for RawBounds {
    fn default() -> Self {
        Self {
            chunk: unspanned(RawChunkBounds::default()),
            tcp_buffers: unspanned(RawBufferBounds::default()),
            nccl_ib_timeout: unspanned(RawIbTimeout::default()),
            watchdog: unspanned(RawWatchdog::default()),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawChunkBounds {
    min: Bytes,
    max: Bytes,
    /// Value until the first RTT measurement.
    initial: Bytes,
    /// Chunks in flight across the link (channels x pipeline steps): chunk = BDP / in_flight.
    in_flight: u32,
    /// Largest factor between two consecutive values.
    max_step: f64,
}

impl Default for RawChunkBounds {
    fn default() -> Self {
        Self {
            min: Bytes(1 << 20),
            max: Bytes(64 << 20),
            initial: Bytes(4 << 20),
            in_flight: 64,
            max_step: 2.0,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawBufferBounds {
    min: Bytes,
    max: Bytes,
    /// Buffer = bdp_factor x capacity x RTT p99.
    bdp_factor: f64,
    max_step: f64,
}

impl Default for RawBufferBounds {
    fn default() -> Self {
        Self { min: Bytes(4 << 20), max: Bytes(1 << 30), bdp_factor: 2.0, max_step: 4.0 }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawIbTimeout {
    /// NCCL_IB_TIMEOUT: smallest t with 4.096 us x 2^t >= k x RTT p99.
    k: f64,
    min: u8,
    max: u8,
}

impl Default for RawIbTimeout {
    fn default() -> Self {
        Self { k: 4.0, min: 14, max: 24 }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawWatchdog {
    min: Nanos,
    max: Nanos,
    /// Watchdog = rtt_multiple x peak RTT p99 (a collective waits on many round trips).
    rtt_multiple: f64,
    /// Largest factor of one decrease (increases are immediate: a spike must not kill a job).
    max_step: f64,
}

impl Default for RawWatchdog {
    fn default() -> Self {
        Self {
            min: Nanos(600_000_000_000),
            max: Nanos(3_600_000_000_000),
            rtt_multiple: 3000.0,
            max_step: 2.0,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLink {
    name: String,
    interfaces: Vec<String>,
    capacity: BitRate,
    #[serde(rename = "peer", default)]
    peers: Vec<RawPeer>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPeer {
    name: String,
    cidrs: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawState {
    name: Spanned<String>,
    enter: Option<Spanned<Thresholds>>,
    exit: Option<Spanned<Thresholds>>,
    knobs: Spanned<RawKnobs>,
}

/// Thresholds on the link's signals; `None` is "not a condition".
#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Thresholds {
    /// RTT over its windowed-min baseline, as a share of the baseline.
    pub rtt_inflation: Option<Percent>,
    pub rtt_p99: Option<Nanos>,
    /// RTT p99 minus p50 over the window.
    pub jitter: Option<Nanos>,
    pub ce_fraction: Option<Fraction>,
    /// Retransmitted segments per segment sent.
    pub retrans: Option<Fraction>,
    /// RoCE CNPs per second (TC-seen and NIC-handled).
    pub cnp_rate: Option<PerSecond>,
    /// Goodput below this share of the link's capacity (while the link carries traffic).
    pub goodput_below: Option<Fraction>,
}

/// A knob value that is either fixed or derived from measurements ("auto").
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Setting<T> {
    Auto,
    Fixed(T),
}

impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for Setting<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = toml::Value::deserialize(d)?;
        if v.as_str() == Some("auto") {
            return Ok(Setting::Auto);
        }
        T::deserialize(v)
            .map(Setting::Fixed)
            .map_err(|e| serde::de::Error::custom(format!("{}, or \"auto\"", e.message().trim())))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKnobs {
    compression: Compression,
    #[serde(default = "auto")]
    chunk: Setting<Bytes>,
    #[serde(default = "auto")]
    nccl_ib_timeout: Setting<u8>,
    #[serde(default = "d_retry")]
    nccl_ib_retry_cnt: u8,
    #[serde(default = "auto")]
    watchdog: Setting<Nanos>,
    dscp: u8,
    roce_traffic_class: u8,
    #[serde(default = "auto")]
    tcp_buffers: Setting<Bytes>,
}

fn auto<T>() -> Setting<T> {
    Setting::Auto
}

fn d_retry() -> u8 {
    7
}

// ---- The checked policy --------------------------------------------------------------------

/// A checked policy.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    pub tick: Nanos,
    pub estimator: EstimatorConfig,
    pub hysteresis: Hysteresis,
    pub bounds: Bounds,
    pub links: Vec<Link>,
    /// The ladder, healthiest first.
    pub states: Vec<State>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EstimatorConfig {
    pub baseline_window: Nanos,
    pub window: Nanos,
    pub ewma_half_life: Nanos,
    pub peak_window: Nanos,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hysteresis {
    pub enter_after: Nanos,
    pub exit_after: Nanos,
    pub min_dwell: Nanos,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bounds {
    pub chunk_min: u64,
    pub chunk_max: u64,
    pub chunk_initial: u64,
    pub chunk_in_flight: u32,
    pub chunk_max_step: f64,
    pub buffers_min: u64,
    pub buffers_max: u64,
    pub buffers_bdp_factor: f64,
    pub buffers_max_step: f64,
    pub ib_timeout_k: f64,
    pub ib_timeout_min: u8,
    pub ib_timeout_max: u8,
    pub watchdog_min_s: u32,
    pub watchdog_max_s: u32,
    pub watchdog_rtt_multiple: f64,
    pub watchdog_max_step: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Link {
    pub name: String,
    pub interfaces: Vec<String>,
    pub capacity_bps: f64,
    pub peers: Vec<(String, Vec<IpNet>)>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct State {
    pub name: String,
    /// Entered when any of these holds for `enter_after` (the first state has none).
    pub enter: Thresholds,
    /// Left (one step down) when all of these hold for `exit_after`; defaults to `enter`.
    pub exit: Thresholds,
    pub knobs: StateKnobs,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StateKnobs {
    pub compression: Compression,
    pub chunk: Setting<u64>,
    pub nccl_ib_timeout: Setting<u8>,
    pub nccl_ib_retry_cnt: u8,
    pub watchdog_s: Setting<u32>,
    pub dscp: u8,
    pub roce_traffic_class: u8,
    pub tcp_buffers: Setting<u64>,
}

/// Line and column (1-based) of byte `offset`.
fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let before = &src[..offset.min(src.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

struct Errors<'a> {
    file: &'a str,
    src: &'a str,
    list: Vec<PolicyError>,
}

impl Errors<'_> {
    fn at(&mut self, span: Range<usize>, message: impl Into<String>) {
        let (line, column) = line_col(self.src, span.start);
        self.list.push(PolicyError {
            file: self.file.to_owned(),
            line,
            column,
            message: message.into(),
        });
    }
}

/// The signals a threshold can name, with how to compare them: `true` if higher is worse.
const SIGNALS: [(&str, bool); 7] = [
    ("rtt_inflation", true),
    ("rtt_p99", true),
    ("jitter", true),
    ("ce_fraction", true),
    ("retrans", true),
    ("cnp_rate", true),
    ("goodput_below", false),
];

impl Thresholds {
    /// (signal name, threshold in the units `conditions` uses) of each condition set, without
    /// allocating: the per-tick check.
    pub fn values(&self) -> impl Iterator<Item = (&'static str, f64)> {
        [
            ("rtt_inflation", self.rtt_inflation.map(|x| x.0)),
            ("rtt_p99", self.rtt_p99.map(|x| x.0 as f64 / 1e6)),
            ("jitter", self.jitter.map(|x| x.0 as f64 / 1e6)),
            ("ce_fraction", self.ce_fraction.map(|x| x.0)),
            ("retrans", self.retrans.map(|x| x.0)),
            ("cnp_rate", self.cnp_rate.map(|x| x.0)),
            ("goodput_below", self.goodput_below.map(|x| x.0)),
        ]
        .into_iter()
        .filter_map(|(n, v)| Some((n, v?)))
    }

    /// (signal name, threshold as f64 in base units, as written) of each condition set.
    pub fn conditions(&self) -> Vec<(&'static str, f64, String)> {
        let mut v = Vec::new();
        if let Some(x) = self.rtt_inflation {
            v.push(("rtt_inflation", x.0, x.to_string()));
        }
        if let Some(x) = self.rtt_p99 {
            v.push(("rtt_p99", x.0 as f64 / 1e6, format!("{}ms", x.0 as f64 / 1e6)));
        }
        if let Some(x) = self.jitter {
            v.push(("jitter", x.0 as f64 / 1e6, format!("{}ms", x.0 as f64 / 1e6)));
        }
        if let Some(x) = self.ce_fraction {
            v.push(("ce_fraction", x.0, x.to_string()));
        }
        if let Some(x) = self.retrans {
            v.push(("retrans", x.0, x.to_string()));
        }
        if let Some(x) = self.cnp_rate {
            v.push(("cnp_rate", x.0, x.to_string()));
        }
        if let Some(x) = self.goodput_below {
            v.push(("goodput_below", x.0, x.to_string()));
        }
        v
    }
}

/// Whether `signal` is worse when higher.
pub fn higher_is_worse(signal: &str) -> bool {
    SIGNALS.iter().find(|(n, _)| *n == signal).is_none_or(|(_, h)| *h)
}

impl Policy {
    /// Parses and checks `src`; `file` names it in errors.
    pub fn parse(src: &str, file: &str) -> Result<Policy, PolicyErrors> {
        let mut errs = Errors { file, src, list: Vec::new() };
        let raw: RawPolicy = match toml::from_str(src) {
            Ok(r) => r,
            Err(e) => {
                errs.at(e.span().unwrap_or(0..0), e.message().trim().to_owned());
                return Err(PolicyErrors(errs.list));
            }
        };
        let policy = check(raw, &mut errs);
        if errs.list.is_empty() {
            Ok(policy)
        } else {
            Err(PolicyErrors(errs.list))
        }
    }

    /// Reads and parses a policy file.
    pub fn load(path: &std::path::Path) -> Result<Policy, PolicyErrors> {
        let file = path.display().to_string();
        let src = std::fs::read_to_string(path).map_err(|e| {
            PolicyErrors(vec![PolicyError {
                file: file.clone(),
                line: 0,
                column: 0,
                message: format!("cannot read the policy: {e}"),
            }])
        })?;
        Self::parse(&src, &file)
    }
}

fn secs(n: Nanos) -> u32 {
    (n.0 / 1_000_000_000).min(u64::from(u32::MAX)) as u32
}

fn check(raw: RawPolicy, e: &mut Errors) -> Policy {
    let tick = *raw.daemon.tick.get_ref();
    if tick.0 < 10_000_000 || tick.0 > 10_000_000_000 {
        e.at(raw.daemon.tick.span(), format!("tick {tick} must be between 10ms and 10s"));
    }
    let est = raw.estimator;
    let estimator = EstimatorConfig {
        baseline_window: est.baseline_window,
        window: est.window,
        ewma_half_life: est.ewma_half_life,
        peak_window: est.peak_window,
    };
    let h = raw.hysteresis;
    let hysteresis =
        Hysteresis { enter_after: h.enter_after, exit_after: h.exit_after, min_dwell: h.min_dwell };
    let bounds = check_bounds(&raw.bounds, e);
    if raw.links.is_empty() {
        e.at(0..0, "no [[link]]: a policy needs at least one link (name, interfaces, capacity)");
    }
    let mut links: Vec<Link> = Vec::new();
    for l in &raw.links {
        let span = l.span();
        let l = l.get_ref();
        if links.iter().any(|o| o.name == l.name) {
            e.at(span.clone(), format!("link name {:?} is used twice", l.name));
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
            }
            peers.push((p.name.clone(), nets));
        }
        links.push(Link {
            name: l.name.clone(),
            interfaces: l.interfaces.clone(),
            capacity_bps: l.capacity.0,
            peers,
        });
    }
    let states = check_states(&raw.states, &bounds, e);
    Policy { tick, estimator, hysteresis, bounds, links, states }
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
    if t.bdp_factor <= 0.0 {
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
    if i.k <= 0.0 {
        e.at(b.nccl_ib_timeout.span(), "nccl_ib_timeout k must be above 0");
    }
    let w = b.watchdog.get_ref();
    if w.min.0 < 1_000_000_000 || w.min > w.max {
        e.at(
            b.watchdog.span(),
            format!("watchdog bounds: min {} must be at least 1s and at most max {}", w.min, w.max),
        );
    }
    if w.rtt_multiple <= 0.0 {
        e.at(b.watchdog.span(), "watchdog rtt_multiple must be above 0");
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
    }
}

fn check_states(raw: &[Spanned<RawState>], b: &Bounds, e: &mut Errors) -> Vec<State> {
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
        let enter = s.enter.as_ref().map(|t| *t.get_ref()).unwrap_or_default();
        let enter_span = s.enter.as_ref().map_or(span.clone(), |t| t.span());
        if i == 0 && !enter.conditions().is_empty() {
            e.at(enter_span.clone(), format!("state {name:?} is the first (healthiest) state: it has no enter thresholds; remove them or put a healthier state first"));
        }
        if i > 0 && enter.conditions().is_empty() {
            e.at(enter_span.clone(), format!("state {name:?} needs enter thresholds (any of rtt_inflation, rtt_p99, jitter, ce_fraction, retrans, cnp_rate, goodput_below)"));
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
        if k.dscp > 63 {
            e.at(kspan.clone(), format!("state {name:?}: dscp {} must be 0..=63", k.dscp));
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
        if let Setting::Fixed(c) = k.chunk {
            if c.0 < b.chunk_min || c.0 > b.chunk_max {
                e.at(
                    kspan.clone(),
                    format!(
                        "state {name:?}: chunk {c} lies outside the bounds {}..={}",
                        Bytes(b.chunk_min),
                        Bytes(b.chunk_max)
                    ),
                );
            }
        }
        if let Setting::Fixed(t) = k.nccl_ib_timeout {
            if t < b.ib_timeout_min || t > b.ib_timeout_max {
                e.at(
                    kspan.clone(),
                    format!(
                        "state {name:?}: nccl_ib_timeout {t} lies outside the bounds {}..={}",
                        b.ib_timeout_min, b.ib_timeout_max
                    ),
                );
            }
        }
        if let Setting::Fixed(w) = k.watchdog {
            let s = secs(w);
            if s < b.watchdog_min_s || s > b.watchdog_max_s {
                e.at(
                    kspan.clone(),
                    format!(
                        "state {name:?}: watchdog {}s lies outside the bounds {}s..={}s",
                        s, b.watchdog_min_s, b.watchdog_max_s
                    ),
                );
            }
        }
        if let Setting::Fixed(t) = k.tcp_buffers {
            if t.0 < b.buffers_min || t.0 > b.buffers_max {
                e.at(
                    kspan.clone(),
                    format!(
                        "state {name:?}: tcp_buffers {t} lies outside the bounds {}..={}",
                        Bytes(b.buffers_min),
                        Bytes(b.buffers_max)
                    ),
                );
            }
        }
        if let Some(prev) = states.last() {
            if k.compression.ratio() > prev.knobs.compression.ratio() {
                e.at(kspan.clone(), format!("state {name:?}: compression {} is lighter than {} in the healthier state {:?}; compression may only get stronger as states worsen", k.compression, prev.knobs.compression, prev.name));
            }
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
                dscp: k.dscp,
                roce_traffic_class: k.roce_traffic_class,
                tcp_buffers: map_setting(k.tcp_buffers, |b| b.0),
            },
        });
    }
    states
}

fn map_setting<T, U>(s: Setting<T>, f: impl FnOnce(T) -> U) -> Setting<U> {
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
    take!(rtt_inflation, rtt_p99, jitter, ce_fraction, retrans, cnp_rate, goodput_below);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_policies_parse() {
        for (name, src) in SHIPPED {
            let p = Policy::parse(src, name).unwrap_or_else(|e| panic!("{name}:\n{e}"));
            assert!(!p.links.is_empty() && !p.states.is_empty(), "{name}");
        }
        let hk = Policy::parse(SHIPPED[1].1, "hk-us").unwrap();
        let healthy = &hk.states[0].knobs;
        assert_eq!(healthy.chunk, Setting::Fixed(8 << 20));
        assert_eq!(
            (healthy.roce_traffic_class, healthy.nccl_ib_timeout),
            (106, Setting::Fixed(22))
        );
        assert_eq!(hk.states[1].knobs.compression, Compression::Int8);
        let fixed = Policy::parse(SHIPPED[2].1, "static").unwrap();
        assert_eq!(fixed.states.len(), 1);
        assert_eq!(fixed.states[0].knobs.compression, Compression::Int8);
    }

    /// The errors of `src` appended to a minimal valid policy, as printed.
    fn errors(extra_states: &str) -> String {
        let src = format!(
            "[[link]]\nname = \"wan\"\ninterfaces = [\"eth0\"]\ncapacity = \"10Gbit/s\"\n\n\
             [[state]]\nname = \"healthy\"\n[state.knobs]\ncompression = \"none\"\ndscp = 26\n\
             roce_traffic_class = 106\n{extra_states}"
        );
        match Policy::parse(&src, "p.toml") {
            Ok(_) => "OK".into(),
            Err(e) => e.to_string(),
        }
    }

    fn congested(enter: &str, exit: &str, compression: &str) -> String {
        format!(
            "\n[[state]]\nname = \"congested\"\nenter = {{ {enter} }}\n{exit}[state.knobs]\n\
             compression = \"{compression}\"\ndscp = 26\nroce_traffic_class = 106\n"
        )
    }

    #[test]
    fn golden_errors() {
        let cases = [
            (congested("ce_fraction = \"1%\"", "", "int8"), "OK"),
            (
                "\n[[state]]\nname = \"x\"\nbogus = 1\n".to_owned(),
                "p.toml:15:1: unknown field `bogus`, expected one of `name`, `enter`, `exit`, `knobs`",
            ),
            (
                congested("ce_fraction = \"1 percent\"", "", "int8"),
                "p.toml:15:25: invalid percentage \"1 percent\": expected a number followed by % (e.g. \"0.5%\")",
            ),
            (
                congested("ce_fraction = \"1%\"", "exit = { ce_fraction = \"2%\" }\n", "int8"),
                "p.toml:16:8: state \"congested\": exit ce_fraction 2% must be at or below its enter threshold 1%, or the state could never be left",
            ),
            (
                congested("ce_fraction = \"1%\"", "", "none")
                    + &congested("ce_fraction = \"1%\"", "", "int8").replace("congested", "worse"),
                "p.toml:23:9: state \"worse\": ce_fraction 1% overlaps state \"congested\" (1%); states are ordered healthiest first, so its threshold must be higher",
            ),
            (
                congested("ce_fraction = \"1%\"", "", "int8")
                    + &congested("ce_fraction = \"5%\"", "", "fp16").replace("congested", "worse"),
                "p.toml:24:1: state \"worse\": compression fp16 is lighter than int8 in the healthier state \"congested\"; compression may only get stronger as states worsen",
            ),
            (
                congested("", "", "int8"),
                "p.toml:15:9: state \"congested\" needs enter thresholds (any of rtt_inflation, rtt_p99, jitter, ce_fraction, retrans, cnp_rate, goodput_below)",
            ),
            (
                "[bounds]\nchunk = { min = \"8MiB\", max = \"4MiB\", initial = \"4MiB\" }\n".to_owned(),
                "p.toml:13:9: chunk bounds: min 8MiB must be above 0 and at most max 4MiB\np.toml:13:9: chunk initial 4MiB must lie within min 8MiB and max 4MiB",
            ),
        ];
        for (extra, want) in cases {
            assert_eq!(errors(&extra), want, "for:\n{extra}");
        }
    }
}
