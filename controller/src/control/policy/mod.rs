//! Policy files: links, estimator windows, the ladder of link states with their thresholds and
//! knobs, hysteresis, and knob bounds. A policy is parsed and checked whole: any error (named by
//! file, line and column, saying what would be valid) means no policy at all.

use std::{collections::BTreeMap, fmt, ops::Range};

use ipnet::IpNet;
use linkpilot_common::{
    config_error::ConfigError,
    units::{Fraction, Nanos, PerSecond, Percent},
};

use super::knobs::Compression;

pub mod builder;
mod check;
mod file;
pub mod init;
mod queues;
mod sections;

#[cfg(test)]
mod tests;

use file::RawPolicy;
pub use file::{Setting, Thresholds};

/// Where policies live unless told otherwise.
pub const DEFAULT_PATH: &str = "/etc/linkpilot/policy.toml";

/// The policies shipped in `policies/`, by name.
pub const SHIPPED: &[(&str, &str)] = &[
    ("default", include_str!("../../../../policies/default.toml")),
    ("hk-us", include_str!("../../../../policies/hk-us.toml")),
    ("static-handtuned", include_str!("../../../../policies/static-handtuned.toml")),
    ("static-bbr", include_str!("../../../../policies/static-bbr.toml")),
];

/// A policy that cannot be used, with where the problem is.
pub type PolicyError = ConfigError;

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

/// A checked policy.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    pub tick: Nanos,
    /// Whether the reporting jobs' own network namespaces (pods without the host's network)
    /// get the transport profile and have their flows counted as the jobs'.
    pub job_namespaces: bool,
    pub estimator: EstimatorConfig,
    pub hysteresis: Hysteresis,
    pub bounds: Bounds,
    pub links: Vec<Link>,
    /// The ladder, healthiest first.
    pub states: Vec<State>,
    /// What the NCCL tuner plugin asks NCCL for.
    pub nccl: Nccl,
    /// Host sysctls fixed while the policy runs.
    pub host: Host,
    /// Init-time variables the env file carries as written, after the computed ones.
    pub env: BTreeMap<String, String>,
    /// How state changes are judged by the jobs' progress.
    pub outcome: Outcome,
    /// Each congestion control a state names, with where (checked against the host's
    /// algorithms by [`Policy::check_algorithms`], not by parsing: a replay may run elsewhere).
    pub congestion_controls: Vec<(crate::control::transport::CcName, PolicyError)>,
}

impl Policy {
    /// Whether any state has a `[state.transport]` (the sock_ops program is needed).
    pub fn has_transport(&self) -> bool {
        self.states.iter().any(|s| s.knobs.transport.is_some())
    }

    /// Every congestion control the policy names that `available` lacks, with its place.
    pub fn check_algorithms(&self, available: &[String]) -> Result<(), PolicyErrors> {
        let errors: Vec<PolicyError> = self
            .congestion_controls
            .iter()
            .filter(|(cc, _)| !available.iter().any(|a| a == cc.as_str()))
            .map(|(cc, at)| PolicyError {
                message: format!(
                    "{}: congestion control {:?} is not available on this host (it offers: \
                     {}; a module such as tcp_{cc} may add it)",
                    at.message,
                    cc.as_str(),
                    available.join(" ")
                ),
                ..at.clone()
            })
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(PolicyErrors(errors))
        }
    }
}

/// The `[outcome]` section, checked: after a state change that moved knobs, the jobs'
/// progress over `window` before it and `window` after `settle` decides whether it stays.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub judge: bool,
    pub window: Nanos,
    pub settle: Nanos,
    /// A change is reverted when progress fell by more than this share.
    pub slower_by: f64,
    /// Steps (all of the link's jobs' processes together) each window needs to be judged.
    pub min_steps: u32,
    /// The first hold-off of a reverted change; each revert of it again doubles it.
    pub hold: Nanos,
    pub hold_max: Nanos,
    /// Steps a codec needs to reach the same loss as uncompressed, relative (1 when unnamed),
    /// by codec mode ("int8", "topk").
    pub steps_to_loss: BTreeMap<String, f64>,
}

impl Outcome {
    /// The steps-to-loss factor of a codec as a job reports it ("topk:0.01" is mode "topk").
    pub fn factor(&self, codec: &str) -> f64 {
        let mode = codec.split(':').next().unwrap_or(codec);
        self.steps_to_loss.get(mode).copied().unwrap_or(1.0)
    }
}

/// The `[host]` section, checked: host sysctls (single integers) the policy fixes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Host {
    /// net.ipv4.tcp_ecn: 0 off, 1 request and accept ECN, 2 accept only (the kernel's default).
    pub tcp_ecn: Option<u8>,
    /// net.core.netdev_max_backlog: packets queued per CPU before the stack takes them.
    pub netdev_max_backlog: Option<u32>,
    /// net.ipv4.tcp_slow_start_after_idle: 1 (the kernel's default) restarts a connection's
    /// window from the initial one after an idle RTO, which an exchange after a compute gap
    /// pays in round trips; 0 keeps the window.
    pub tcp_slow_start_after_idle: Option<u8>,
}

/// The `[nccl]` section, checked: published on the knob board for the tuner plugin.
#[derive(Clone, Debug, PartialEq)]
pub struct Nccl {
    /// Collectives below this many bytes keep NCCL's own choices (0 or a power of two).
    pub min_bytes: u64,
    /// One rule per state, in ladder order.
    pub rules: Vec<NcclRule>,
}

/// What the plugin asks NCCL for in one state. Codes are NCCL's (`board::nccl`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NcclRule {
    /// Preferred algorithm (`None`: NCCL's choice).
    pub algo: Option<u8>,
    /// Preferred protocol (`None`: NCCL's choice).
    pub proto: Option<u8>,
    /// At most this many channels (0: NCCL's count).
    pub max_channels: u8,
}

impl Nccl {
    /// The rule of state `i` of the ladder (NCCL's own choice for an index past the ladder).
    pub fn rule(&self, state: usize) -> NcclRule {
        self.rules.get(state).copied().unwrap_or_default()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EstimatorConfig {
    pub baseline_window: Nanos,
    pub window: Nanos,
    pub ewma_half_life: Nanos,
    pub peak_window: Nanos,
    /// Packets per second below which shares (CE, retransmitted) are unmeasured.
    pub min_packet_rate: f64,
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
    /// What "auto" sync_every may choose, the share of an exchange kept to spare, and the
    /// inner steps a site may run without a sync.
    pub sync_min: u32,
    pub sync_max: u32,
    pub sync_margin: f64,
    pub max_drift: u32,
    /// What `compression = "auto"` may choose (weakest and strongest), the share of the
    /// compute time an exchange keeps to spare, and the round trips it waits besides its bytes.
    pub codec_weakest: Compression,
    pub codec_strongest: Compression,
    pub codec_margin: f64,
    pub codec_latency_rtts: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Link {
    pub name: String,
    pub interfaces: Vec<String>,
    /// The nominal capacity; None: "auto", the BDP-derived knobs follow the measured rate.
    pub capacity_bps: Option<f64>,
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
    pub compression: Setting<Compression>,
    pub chunk: Setting<u64>,
    pub nccl_ib_timeout: Setting<u8>,
    pub nccl_ib_retry_cnt: u8,
    pub watchdog_s: Setting<u32>,
    /// None: "keep", never touched (the same in every state of the ladder).
    pub dscp: Option<u8>,
    pub roce_traffic_class: Option<u8>,
    /// None: "keep", the host's socket buffer maxima never written (the same in every state).
    pub tcp_buffers: Option<Setting<u64>>,
    pub sync_every: Setting<u32>,
    pub outer_compression: Setting<Compression>,
    pub fragments: u16,
    pub overlap: u16,
    /// `[state.transport]`, if the state has one.
    pub transport: Option<StateTransport>,
}

/// `[state.transport]`, checked; socket buffers may follow the state's `tcp_buffers`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StateTransport {
    pub congestion_control: Option<crate::control::transport::CcName>,
    pub initial_cwnd: u32,
    pub initial_rwnd: u32,
    pub sndcwnd_clamp: u32,
    /// None: the kernel's autotuning; Auto: the state's `tcp_buffers`.
    pub socket_buffers: Option<Setting<u64>>,
    pub ecn: bool,
}

pub(super) struct Errors<'a> {
    file: &'a str,
    src: &'a str,
    list: Vec<PolicyError>,
}

impl Errors<'_> {
    pub(super) fn at(&mut self, span: Range<usize>, message: impl Into<String>) {
        let error = self.error_at(span, message);
        self.list.push(error);
    }

    /// An error at `span`, not recorded (for a check made later, elsewhere).
    pub(super) fn error_at(&self, span: Range<usize>, message: impl Into<String>) -> PolicyError {
        ConfigError::at(self.file, self.src, span.start, message)
    }
}

/// The signals a threshold can name, with how to compare them: `true` if higher is worse.
const SIGNALS: [(&str, bool); 11] = [
    ("rtt_inflation", true),
    ("cross_rtt_inflation", true),
    ("rtt_p99", true),
    ("jitter", true),
    ("cross_jitter", true),
    ("ce_fraction", true),
    ("cross_ce_fraction", true),
    ("retrans", true),
    ("cnp_rate", true),
    ("goodput_below", false),
    ("unanswered", true),
];

/// How a threshold is written back in reasons and errors.
#[derive(Clone, Copy)]
enum Written {
    /// "1%", of a share of at most 1.
    Fraction,
    /// "150%", of a ratio that may exceed 1.
    Percent,
    /// "1000/s".
    Rate,
    /// "400ms" (a duration, held in ms).
    Ms,
}

impl Thresholds {
    /// (signal name, threshold in the units the signals use, how it is written) of every
    /// signal, set or not: the one list both views below read.
    fn each(&self) -> [(&'static str, Option<f64>, Written); 11] {
        let ms = |n: Option<Nanos>| n.map(|x| x.0 as f64 / 1e6);
        [
            ("rtt_inflation", self.rtt_inflation.map(|x| x.0), Written::Percent),
            ("cross_rtt_inflation", self.cross_rtt_inflation.map(|x| x.0), Written::Percent),
            ("rtt_p99", ms(self.rtt_p99), Written::Ms),
            ("jitter", ms(self.jitter), Written::Ms),
            ("cross_jitter", ms(self.cross_jitter), Written::Ms),
            ("ce_fraction", self.ce_fraction.map(|x| x.0), Written::Fraction),
            ("cross_ce_fraction", self.cross_ce_fraction.map(|x| x.0), Written::Fraction),
            ("retrans", self.retrans.map(|x| x.0), Written::Fraction),
            ("cnp_rate", self.cnp_rate.map(|x| x.0), Written::Rate),
            ("goodput_below", self.goodput_below.map(|x| x.0), Written::Fraction),
            ("unanswered", ms(self.unanswered), Written::Ms),
        ]
    }

    /// (signal name, threshold in the units `conditions` uses) of each condition set, without
    /// allocating: the per-tick check.
    pub fn values(&self) -> impl Iterator<Item = (&'static str, f64)> {
        self.each().into_iter().filter_map(|(n, v, _)| Some((n, v?)))
    }

    /// (signal name, threshold as f64 in base units, as written) of each condition set.
    pub fn conditions(&self) -> Vec<(&'static str, f64, String)> {
        self.each()
            .into_iter()
            .filter_map(|(n, v, written)| {
                let v = v?;
                let text = match written {
                    Written::Fraction => Fraction(v).to_string(),
                    Written::Percent => Percent(v).to_string(),
                    Written::Rate => PerSecond(v).to_string(),
                    Written::Ms => format!("{v}ms"),
                };
                Some((n, v, text))
            })
            .collect()
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
        let policy = check::check(raw, &mut errs);
        if errs.list.is_empty() {
            Ok(policy)
        } else {
            Err(PolicyErrors(errs.list))
        }
    }

    /// Replaces the interface name `from` (e.g. `@default-route`) in every link by `to`.
    pub fn rename_interface(&mut self, from: &str, to: &str) {
        for l in &mut self.links {
            for i in &mut l.interfaces {
                if i == from {
                    *i = to.to_owned();
                }
            }
        }
    }

    /// Whether any link names its peers: a policy that names none is observed only, never
    /// applied (its DSCP would mark everything the interface sends).
    pub fn names_peers(&self) -> bool {
        self.links.iter().any(|l| !l.peers.is_empty())
    }

    /// Whether any link names the interface `name`.
    pub fn names_interface(&self, name: &str) -> bool {
        self.links.iter().any(|l| l.interfaces.iter().any(|i| i == name))
    }

    /// Reads and parses a policy file.
    pub fn load(path: &std::path::Path) -> Result<Policy, PolicyErrors> {
        Self::load_with_digest(path).map(|(p, _)| p)
    }

    /// Reads and parses a policy file, with the [`sha256_hex`] of the bytes it was parsed from.
    pub fn load_with_digest(path: &std::path::Path) -> Result<(Policy, String), PolicyErrors> {
        let file = path.display().to_string();
        let unreadable =
            |message: String| PolicyErrors(vec![ConfigError::unreadable(&file, message)]);
        let bytes =
            std::fs::read(path).map_err(|e| unreadable(format!("cannot read the policy: {e}")))?;
        let src = std::str::from_utf8(&bytes)
            .map_err(|e| unreadable(format!("the policy is not UTF-8 text: {e}")))?;
        Ok((Self::parse(src, &file)?, sha256_hex(&bytes)))
    }
}

/// The hex SHA-256 of a policy file's bytes, as `sha256sum` prints it: the version a node runs
/// (the daemon's metrics and status, `linkpilot policy check`).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    format!("{:x}", sha2::Sha256::digest(bytes))
}

pub(super) fn secs(n: Nanos) -> u32 {
    (n.0 / 1_000_000_000).min(u64::from(u32::MAX)) as u32
}
