//! The status API: a Unix socket (default /run/linkpilot/status.sock, mode 0600) that answers
//! one request line with one JSON line, root-only. `linkpilot status` is the client. This file
//! holds what a reply says, the [`Status`] the loop keeps up to date; `status/socket.rs` serves
//! and asks for it, `status/render.rs` prints it as a table.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::{jobs::JobStatus, ledger::ActuatorStatus};
use crate::{
    board::tuner_stats::TunerProcess,
    control::{
        estimator::Signals,
        outcome::{HeldChange, Verdict},
        Knobs,
    },
};

mod render;
mod socket;

pub use render::render;
pub use socket::{bind, query, spawn};

pub const DEFAULT_SOCKET: &str = "/run/linkpilot/status.sock";

/// What `linkpilot status` shows.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    pub pid: u32,
    pub uptime_s: f64,
    pub policy: String,
    /// SHA-256 of the running policy's bytes (hex, as sha256sum prints it).
    #[serde(default)]
    pub policy_sha256: String,
    /// Opening its files, loading and attaching the programs: the socket answers from the moment
    /// it is bound (on its own thread), so a client asking during the start gets this, not a
    /// timeout.
    #[serde(default)]
    pub starting: bool,
    pub dry_run: bool,
    /// Why nothing is applied although this is not a dry run (the policy names no peers).
    #[serde(default)]
    pub observe_only: Option<String>,
    pub interfaces: Vec<String>,
    /// Watched interfaces that are gone: watched again once they are back.
    #[serde(default)]
    pub interfaces_missing: Vec<String>,
    pub tick_ms: f64,
    pub ticks: u64,
    /// Work of the last tick (reading maps, sensors, core, actuators).
    pub last_tick_work_ms: f64,
    pub reloads_applied: u64,
    pub reloads_rejected: u64,
    pub last_reload_error: Option<String>,
    /// Ticks skipped because a sensing read failed: in all, in a row now, the latest error.
    #[serde(default)]
    pub sensing_errors: u64,
    #[serde(default)]
    pub sensing_failing_ticks: u32,
    #[serde(default)]
    pub last_sensing_error: Option<String>,
    pub flows: u64,
    pub flows_capacity: u64,
    /// Sysctls an administrator changed under us, no longer managed.
    pub sysctls_released: Vec<String>,
    /// Sysctls absent or read-only here (another network namespace), left alone.
    #[serde(default)]
    pub sysctls_unmanaged: Vec<String>,
    /// RoCE port classes an administrator changed under us, no longer managed.
    #[serde(default)]
    pub roce_tc_released: Vec<String>,
    /// Each actuator: what the decisions want, what is in place, whether it is pending.
    #[serde(default)]
    pub actuators: Vec<ActuatorStatus>,
    pub links: Vec<LinkStatus>,
    /// The plan in place (in a dry run or observing only: the one that would be).
    #[serde(default)]
    pub plan: Option<crate::control::Plan>,
    /// Training processes with the NCCL tuner plugin loaded: what they adopted and asked NCCL for.
    #[serde(default)]
    pub nccl_tuner: Vec<TunerProcess>,
    /// Training jobs' reports: what the network costs their steps.
    #[serde(default)]
    pub jobs: Vec<JobStatus>,
    /// Report files the latest read refused: "file: why".
    #[serde(default)]
    pub job_reports_refused: Vec<String>,
    /// Per-peer transport profiles.
    #[serde(default)]
    pub transport: super::transport::TransportStatus,
    /// The latest judgment of a state change by the jobs' progress, per link.
    #[serde(default)]
    pub verdicts: Vec<Verdict>,
    /// `compression = "auto"`: each link's latest codec prediction, pending or judged.
    #[serde(default)]
    pub codec_checks: Vec<crate::control::codec::Check>,
    /// State changes waiting for their judgment: (link, from, to, judged at ms).
    #[serde(default)]
    pub pending_judgments: Vec<(String, String, String, u64)>,
    /// State changes held off after reverts.
    #[serde(default)]
    pub held: Vec<HeldChange>,
    pub peers: Vec<PeerStatus>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LinkStatus {
    pub link: String,
    pub state: String,
    pub knobs: Knobs,
    pub signals: Signals,
    pub decision_id: u64,
    pub reason: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PeerStatus {
    pub interface: String,
    pub peer: String,
    pub srtt_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub rx_bps: f64,
    pub tx_bps: f64,
    pub ce_fraction: f64,
    /// Share of the CE and ECE marks received that were on reporting jobs' flows.
    #[serde(default)]
    pub job_ce_share: f64,
    #[serde(default)]
    pub job_ece_share: f64,
    pub retrans_per_s: f64,
    pub flows: usize,
}

pub type Shared = Arc<Mutex<Status>>;
