//! Policy files as written: the TOML schema, with defaults, spans for error locations and the
//! human units. `check.rs` turns it into a [`super::Policy`].

use std::collections::BTreeMap;

use linkpilot_common::units::{BitRate, Bytes, Fraction, Nanos, PerSecond, Percent};
use serde::Deserialize;
use toml::Spanned;

use crate::control::knobs::Compression;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPolicy {
    #[serde(default)]
    pub(super) daemon: RawDaemon,
    #[serde(default = "d_estimator")]
    pub(super) estimator: Spanned<RawEstimator>,
    #[serde(default)]
    pub(super) hysteresis: RawHysteresis,
    #[serde(default)]
    pub(super) bounds: RawBounds,
    #[serde(rename = "link", default)]
    pub(super) links: Vec<Spanned<RawLink>>,
    #[serde(rename = "state", default)]
    pub(super) states: Vec<Spanned<RawState>>,
    #[serde(default = "d_nccl")]
    pub(super) nccl: Spanned<RawNccl>,
    #[serde(default)]
    pub(super) host: RawHost,
    #[serde(default = "d_outcome")]
    pub(super) outcome: Spanned<RawOutcome>,
    /// Init-time variables the env file carries as they are.
    #[serde(default)]
    pub(super) env: BTreeMap<Spanned<String>, Spanned<String>>,
}

/// `[host]`: host sysctls the policy fixes while it runs (restored afterwards).
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHost {
    /// net.ipv4.tcp_ecn. Each key left out, or "keep": the host's value, never written.
    pub(super) tcp_ecn: Option<Spanned<Keep<i64>>>,
    /// net.core.netdev_max_backlog.
    pub(super) netdev_max_backlog: Option<Spanned<Keep<i64>>>,
    /// net.ipv4.tcp_slow_start_after_idle.
    pub(super) tcp_slow_start_after_idle: Option<Spanned<Keep<i64>>>,
}

pub(super) fn d_nccl() -> Spanned<RawNccl> {
    unspanned(RawNccl::default())
}

/// `[nccl]`: what the NCCL tuner plugin asks NCCL for, per state. States not listed under
/// `[nccl.state.NAME]` take the rule written in `[nccl]` itself, or, where it writes none, the
/// built-in one: NCCL's own choice on the healthiest state, the Simple protocol on worse ones.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawNccl {
    /// Collectives below this size keep NCCL's own choices.
    pub(super) min_bytes: Bytes,
    /// The rule of states not listed under `state` (all three unset: the built-in one).
    pub(super) algo: Option<String>,
    pub(super) proto: Option<String>,
    pub(super) max_channels: Option<u8>,
    pub(super) state: BTreeMap<String, Spanned<RawNcclRule>>,
}

impl Default for RawNccl {
    fn default() -> Self {
        Self {
            min_bytes: Bytes(1 << 20),
            algo: None,
            proto: None,
            max_channels: None,
            state: BTreeMap::new(),
        }
    }
}

#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNcclRule {
    /// "auto" (NCCL's choice), "tree", "ring", ... (NCCL's names, lower case).
    pub(super) algo: Option<String>,
    /// "auto", "ll", "ll128", "simple".
    pub(super) proto: Option<String>,
    /// At most this many channels (0: NCCL's count).
    pub(super) max_channels: Option<u8>,
}

pub(super) fn d_outcome() -> Spanned<RawOutcome> {
    unspanned(RawOutcome::default())
}

/// `[outcome]`: how a state change is judged by the jobs' progress (`control::outcome`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawOutcome {
    pub(super) judge: bool,
    pub(super) window: Nanos,
    pub(super) settle: Nanos,
    pub(super) slower_by: Fraction,
    pub(super) min_steps: u32,
    pub(super) hold: Nanos,
    pub(super) hold_max: Nanos,
    pub(super) steps_to_loss: BTreeMap<String, f64>,
}

impl Default for RawOutcome {
    fn default() -> Self {
        Self {
            judge: true,
            window: Nanos(30_000_000_000),
            settle: Nanos(5_000_000_000),
            slower_by: Fraction(0.1),
            min_steps: 3,
            hold: Nanos(60_000_000_000),
            hold_max: Nanos(3_600_000_000_000),
            steps_to_loss: BTreeMap::new(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDaemon {
    #[serde(default = "d_tick")]
    pub(super) tick: Spanned<Nanos>,
    /// Also act in the reporting jobs' own network namespaces (pods).
    #[serde(default)]
    pub(super) job_namespaces: bool,
}

pub(super) fn d_tick() -> Spanned<Nanos> {
    unspanned(Nanos(100_000_000))
}

pub(super) fn d_estimator() -> Spanned<RawEstimator> {
    unspanned(RawEstimator::default())
}

/// A default value: errors about it point at the start of the file.
pub(super) fn unspanned<T>(v: T) -> Spanned<T> {
    Spanned::new(0..0, v)
}

impl Default for RawDaemon {
    fn default() -> Self {
        Self { tick: d_tick(), job_namespaces: false }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawEstimator {
    /// Windowed-min RTT baseline, BBR-style.
    pub(super) baseline_window: Nanos,
    /// Maxima (delivery rate) over this window; the daemon sizes the sensors' RTT percentile
    /// window from it too (replays take the percentiles recorded in the trace).
    pub(super) window: Nanos,
    /// Half-life of the EWMAs of CE fraction, retransmissions, CNPs, goodput, RTT.
    pub(super) ewma_half_life: Nanos,
    /// Peak RTT p99 the watchdog is sized from, over this (long) window.
    pub(super) peak_window: Nanos,
    /// Packet rate below which CE and retransmitted shares count as unmeasured: a handful of
    /// packets (a connection's handshake) says nothing about the path.
    pub(super) min_packet_rate: PerSecond,
}

impl Default for RawEstimator {
    fn default() -> Self {
        Self {
            baseline_window: Nanos(10_000_000_000),
            window: Nanos(10_000_000_000),
            ewma_half_life: Nanos(500_000_000),
            peak_window: Nanos(600_000_000_000),
            min_packet_rate: PerSecond(100.0),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawHysteresis {
    pub(super) enter_after: Nanos,
    pub(super) exit_after: Nanos,
    pub(super) min_dwell: Nanos,
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
pub(super) struct RawBounds {
    pub(super) chunk: Spanned<RawChunkBounds>,
    pub(super) tcp_buffers: Spanned<RawBufferBounds>,
    pub(super) nccl_ib_timeout: Spanned<RawIbTimeout>,
    pub(super) watchdog: Spanned<RawWatchdog>,
    pub(super) sync_every: Spanned<RawSyncBounds>,
    pub(super) compression: Spanned<RawCodecBounds>,
}

impl Default for RawBounds {
    fn default() -> Self {
        Self {
            chunk: unspanned(RawChunkBounds::default()),
            tcp_buffers: unspanned(RawBufferBounds::default()),
            nccl_ib_timeout: unspanned(RawIbTimeout::default()),
            watchdog: unspanned(RawWatchdog::default()),
            sync_every: unspanned(RawSyncBounds::default()),
            compression: unspanned(RawCodecBounds::default()),
        }
    }
}

/// `[bounds] sync_every`: what "auto" may choose, how much of an exchange's time it keeps to
/// spare, and how far a site may run ahead without a sync (an outage) before it waits.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawSyncBounds {
    pub(super) min: u32,
    pub(super) max: u32,
    pub(super) margin: Percent,
    pub(super) max_drift: u32,
}

impl Default for RawSyncBounds {
    fn default() -> Self {
        Self { min: 1, max: 500, margin: Percent(0.2), max_drift: 2000 }
    }
}

/// `[bounds] compression`: the codecs `compression = "auto"` chooses among, the share of the
/// compute time an exchange keeps to spare, and the round trips an exchange waits besides its
/// bytes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawCodecBounds {
    pub(super) weakest: Compression,
    pub(super) strongest: Compression,
    pub(super) margin: Percent,
    pub(super) latency_rtts: f64,
}

impl Default for RawCodecBounds {
    fn default() -> Self {
        Self {
            weakest: Compression::None,
            strongest: Compression::Int4,
            margin: Percent(0.25),
            latency_rtts: 1.0,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawChunkBounds {
    pub(super) min: Bytes,
    pub(super) max: Bytes,
    /// Value until the first RTT measurement.
    pub(super) initial: Bytes,
    /// Chunks in flight across the link (channels x pipeline steps): chunk = BDP / in_flight.
    pub(super) in_flight: u32,
    /// Largest factor between two consecutive values.
    pub(super) max_step: f64,
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
pub(super) struct RawBufferBounds {
    pub(super) min: Bytes,
    pub(super) max: Bytes,
    /// Buffer = bdp_factor x capacity x RTT p99.
    pub(super) bdp_factor: f64,
    pub(super) max_step: f64,
}

impl Default for RawBufferBounds {
    fn default() -> Self {
        Self { min: Bytes(4 << 20), max: Bytes(1 << 30), bdp_factor: 2.0, max_step: 4.0 }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawIbTimeout {
    /// NCCL_IB_TIMEOUT: smallest t with 4.096 us x 2^t >= k x RTT p99.
    pub(super) k: f64,
    pub(super) min: u8,
    pub(super) max: u8,
}

impl Default for RawIbTimeout {
    fn default() -> Self {
        Self { k: 4.0, min: 14, max: 24 }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawWatchdog {
    pub(super) min: Nanos,
    pub(super) max: Nanos,
    /// Watchdog = rtt_multiple x peak RTT p99 (a collective waits on many round trips).
    pub(super) rtt_multiple: f64,
    /// Largest factor of one decrease (increases are immediate: a spike must not kill a job).
    pub(super) max_step: f64,
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
pub(super) struct RawLink {
    pub(super) name: String,
    pub(super) interfaces: Vec<String>,
    #[serde(default = "auto")]
    pub(super) capacity: Setting<BitRate>,
    #[serde(rename = "peer", default)]
    pub(super) peers: Vec<RawPeer>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPeer {
    pub(super) name: String,
    pub(super) cidrs: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawState {
    pub(super) name: Spanned<String>,
    pub(super) enter: Option<Spanned<Thresholds>>,
    pub(super) exit: Option<Spanned<Thresholds>>,
    pub(super) knobs: Spanned<RawKnobs>,
    /// What the sock_ops program gives the link's peers' TCP connections in this state.
    pub(super) transport: Option<Spanned<RawTransport>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTransport {
    pub(super) congestion_control: Option<Spanned<String>>,
    pub(super) initial_cwnd: Option<u32>,
    pub(super) initial_rwnd: Option<u32>,
    pub(super) sndcwnd_clamp: Option<u32>,
    /// "auto": the state's tcp_buffers.
    pub(super) socket_buffers: Option<Setting<Bytes>>,
    #[serde(default)]
    pub(super) ecn: bool,
}

/// Thresholds on the link's signals; `None` is "not a condition".
#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Thresholds {
    /// RTT over its windowed-min baseline, as a share of the baseline.
    pub rtt_inflation: Option<Percent>,
    /// The same from the RTT samples that show others' queue: the flows of jobs reporting on
    /// this host count only with the first sample of each burst, so their own queue does not.
    pub cross_rtt_inflation: Option<Percent>,
    pub rtt_p99: Option<Nanos>,
    /// RTT p99 minus p50 over the window.
    pub jitter: Option<Nanos>,
    pub ce_fraction: Option<Fraction>,
    /// `ce_fraction` without the marks on the flows of jobs reporting on this host: their own
    /// bursts' queue does not count.
    pub cross_ce_fraction: Option<Fraction>,
    /// Retransmitted segments per segment sent.
    pub retrans: Option<Fraction>,
    /// RoCE CNPs per second (TC-seen and NIC-handled).
    pub cnp_rate: Option<PerSecond>,
    /// Goodput below this share of the link's capacity (while the link carries traffic).
    pub goodput_below: Option<Fraction>,
    /// Nothing received for this long since the link retransmitted: a dead link or peer.
    pub unanswered: Option<Nanos>,
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
pub(super) struct RawKnobs {
    /// Omitted: "none", the gradients as the job sends them; "auto": chosen from the jobs'
    /// compute time and payload and the link's rate and RTT, within `[bounds] compression`.
    #[serde(default = "d_compression")]
    pub(super) compression: Setting<Compression>,
    #[serde(default = "auto")]
    pub(super) chunk: Setting<Bytes>,
    #[serde(default = "auto")]
    pub(super) nccl_ib_timeout: Setting<u8>,
    #[serde(default = "d_retry")]
    pub(super) nccl_ib_retry_cnt: u8,
    #[serde(default = "auto")]
    pub(super) watchdog: Setting<Nanos>,
    /// Omitted or "keep": the daemon never rewrites the link's DSCP.
    #[serde(default)]
    pub(super) dscp: Keep<u8>,
    /// Omitted or "keep": the daemon never sets the ports' RoCE class nor NCCL_IB_TC.
    #[serde(default)]
    pub(super) roce_traffic_class: Keep<u8>,
    /// Omitted: "auto"; "keep": the host's socket buffer maxima are never written.
    #[serde(default = "auto_kept")]
    pub(super) tcp_buffers: Keep<Setting<Bytes>>,
    /// Inner steps per cross-site round (1: the per-step exchange), or "auto".
    #[serde(default = "d_sync_every")]
    pub(super) sync_every: Setting<u32>,
    /// The pseudo-gradients' codec, or "auto": chosen with H by the training side.
    #[serde(default = "d_outer_codec")]
    pub(super) outer_codec: Setting<Compression>,
    #[serde(default = "d_one")]
    pub(super) fragments: u16,
    #[serde(default)]
    pub(super) overlap: u16,
}

/// A knob a site may leave alone: a value, or "keep" (None).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Keep<T>(pub(super) Option<T>);

impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for Keep<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = toml::Value::deserialize(d)?;
        if v.as_str() == Some("keep") {
            return Ok(Keep(None));
        }
        T::deserialize(v)
            .map(|t| Keep(Some(t)))
            .map_err(|e| serde::de::Error::custom(format!("{}, or \"keep\"", e.message().trim())))
    }
}

pub(super) fn d_sync_every() -> Setting<u32> {
    Setting::Fixed(1)
}

pub(super) fn d_compression() -> Setting<Compression> {
    Setting::Fixed(Compression::None)
}

pub(super) fn d_outer_codec() -> Setting<Compression> {
    Setting::Fixed(Compression::Int8)
}

pub(super) fn d_one() -> u16 {
    1
}

pub(super) fn auto<T>() -> Setting<T> {
    Setting::Auto
}

pub(super) fn auto_kept<T>() -> Keep<Setting<T>> {
    Keep(Some(Setting::Auto))
}

pub(super) fn d_retry() -> u8 {
    7
}
