//! The suite's clock: every step's wall time, printed as a table when the run ends (pass or
//! fail) and written to `target/test-timings.json`, so a change to the suite's cost shows.

use std::{
    fs,
    path::Path,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::Context as _;

/// How a step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    Failed,
    Skipped,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Passed => "passed",
            Self::Failed => "failed",
            Self::Skipped => "skipped",
        }
    }
}

#[derive(Debug)]
pub struct Step {
    pub name: String,
    pub seconds: f64,
    pub outcome: Outcome,
}

/// The steps of one run, in order.
#[derive(Debug)]
pub struct Suite {
    started: Instant,
    started_unix: u64,
    steps: Vec<Step>,
}

impl Default for Suite {
    fn default() -> Self {
        let started_unix = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Self { started: Instant::now(), started_unix, steps: Vec::new() }
    }
}

impl Suite {
    /// Runs `f` as the step `name`, timing it; its error is returned with the step named.
    pub fn step<T>(
        &mut self,
        name: &str,
        f: impl FnOnce() -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        eprintln!("test: == {name}");
        let start = Instant::now();
        let result = f();
        let outcome = if result.is_ok() { Outcome::Passed } else { Outcome::Failed };
        self.record(name, start.elapsed(), outcome);
        result.with_context(|| format!("step '{name}'"))
    }

    /// Records a step that ran on another thread beside the others, taking `took`.
    pub fn beside<T>(
        &mut self,
        name: &str,
        took: Duration,
        result: anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let outcome = if result.is_ok() { Outcome::Passed } else { Outcome::Failed };
        self.record(name, took, outcome);
        result.with_context(|| format!("step '{name}'"))
    }

    /// Notes a step that did not run (and why, in its name).
    pub fn skip(&mut self, name: &str) {
        self.record(name, Duration::ZERO, Outcome::Skipped);
    }

    fn record(&mut self, name: &str, took: Duration, outcome: Outcome) {
        self.steps.push(Step { name: name.to_owned(), seconds: took.as_secs_f64(), outcome });
    }

    /// The table: one row a step, its seconds and share of the whole, then the total.
    pub fn table(&self) -> String {
        let total = self.started.elapsed().as_secs_f64();
        let width = self.steps.iter().map(|s| s.name.len()).max().unwrap_or(0).max(5);
        let mut out = format!("{:<width$}  {:>8}  {:>6}  outcome\n", "step", "seconds", "share");
        for s in &self.steps {
            out.push_str(&format!(
                "{:<width$}  {:>8.1}  {:>5.1}%  {}\n",
                s.name,
                s.seconds,
                100.0 * s.seconds / total.max(1e-9),
                s.outcome.as_str()
            ));
        }
        out.push_str(&format!(
            "{:<width$}  {:>8.1}  {:>5.1}%  ({:.1} min)\n",
            "total",
            total,
            100.0,
            total / 60.0
        ));
        out
    }

    /// The same figures as JSON: when the run started, each step, the total.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "started_unix": self.started_unix,
            "total_seconds": round(self.started.elapsed().as_secs_f64()),
            "steps": self.steps.iter().map(|s| serde_json::json!({
                "step": s.name,
                "seconds": round(s.seconds),
                "outcome": s.outcome.as_str(),
            })).collect::<Vec<_>>(),
        })
    }

    /// Prints the table and writes the JSON to `path`.
    pub fn report(&self, path: &Path) -> anyhow::Result<()> {
        eprintln!("\ntest: where the time went\n{}", self.table());
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        fs::write(path, serde_json::to_string_pretty(&self.json())? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("test: timings written to {}", path.display());
        Ok(())
    }
}

fn round(s: f64) -> f64 {
    (s * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_is_recorded_with_its_outcome_and_a_failure_names_its_step() {
        let mut suite = Suite::default();
        suite.step("fine", || Ok(())).unwrap();
        let err = suite.step("broken", || -> anyhow::Result<()> { anyhow::bail!("boom") });
        assert_eq!(format!("{:#}", err.unwrap_err()), "step 'broken': boom");
        suite.skip("privileged tests (not root)");
        let outcomes: Vec<_> = suite.steps.iter().map(|s| (s.name.as_str(), s.outcome)).collect();
        assert_eq!(
            outcomes,
            [
                ("fine", Outcome::Passed),
                ("broken", Outcome::Failed),
                ("privileged tests (not root)", Outcome::Skipped)
            ]
        );
        let table = suite.table();
        assert_eq!(table.lines().count(), 5, "{table}");
        assert!(table.lines().last().unwrap().starts_with("total"), "{table}");
        let json = suite.json();
        assert_eq!(json["steps"][1]["step"], "broken");
        assert_eq!(json["steps"][1]["outcome"], "failed");
        assert_eq!(json["steps"].as_array().unwrap().len(), 3);
    }
}
