//! The NCCL tuner plugin's series (`linkpilot_nccl_tuner_*`): how many training processes have
//! it loaded, how many of their calls followed the adopted decision, and which algorithm and
//! protocol each size class got. Read from the plugin's stats files (`board::tuner_stats`), not
//! from the control loop, hence apart.

use prometheus_client::{
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

use super::{family, labels, metric, Labels};
use crate::board::tuner_stats::TunerProcess;

#[derive(Clone)]
pub struct TunerMetrics {
    /// Processes with the plugin loaded.
    processes: Gauge,
    /// Their calls, by whether they followed the adopted decision.
    calls: Family<Labels, Gauge>,
    /// Size classes by the algorithm and protocol chosen for them.
    choices: Family<Labels, Gauge>,
}

impl TunerMetrics {
    pub fn register(r: &mut Registry) -> Self {
        let m = Self {
            processes: metric(
                r,
                "nccl_tuner_processes",
                "Training processes with the NCCL tuner plugin loaded",
            ),
            calls: family(
                r,
                "nccl_tuner_calls",
                "getCollInfo calls of the live processes: result adopted (followed the decision \
                 the ranks adopted) or own (NCCL's own choice: none adopted)",
            ),
            choices: family(
                r,
                "nccl_tuner_choices",
                "(process, size class) pairs whose latest choice for a collective is this \
                 algorithm and protocol (nccl: NCCL's own)",
            ),
        };
        for res in ["adopted", "own"] {
            let _ = m.calls.get_or_create(&labels(&[("result", res)]));
        }
        m
    }

    /// The counters of the live training processes.
    pub fn update(&self, procs: &[TunerProcess]) {
        self.processes.set(procs.len() as i64);
        let adopted: u64 = procs.iter().map(|p| p.adopted_calls).sum();
        let all: u64 = procs.iter().map(|p| p.calls).sum();
        self.calls.get_or_create(&labels(&[("result", "adopted")])).set(adopted as i64);
        self.calls
            .get_or_create(&labels(&[("result", "own")]))
            .set(all.saturating_sub(adopted) as i64);
        // Choices come and go: rebuild the family from what the processes show now.
        self.choices.clear();
        for c in procs.iter().flat_map(|p| &p.choices) {
            let (algo, proto) = match c.own_choice {
                Some(_) => ("nccl", "nccl"),
                None => (c.algo.as_deref().unwrap_or("nccl"), c.proto.as_deref().unwrap_or("nccl")),
            };
            let l = labels(&[("collective", &c.collective), ("algo", algo), ("proto", proto)]);
            self.choices.get_or_create(&l).inc();
        }
    }
}
