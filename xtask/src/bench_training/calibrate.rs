//! The reference regime is a set of ratios (exchange : compute : round trip, within 10% of the
//! reference job's; docs/reference-case.md), and its compute is this machine's: on a host that
//! runs the model 3x slower every step's compute triples, the exchange shrinks to a third of it
//! and a day holds a third of the steps, so the regime's question (which exchange pays) is no
//! longer asked. Before a reference-regime day, one rank alone measures its forward and
//! backward; the batch per rank is scaled so that one step's compute is the regime's, and saved
//! beside the runs, so that every run of one record (kept and resumed ones too) trains at the
//! same batch.

use std::{
    fs,
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{bail, Context as _};
use serde::{Deserialize, Serialize};

use crate::run::workspace_root;

/// One rank's forward and backward per step in the reference regime, s: the lab's model at
/// batch 32 on the machine the regime was scaled on (docs/reference-case.md).
pub const REGIME_COMPUTE_S: f64 = 1.10;
use super::config::REFERENCE_BATCH as REGIME_BATCH;
/// The file beside a scenario's runs.
const FILE: &str = "calibration.json";
/// Bounds of a calibrated batch: below 4 a step's gradient is mostly noise; above 64 a rank's
/// activations outgrow what the lab's hosts are sized for.
const MIN_BATCH: u32 = 4;
const MAX_BATCH: u32 = 64;

/// What a reference-regime record trains at, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Batch per rank with one rank a site (two ranks a site take half each).
    pub batch: u32,
    /// One rank's forward and backward at [`REGIME_BATCH`], then at `batch`, s (none where the
    /// batch was given).
    pub compute_s_at_regime_batch: Option<f64>,
    pub compute_s: Option<f64>,
    /// "measured" or "given".
    pub how: String,
}

/// The batch whose compute is the regime's, from the compute `measured_s` at [`REGIME_BATCH`]:
/// compute grows with the batch (matmuls over batch x sequence rows); even, so that two ranks
/// a site split it exactly.
pub fn scaled_batch(measured_s: f64) -> u32 {
    let raw = f64::from(REGIME_BATCH) * REGIME_COMPUTE_S / measured_s;
    let even = (raw / 2.0).round() * 2.0;
    (even as u32).clamp(MIN_BATCH, MAX_BATCH)
}

/// The record's calibration: the one saved in `dir` where its runs are kept (`reuse`), else
/// `given` or a fresh measurement, saved there.
pub fn load_or_measure(dir: &Path, reuse: bool, given: Option<u32>) -> anyhow::Result<Calibration> {
    let path = dir.join(FILE);
    if reuse && path.exists() {
        let saved: Calibration = serde_json::from_str(&fs::read_to_string(&path)?)
            .with_context(|| format!("reading {}", path.display()))?;
        if let Some(b) = given.filter(|&b| b != saved.batch) {
            bail!(
                "--reference-batch {b}: the kept runs in {} trained at batch {}; run them all \
                 again (no --keep or --resume) to change it",
                dir.display(),
                saved.batch
            );
        }
        println!(
            "reference regime: batch {} per rank, as the kept runs ({})",
            saved.batch, saved.how
        );
        return Ok(saved);
    }
    let calibration = match given {
        Some(batch) => Calibration {
            batch,
            compute_s_at_regime_batch: None,
            compute_s: None,
            how: "given".into(),
        },
        None => {
            let at_regime = compute_s(REGIME_BATCH)?;
            let batch = scaled_batch(at_regime);
            let at_batch = if batch == REGIME_BATCH { at_regime } else { compute_s(batch)? };
            Calibration {
                batch,
                compute_s_at_regime_batch: Some(at_regime),
                compute_s: Some(at_batch),
                how: "measured".into(),
            }
        }
    };
    println!(
        "reference regime: batch {} per rank ({}; one rank's compute {} s a step at batch {}, {} \
         at this batch; the regime's is {REGIME_COMPUTE_S} s)",
        calibration.batch,
        calibration.how,
        calibration.compute_s_at_regime_batch.map_or("-".into(), |s| format!("{s:.2}")),
        REGIME_BATCH,
        calibration.compute_s.map_or("-".into(), |s| format!("{s:.2} s")),
    );
    fs::write(&path, serde_json::to_string_pretty(&calibration)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(calibration)
}

/// The calibration saved beside a scenario's runs, if any.
pub fn saved(dir: &Path) -> Option<Calibration> {
    serde_json::from_str(&fs::read_to_string(dir.join(FILE)).ok()?).ok()
}

/// One rank of the benchmark's workload alone (a world of one, no exchange), one thread as in
/// the runs: its own median forward and backward at `batch` (its start line's
/// `compute_s_baseline`).
fn compute_s(batch: u32) -> anyhow::Result<f64> {
    let script = workspace_root().join("python/benchmarks/train_lm.py");
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut child = Command::new(crate::python::python())
        .arg(&script)
        .args(["--rank", "0", "--world", "1", "--master", &format!("127.0.0.1:{port}")])
        .args(["--iface", "lo", "--steps", "1", "--eval-every", "0"])
        .args(["--batch", &batch.to_string()])
        .env("OMP_NUM_THREADS", "1")
        .env("PYTHONUNBUFFERED", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", script.display()))?;
    let stdout = child.stdout.take().context("its stdout")?;
    // Every line is read: a pipe closed early would end the rank with EPIPE.
    let lines: Vec<String> = BufReader::new(stdout).lines().map_while(Result::ok).collect();
    let baseline = lines.iter().find_map(|line| {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        v["compute_s_baseline"].as_f64().filter(|_| v["start"] == true)
    });
    let out = child.wait_with_output()?;
    match baseline {
        Some(s) if out.status.success() && s > 0.0 => Ok(s),
        _ => bail!(
            "measuring the workload's compute at batch {batch} ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("no line with compute_s_baseline")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_regimes_own_machine_keeps_the_regimes_batch() {
        assert_eq!(scaled_batch(REGIME_COMPUTE_S), REGIME_BATCH);
        assert_eq!(scaled_batch(1.0), 36);
    }

    #[test]
    fn a_slower_machine_gets_a_smaller_even_batch_within_bounds() {
        // 3.5x slower: a step's compute back to the regime's at about a 3.5th of the batch.
        assert_eq!(scaled_batch(3.85), 10);
        assert_eq!(scaled_batch(4.2), 8);
        assert!(scaled_batch(3.3).is_multiple_of(2));
        assert_eq!(scaled_batch(100.0), MIN_BATCH);
        assert_eq!(scaled_batch(0.01), MAX_BATCH);
    }

    #[test]
    fn two_ranks_a_site_split_the_calibrated_batch() {
        let names: Vec<String> = ["colocated", "adaptive-2x"].map(str::to_owned).to_vec();
        let configs = super::super::config::select("ref-fatpipe", false, Some(&names)).unwrap();
        assert_eq!(configs.iter().map(|c| c.batch).collect::<Vec<_>>(), [REGIME_BATCH, 16]);
        let scaled = super::super::config::at_reference_batch(configs, 10);
        assert_eq!(
            scaled.iter().map(|c| (c.per_site, c.batch)).collect::<Vec<_>>(),
            [(1, 10), (2, 5)]
        );
    }

    #[test]
    fn kept_runs_keep_their_batch_and_a_different_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("lp-calibrate-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let given = load_or_measure(&dir, false, Some(12)).unwrap();
        assert_eq!((given.batch, given.how.as_str()), (12, "given"));
        assert_eq!(saved(&dir), Some(given.clone()));
        assert_eq!(load_or_measure(&dir, true, None).unwrap(), given);
        assert_eq!(load_or_measure(&dir, true, Some(12)).unwrap(), given);
        let err = load_or_measure(&dir, true, Some(32)).unwrap_err().to_string();
        assert!(err.contains("trained at batch 12"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
