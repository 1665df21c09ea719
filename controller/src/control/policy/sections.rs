//! The policy's `[host]`, `[env]`, `[nccl]`, `[outcome]` and `[state.transport]` sections,
//! checked: host sysctls within their ranges, NCCL variables the env file may carry, the tuner
//! plugin's rules per state, how decisions are judged, and each state's transport profile.

use std::collections::BTreeMap;

use linkpilot_common::board::nccl;
use toml::Spanned;

use super::{
    check::map_setting,
    file::{Keep, RawHost, RawNccl, RawOutcome, RawTransport, Setting},
    Bounds, Errors, Host, Nccl, NcclRule, Outcome, PolicyError, State, StateTransport,
};
use crate::control::env_names;
use crate::control::knobs::Compression;
use crate::control::transport::CcName;
use linkpilot_common::units::Bytes;

/// Each congestion control the states name, with where.
pub(super) type CcUses = Vec<(CcName, PolicyError)>;

pub(super) fn check_host(h: &RawHost, e: &mut Errors) -> Host {
    // "keep" is the key left out: never written.
    let set = |v: &Option<Spanned<Keep<i64>>>| {
        v.as_ref().and_then(|s| s.get_ref().0.map(|n| Spanned::new(s.span(), n)))
    };
    let (tcp_ecn, backlog, slow_start) =
        (set(&h.tcp_ecn), set(&h.netdev_max_backlog), set(&h.tcp_slow_start_after_idle));
    let tcp_ecn = host_int(tcp_ecn.as_ref(), 0..=2, e, |n| {
        format!(
            "host tcp_ecn {n} must be 0 (off), 1 (ask for and accept ECN) or 2 (accept when \
             asked, the kernel's default)"
        )
    });
    // The sysctl is a C int.
    let netdev_max_backlog = host_int(backlog.as_ref(), 1..=i64::from(i32::MAX), e, |n| {
        format!("host netdev_max_backlog {n} must be 1 to {} (a C int)", i32::MAX)
    });
    let tcp_slow_start_after_idle = host_int(slow_start.as_ref(), 0..=1, e, |n| {
        format!(
            "host tcp_slow_start_after_idle {n} must be 0 (keep the window after idle) or 1 \
             (restart it, the kernel's default)"
        )
    });
    Host {
        tcp_ecn: tcp_ecn.and_then(|n| u8::try_from(n).ok()),
        netdev_max_backlog: netdev_max_backlog.and_then(|n| u32::try_from(n).ok()),
        tcp_slow_start_after_idle: tcp_slow_start_after_idle.and_then(|n| u8::try_from(n).ok()),
    }
}

/// A `[host]` integer, with an error at its place when it is outside `range`.
fn host_int(
    v: Option<&Spanned<i64>>,
    range: std::ops::RangeInclusive<i64>,
    e: &mut Errors,
    why: impl Fn(i64) -> String,
) -> Option<i64> {
    let v = v?;
    let n = *v.get_ref();
    if !range.contains(&n) {
        e.at(v.span(), why(n));
    }
    Some(n)
}

/// Characters an `[env]` value may use: the env file is `KEY=value` lines that shells source
/// unquoted (`set -a; . FILE`) and parsers read as they are.
fn env_value_ok(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"_-.,:/=+@%^".contains(&b)
}

pub(super) fn check_env(
    raw: &BTreeMap<Spanned<String>, Spanned<String>>,
    e: &mut Errors,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for (key, value) in raw {
        let (k, v) = (key.get_ref(), value.get_ref());
        if !env_names::is_env_name(k) {
            e.at(
                key.span(),
                format!(
                    "env {k:?} is not an environment variable name (a letter or '_', then \
                     letters, digits and '_')"
                ),
            );
        } else if env_names::is_computed(k) {
            e.at(
                key.span(),
                format!(
                    "env {k}: linkpilot computes it (NCCL_IB_TIMEOUT, NCCL_IB_RETRY_CNT, NCCL_IB_TC, \
                     NCCL_BUFFSIZE, NCCL_TUNER_PLUGIN, TORCH_NCCL_ASYNC_ERROR_HANDLING, \
                     LINKPILOT_*): set it through the knobs, not [env]"
                ),
            );
        }
        if v.bytes().any(|b| matches!(b, b'\n' | b'\r' | 0)) {
            e.at(value.span(), format!("env {k}: value {v:?} must be one line without NUL"));
        } else if !v.bytes().all(env_value_ok) {
            e.at(
                value.span(),
                format!(
                    "env {k}: value {v:?} may only use letters, digits and _ - . , : / = + @ % ^ \
                     (the env file is sourced by shells, unquoted)"
                ),
            );
        }
        env.insert(k.clone(), v.clone());
    }
    env
}

/// NCCL's channel limit (MAXCHANNELS).
const NCCL_MAX_CHANNELS: u8 = 64;

/// One rule's names as codes, or an error at `span`.
fn nccl_rule(
    what: &str,
    algo: Option<&str>,
    proto: Option<&str>,
    max_channels: Option<u8>,
    span: std::ops::Range<usize>,
    e: &mut Errors,
) -> NcclRule {
    let mut code = |kind: &str, name: Option<&str>, names: &[&str]| -> Option<u8> {
        let name = name.filter(|n| *n != "auto")?;
        let found = names.iter().position(|n| *n == name);
        if found.is_none() {
            e.at(
                span.clone(),
                format!("{what}: {kind} {name:?} is not one of auto, {}", names.join(", ")),
            );
        }
        found.map(|i| i as u8)
    };
    let algo = code("algo", algo, &nccl::ALGOS);
    let proto = code("proto", proto, &nccl::PROTOS);
    let max_channels = max_channels.unwrap_or(0);
    if max_channels > NCCL_MAX_CHANNELS {
        e.at(
            span,
            format!(
                "{what}: max_channels {max_channels} must be 0 (NCCL's count) to {NCCL_MAX_CHANNELS}"
            ),
        );
    }
    NcclRule { algo, proto, max_channels }
}

pub(super) fn check_nccl(raw: &Spanned<RawNccl>, states: &[State], e: &mut Errors) -> Nccl {
    let n = raw.get_ref();
    let min_bytes = n.min_bytes.0;
    if min_bytes != 0 && !min_bytes.is_power_of_two() {
        e.at(
            raw.span(),
            format!(
                "nccl min_bytes {} must be 0 or a power of two (the plugin counts collectives in power-of-two size classes)",
                n.min_bytes
            ),
        );
    }
    let written = n.algo.is_some() || n.proto.is_some() || n.max_channels.is_some();
    let common =
        nccl_rule("nccl", n.algo.as_deref(), n.proto.as_deref(), n.max_channels, raw.span(), e);
    for (name, rule) in &n.state {
        if !states.iter().any(|s| &s.name == name) {
            let known: Vec<&str> = states.iter().map(|s| s.name.as_str()).collect();
            e.at(
                rule.span(),
                format!("nccl.state.{name}: no such state (the ladder: {})", known.join(", ")),
            );
        }
    }
    let rules = states
        .iter()
        .enumerate()
        .map(|(i, s)| match n.state.get(&s.name) {
            Some(r) => {
                let r = r.get_ref();
                let what = format!("nccl.state.{}", s.name);
                let span = n.state[&s.name].span();
                nccl_rule(&what, r.algo.as_deref(), r.proto.as_deref(), r.max_channels, span, e)
            }
            None if written => common,
            // Built in: NCCL's own choice while healthy; the Simple protocol (full bandwidth, no
            // LL flags on the wire) once the link is worse.
            None if i == 0 => NcclRule::default(),
            None => NcclRule { proto: Some(nccl::PROTO_SIMPLE), ..NcclRule::default() },
        })
        .collect();
    Nccl { min_bytes, rules }
}

/// `[outcome]`: windows a judgment can span (the jobs' readings are kept for two windows and
/// the settling time), shares below 100%, and steps-to-loss factors of known codecs.
pub(super) fn check_outcome(raw: &Spanned<RawOutcome>, e: &mut Errors) -> Outcome {
    let (span, o) = (raw.span(), raw.get_ref());
    let s = |n: linkpilot_common::units::Nanos| n.0 as f64 / 1e9;
    if !(1.0..=600.0).contains(&s(o.window)) {
        e.at(span.clone(), format!("outcome window {}s must be between 1s and 600s", s(o.window)));
    }
    if s(o.settle) > 600.0 {
        e.at(span.clone(), format!("outcome settle {}s must be at most 600s", s(o.settle)));
    }
    if !(o.slower_by.0 > 0.0 && o.slower_by.0 < 1.0) {
        e.at(span.clone(), "outcome slower_by must be above 0% and below 100%");
    }
    if o.min_steps == 0 {
        e.at(
            span.clone(),
            "outcome min_steps must be at least 1: a window without steps says nothing",
        );
    }
    if o.hold.0 == 0 || o.hold_max < o.hold {
        e.at(span.clone(), "outcome hold must be above 0s and at most hold_max");
    }
    for (codec, f) in &o.steps_to_loss {
        if !Compression::MODES.contains(&codec.as_str()) {
            e.at(
                span.clone(),
                format!(
                    "outcome steps_to_loss names {codec:?}; codecs are {}",
                    Compression::MODES.join(", ")
                ),
            );
        }
        if !(f.is_finite() && (0.1..=100.0).contains(f)) {
            e.at(
                span.clone(),
                format!("outcome steps_to_loss.{codec} = {f} must be between 0.1 and 100"),
            );
        }
    }
    Outcome {
        judge: o.judge,
        window: o.window,
        settle: o.settle,
        slower_by: o.slower_by.0,
        min_steps: o.min_steps,
        hold: o.hold,
        hold_max: o.hold_max,
        steps_to_loss: o.steps_to_loss.clone(),
    }
}

/// `[state.transport]`: a well-formed algorithm name (whether the host has it is checked
/// where the policy runs), windows within what TCP takes, buffers within the bounds.
pub(super) fn check_transport(
    state: &str,
    t: &Spanned<RawTransport>,
    b: &Bounds,
    e: &mut Errors,
    ccs: &mut CcUses,
) -> StateTransport {
    let span = t.span();
    let t = t.get_ref();
    let congestion_control =
        t.congestion_control.as_ref().and_then(|c| match CcName::new(c.get_ref()) {
            Ok(cc) => {
                ccs.push((cc, e.error_at(c.span(), format!("state {state:?}"))));
                Some(cc)
            }
            Err(why) => {
                e.at(c.span(), format!("state {state:?}: {why}"));
                None
            }
        });
    for (key, v, max) in [
        ("initial_cwnd", t.initial_cwnd, 1000),
        ("initial_rwnd", t.initial_rwnd, 65_535),
        ("sndcwnd_clamp", t.sndcwnd_clamp, 1 << 20),
    ] {
        if v.is_some_and(|v| v == 0 || v > max) {
            e.at(span.clone(), format!("state {state:?}: transport {key} must be 1..={max} segments (leave it out for the kernel's)"));
        }
    }
    if let Some(Setting::Fixed(x)) = t.socket_buffers {
        if x.0 < b.buffers_min || x.0 > b.buffers_max.min(i32::MAX as u64) {
            e.at(
                span.clone(),
                format!(
                    "state {state:?}: transport socket_buffers {x} lies outside {}..={} (the \
                     tcp_buffers bounds, and what a socket option takes)",
                    Bytes(b.buffers_min),
                    Bytes(b.buffers_max.min(i32::MAX as u64))
                ),
            );
        }
    }
    StateTransport {
        congestion_control,
        initial_cwnd: t.initial_cwnd.unwrap_or(0),
        initial_rwnd: t.initial_rwnd.unwrap_or(0),
        sndcwnd_clamp: t.sndcwnd_clamp.unwrap_or(0),
        socket_buffers: t.socket_buffers.map(|s| map_setting(s, |b| b.0)),
        ecn: t.ecn,
    }
}
