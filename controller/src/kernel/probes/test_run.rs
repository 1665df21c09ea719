//! Running the classifiers on a given packet with `BPF_PROG_TEST_RUN`: what the datapath
//! benchmark measures, against an empty classifier as its baseline.

use aya::programs::SchedClassifier;
use linkpilot_common::{PROG_TC_EGRESS, PROG_TC_INGRESS, PROG_TC_NOOP};

use super::{load_error, program, ProbeError, Probes};

impl Probes {
    /// Runs the ingress (or egress) classifier on `packet` (from its Ethernet header) `repeat`
    /// times with BPF_PROG_TEST_RUN. The test skb's device is loopback, so the counters of
    /// ifindex 1 move if [`Probes::count_on`] was called for `lo`. Returns the verdict and the
    /// kernel's mean time per run.
    pub fn run_classifier(
        &mut self,
        egress: bool,
        packet: &[u8],
        repeat: u32,
    ) -> Result<(i32, std::time::Duration), ProbeError> {
        let name = if egress { PROG_TC_EGRESS } else { PROG_TC_INGRESS };
        self.run_named(name, packet, repeat)
    }

    /// Like [`Probes::run_classifier`] for the empty classifier, the benchmark's baseline.
    pub fn run_noop(
        &mut self,
        packet: &[u8],
        repeat: u32,
    ) -> Result<(i32, std::time::Duration), ProbeError> {
        let prog: &mut SchedClassifier = program(&mut self.ebpf, PROG_TC_NOOP)?;
        if prog.fd().is_err() {
            prog.load().map_err(|e| load_error(PROG_TC_NOOP, e))?;
        }
        self.run_named(PROG_TC_NOOP, packet, repeat)
    }

    fn run_named(
        &mut self,
        name: &'static str,
        packet: &[u8],
        repeat: u32,
    ) -> Result<(i32, std::time::Duration), ProbeError> {
        use aya::programs::{TestRun, TestRunOptions};
        let prog: &mut SchedClassifier = program(&mut self.ebpf, name)?;
        let opts = TestRunOptions {
            data_in: Some(packet),
            repeat: repeat.max(1),
            ..TestRunOptions::default()
        };
        let r = prog.test_run(opts).map_err(|e| ProbeError::Program {
            action: "test-running",
            program: name,
            source: Box::new(e),
        })?;
        Ok((r.return_value as i32, r.duration))
    }
}
