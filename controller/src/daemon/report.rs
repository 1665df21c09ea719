//! What a tick reports: the Prometheus series and the status API's snapshot, and the series
//! a reload leaves behind.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use linkpilot_common::{MAX_FLOWS, MAX_PEERS};

use super::{
    status::{LinkStatus, PeerStatus, Status},
    Daemon,
};
use crate::sense::sensors::Snapshot;

impl Daemon {
    /// Metrics and the status API after a tick (`flows_read`: the flow table was read in it).
    pub(super) fn report(&mut self, snap: &Snapshot, flows_read: bool, work: Duration) {
        let (m, core, sense) = (&self.report.metrics, &self.decider.core, &self.sense);
        let flows = sense.flows_seen;
        let held = core.held();
        m.outcome.update(core.policy().links.iter().map(|l| l.name.as_str()), &held);
        let codec_checks = core.codec_checks();
        m.codec.update(&codec_checks);
        let states: Vec<String> = core.policy().states.iter().map(|s| s.name.clone()).collect();
        let signals = core.signals();
        let mut links = Vec::new();
        for (link, state, k) in core.current() {
            let s = signals.iter().find(|(l, _)| *l == link).map(|(_, s)| *s).unwrap_or_default();
            m.link(link, &states, state, &k, &s);
            let (id, reason) = self
                .decider
                .last
                .iter()
                .find(|(l, _, _)| l == link)
                .map(|(_, id, r)| (*id, r.clone()))
                .unwrap_or_default();
            links.push(LinkStatus {
                link: link.to_owned(),
                state: state.to_owned(),
                knobs: k,
                signals: s,
                decision_id: id,
                reason,
            });
        }
        m.snapshot(snap, flows_read);
        let (sysctls, roce) = (self.act.sysctls.as_ref(), self.act.roce.as_ref());
        let released = [
            ("sysctl", sysctls.map_or(0, |s| s.released().len())),
            ("roce_tc", roce.map_or(0, |r| r.released().len())),
        ];
        m.actuators(self.act.ledger.entries(), &released);
        m.map("flows", flows, u64::from(MAX_FLOWS));
        m.map("peers", sense.peers.names.len() as u64, u64::from(MAX_PEERS));
        m.ticks.inc();
        m.tick_duration.observe(work.as_secs_f64());
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        m.last_tick.set(now.as_secs_f64());
        let reload = |r: &str| {
            m.reloads.get(&vec![("result".to_owned(), r.to_owned())]).map_or(0, |c| c.get())
        };
        let Ok(mut st) = self.report.status.lock() else { return };
        let last_reload_error = st.last_reload_error.take();
        *st = Status {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            pid: std::process::id(),
            uptime_s: self.report.started.elapsed().as_secs_f64(),
            policy: self.o.policy.display().to_string(),
            policy_sha256: self.decider.policy_sha256.clone(),
            starting: false,
            dry_run: self.o.dry_run,
            observe_only: self.observe_only.then(|| super::OBSERVE_ONLY.to_owned()),
            interfaces: sense.ifaces.iter().map(|i| i.name.clone()).collect(),
            interfaces_missing: sense.missing.clone(),
            tick_ms: core.policy().tick.0 as f64 / 1e6,
            ticks: m.ticks.get(),
            last_tick_work_ms: work.as_secs_f64() * 1e3,
            reloads_applied: reload("applied"),
            reloads_rejected: reload("rejected"),
            last_reload_error,
            sensing_errors: sense.health.total,
            sensing_failing_ticks: 0,
            last_sensing_error: sense.health.last_error.clone(),
            flows,
            flows_capacity: u64::from(MAX_FLOWS),
            sysctls_released: sysctls.map(|s| s.released().to_vec()).unwrap_or_default(),
            sysctls_unmanaged: sysctls.map(|s| s.unmanaged().to_vec()).unwrap_or_default(),
            roce_tc_released: roce.map(|r| r.released().to_vec()).unwrap_or_default(),
            actuators: self.act.ledger.entries().to_vec(),
            links,
            plan: Some(self.decider.plan.clone()),
            nccl_tuner: self.training.tuner.clone(),
            jobs: self.training.job_status.clone(),
            job_reports_refused: self.training.job_refused.clone(),
            transport: self.training.transport_status.clone(),
            verdicts: self.decider.verdicts.clone(),
            codec_checks,
            pending_judgments: core.pending_judgments(),
            held,
            peers: snap
                .peers
                .iter()
                .map(|p| PeerStatus {
                    interface: p.link.clone(),
                    peer: p.peer.clone(),
                    srtt_ms: p.rtt.srtt_ms,
                    p99_ms: p.rtt.p99_ms,
                    rx_bps: p.rx_bps,
                    tx_bps: p.tx_bps,
                    ce_fraction: p.ce_fraction,
                    job_ce_share: p.job_ce_share,
                    job_ece_share: p.job_ece_share,
                    retrans_per_s: p.retrans_per_s,
                    flows: p.flows,
                })
                .collect(),
        };
    }

    /// Removes the metric series of links, states and peers the running policy no longer has.
    pub(super) fn forget_series(&self) {
        let p = self.decider.policy();
        let links: Vec<String> = p.links.iter().map(|l| l.name.clone()).collect();
        let states: Vec<String> = p.states.iter().map(|s| s.name.clone()).collect();
        let sense = &self.sense;
        let rows: Vec<(String, String)> = (sense.ifaces.iter())
            .flat_map(|i| sense.rows.iter().map(|(_, peer)| (i.name.clone(), peer.clone())))
            .collect();
        self.report.metrics.retain(&links, &states, &rows);
    }
}
