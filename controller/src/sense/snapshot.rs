//! What the sensors report each tick, and what a trace records (one `Snapshot` per line, read
//! back by `linkpilot replay`): fields added later default when an older trace is read.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// RTT over the estimator window, milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RttSnapshot {
    /// Mean of the smoothed RTTs sampled during this tick.
    pub srtt_ms: Option<f64>,
    /// Smallest smoothed RTT in the window.
    pub min_ms: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Flow samples in the window. Percentiles are within 0.5% (log buckets); min is exact.
    pub samples: usize,
    /// Mean of this tick's samples that show others' queue: the smoothed RTTs of flows that
    /// are not a reporting job's, and the first sample of each burst of a job's flow (sent
    /// after its own flight emptied). Equal to `srtt_ms` while no job reports.
    #[serde(default)]
    pub cross_srtt_ms: Option<f64>,
    /// How many samples `cross_srtt_ms` is the mean of.
    #[serde(default)]
    pub cross_samples: usize,
    /// Percentiles of the samples of others' queue over the window: their spread is the
    /// jitter of the path without a job's own bursts (equal to `p50_ms`/`p99_ms` while no job
    /// reports).
    #[serde(default)]
    pub cross_p50_ms: Option<f64>,
    #[serde(default)]
    pub cross_p99_ms: Option<f64>,
}

/// Signals of one peer of one link over the last tick. Fields added later default to zero when
/// an older trace is replayed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PeerSnapshot {
    pub link: String,
    pub peer: String,
    pub rx_pps: f64,
    pub tx_pps: f64,
    pub rx_bps: f64,
    pub tx_bps: f64,
    /// CE share of the ECN-capable packets received.
    pub ce_fraction: f64,
    /// Share of the TCP segments received with ECE set: the far receiver echoing CE marks
    /// back, which is how a sender sees congestion on the path away from it.
    pub ece_fraction: f64,
    /// Retransmitted TCP segments per second, and as a share of segments sent.
    pub retrans_per_s: f64,
    pub retrans_fraction: f64,
    /// RoCEv2 CNPs per second, both directions.
    pub cnp_per_s: f64,
    /// Bits per second sent to this peer that were not retransmissions (`tx_bps` scaled by
    /// `1 - retrans_fraction`): the useful sending rate, to hold against link capacity.
    pub goodput_bps: f64,
    pub rtt: RttSnapshot,
    /// Active flows to this peer (updated during the tick).
    pub flows: usize,
    /// TCP connections established (either side opening) and closed per second, and
    /// connection attempts that failed.
    pub opens_per_s: f64,
    pub closes_per_s: f64,
    pub failed_opens_per_s: f64,
    /// Of the CE-marked packets and the ECE segments received, the shares that were on the
    /// flows of jobs reporting on this host (their own bursts' marks), as of the last
    /// flow-table reading.
    pub job_ce_share: f64,
    pub job_ece_share: f64,
    /// Marks counted at flow-table readings, each over the interval since the previous one
    /// (0 on ticks without a reading): CE-marked packets and ECE segments received, and how many
    /// of them were on the jobs' flows.
    pub marks: MarkCounts,
}

/// CE-marked packets and ECE segments received, all and on the jobs' flows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MarkCounts {
    pub ce: u64,
    pub ece: u64,
    pub job_ce: u64,
    pub job_ece: u64,
}

/// What the RDMA NIC behind a link counted over the last tick: RoCE traffic the NIC offloads
/// never reaches the TC hooks, so its congestion signals come from here.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LinkSnapshot {
    pub link: String,
    /// `device/port` of each RDMA port on this link, with its state ("mlx5_0/1 ACTIVE").
    pub rdma_ports: Vec<String>,
    /// CNPs the NIC acted on as a sender told to slow down (`rp_cnp_handled`), per second.
    pub cnp_handled_per_s: f64,
    /// CNPs the NIC sent as a receiver of CE-marked packets (`np_cnp_sent`), per second.
    pub cnp_sent_per_s: f64,
    /// CE-marked RoCE packets received (`np_ecn_marked_roce_packets`), per second.
    pub ecn_marked_per_s: f64,
    /// Events that make the requester resend (`local_ack_timeout_err`, `packet_seq_err`,
    /// `implied_nak_seq_err`, `roce_adp_retrans`), per second.
    pub retrans_events_per_s: f64,
    /// Every signal counter of [`crate::rdma::SIGNAL_COUNTERS`] present, per second, summed over
    /// the link's ports.
    pub counters_per_s: BTreeMap<String, f64>,
}

/// Everything the sensors saw in one tick.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Time since the sensors started.
    pub at_ms: u64,
    /// Length of the interval the rates cover (longer than a tick after missed ticks).
    pub interval_ms: u64,
    pub peers: Vec<PeerSnapshot>,
    /// Links with RDMA ports behind them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<LinkSnapshot>,
    /// The training jobs' progress, on the ticks that read their reports (about once a
    /// second): recorded so that a replay judges decisions by the outcome as the daemon did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jobs: Option<Vec<JobProgress>>,
}

/// One job's progress on this host: its processes' steps and step time summed, counted by
/// the daemon since it first read them (never going down: a restarted rank's totals start
/// over in its own report, not here).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobProgress {
    pub job: String,
    /// The policy link the job's traffic crosses.
    pub link: String,
    pub rank_steps: u64,
    pub step_seconds: f64,
    /// The codec its processes report in force.
    pub codec: String,
    /// "ddp" (an exchange every step), "outer" (every H steps) or "init".
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Of `step_seconds`, the compute no exchange waited on.
    #[serde(default)]
    pub compute_seconds: f64,
    /// Bytes its processes put on the wire.
    #[serde(default)]
    pub wire_bytes: u64,
    /// Its processes on this host.
    #[serde(default)]
    pub processes: u32,
}
