//! Policy files as written: the TOML schema, with defaults, spans for error locations and the
//! human units. `check.rs` turns it into a [`super::Policy`]. The `[bounds]` tables and the
//! value syntaxes ("auto", "keep", thresholds) have files of their own.

use std::collections::BTreeMap;

use linkpilot_common::units::{BitRate, Bytes, Fraction, Nanos, PerSecond};
use serde::Deserialize;
use toml::Spanned;

use crate::control::knobs::Compression;

/// A TOML table whose every key may be left out: the struct, with each field's default beside
/// it (`name: Type = default`), and the `Default` that serde fills the missing keys from.
macro_rules! section {
    (
        $(#[$attr:meta])*
        $name:ident {
            $($(#[$field_attr:meta])* $field:ident: $ty:ty = $default:expr,)*
        }
    ) => {
        $(#[$attr])*
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub(in crate::control::policy) struct $name {
            $($(#[$field_attr])* pub(in crate::control::policy) $field: $ty,)*
        }

        impl Default for $name {
            fn default() -> Self {
                Self { $($field: $default,)* }
            }
        }
    };
}

mod bounds;
mod values;

pub(super) use bounds::RawBounds;
pub(super) use values::Keep;
pub use values::{Setting, Thresholds};

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

section! {
    /// `[nccl]`: what the NCCL tuner plugin asks NCCL for, per state. States not listed under
    /// `[nccl.state.NAME]` take the rule written in `[nccl]` itself, or, where it writes none,
    /// the built-in one: NCCL's own choice on the healthiest state, the Simple protocol on worse
    /// ones.
    RawNccl {
        /// Collectives below this size keep NCCL's own choices.
        min_bytes: Bytes = Bytes(1 << 20),
        /// The rule of states not listed under `state` (all three unset: the built-in one).
        algo: Option<String> = None,
        proto: Option<String> = None,
        max_channels: Option<u8> = None,
        state: BTreeMap<String, Spanned<RawNcclRule>> = BTreeMap::new(),
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

section! {
    /// `[outcome]`: how a state change is judged by the jobs' progress (`control::outcome`).
    RawOutcome {
        judge: bool = true,
        window: Nanos = Nanos(30_000_000_000),
        settle: Nanos = Nanos(5_000_000_000),
        slower_by: Fraction = Fraction(0.1),
        min_steps: u32 = 3,
        hold: Nanos = Nanos(60_000_000_000),
        hold_max: Nanos = Nanos(3_600_000_000_000),
        steps_to_loss: BTreeMap<String, f64> = BTreeMap::new(),
    }
}

section! {
    /// `[daemon]`.
    RawDaemon {
        tick: Spanned<Nanos> = unspanned(Nanos(100_000_000)),
        /// Also act in the reporting jobs' own network namespaces (pods).
        job_namespaces: bool = false,
    }
}

pub(super) fn d_estimator() -> Spanned<RawEstimator> {
    unspanned(RawEstimator::default())
}

/// A default value: errors about it point at the start of the file.
pub(super) fn unspanned<T>(v: T) -> Spanned<T> {
    Spanned::new(0..0, v)
}

section! {
    /// `[estimator]`.
    RawEstimator {
        /// Windowed-min RTT baseline, BBR-style.
        baseline_window: Nanos = Nanos(10_000_000_000),
        /// Maxima (delivery rate) over this window; the daemon sizes the sensors' RTT percentile
        /// window from it too (replays take the percentiles recorded in the trace).
        window: Nanos = Nanos(10_000_000_000),
        /// Half-life of the EWMAs of CE fraction, retransmissions, CNPs, goodput, RTT.
        ewma_half_life: Nanos = Nanos(500_000_000),
        /// Peak RTT p99 the watchdog is sized from, over this (long) window.
        peak_window: Nanos = Nanos(600_000_000_000),
        /// Packet rate below which CE and retransmitted shares count as unmeasured: a handful
        /// of packets (a connection's handshake) says nothing about the path.
        min_packet_rate: PerSecond = PerSecond(100.0),
    }
}

section! {
    /// `[hysteresis]`.
    RawHysteresis {
        enter_after: Nanos = Nanos(300_000_000),
        exit_after: Nanos = Nanos(10_000_000_000),
        min_dwell: Nanos = Nanos(2_000_000_000),
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

section! {
    /// `[state.knobs]`.
    RawKnobs {
        /// Omitted: "none", the gradients as the job sends them; "auto": chosen from the jobs'
        /// compute time and payload and the link's rate and RTT, within `[bounds] compression`.
        compression: Setting<Compression> = Setting::Fixed(Compression::None),
        chunk: Setting<Bytes> = Setting::Auto,
        nccl_ib_timeout: Setting<u8> = Setting::Auto,
        nccl_ib_retry_cnt: u8 = 7,
        watchdog: Setting<Nanos> = Setting::Auto,
        /// Omitted or "keep": the daemon never rewrites the link's DSCP.
        dscp: Keep<u8> = Keep(None),
        /// Omitted or "keep": the daemon never sets the ports' RoCE class nor NCCL_IB_TC.
        roce_traffic_class: Keep<u8> = Keep(None),
        /// Omitted: "auto"; "keep": the host's socket buffer maxima are never written.
        tcp_buffers: Keep<Setting<Bytes>> = Keep(Some(Setting::Auto)),
        /// Inner steps per cross-site round (1: the per-step exchange), or "auto".
        sync_every: Setting<u32> = Setting::Fixed(1),
        /// The pseudo-gradients' codec, or "auto": chosen with H by the training side.
        outer_codec: Setting<Compression> = Setting::Fixed(Compression::Int8),
        fragments: u16 = 1,
        overlap: u16 = 0,
    }
}

pub(super) fn auto<T>() -> Setting<T> {
    Setting::Auto
}
