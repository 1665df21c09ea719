//! Job reports: training processes (the DDP hook, the cross-site synchronizer) publish what the
//! network costs their step, one file per process in a [`drop_dir`] (`python/linkpilot/
//! jobreport.py` writes them): exactly [`REPORT_SIZE`] bytes of JSON padded with spaces, its
//! counters totals since the process started. Anyone's: every field is checked, and a report
//! that fails a check is refused with the reason, never half-taken.

use std::{io, path::Path};

use serde::{Deserialize, Serialize};

use super::drop_dir;

/// Where training processes write unless `LINKPILOT_JOBS` says otherwise.
pub const DEFAULT_DIR: &str = "/run/linkpilot/jobs";
/// Every report file has exactly this many bytes.
pub const REPORT_SIZE: usize = 1024;
pub const VERSION: u32 = 1;
/// More ranks than any job has; bounds what one report may claim.
const MAX_WORLD: u32 = 1 << 20;
/// A total larger than this (seconds: 31 years of steps) is not a real one.
const MAX_SECONDS: f64 = 1e9;

/// One training process's report, as written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobReport {
    pub version: u32,
    /// `[A-Za-z0-9_.:-]`, 1-64 characters: a metric label.
    pub job: String,
    pub rank: u32,
    pub world: u32,
    /// What publishes it: "ddp" or "outer"; "init" from the process group's start until one
    /// of those takes the report over.
    pub kind: String,
    /// The policy link the job's cross-site traffic takes (None: the policy's first).
    #[serde(default)]
    pub link: Option<String>,
    /// Totals since the process started.
    pub steps: u64,
    pub step_s: f64,
    pub compute_s: f64,
    /// Communication no compute hid.
    pub wait_s: f64,
    pub wire_bytes: u64,
    /// Collectives or exchanges that failed.
    #[serde(default)]
    pub failed: u64,
    /// The codec and sync interval (steps) in force.
    pub codec: String,
    #[serde(default)]
    pub sync_every: Option<u32>,
    #[serde(default)]
    pub loss: Option<f64>,
    /// The writer's network namespace: its inode number (`/proc/self/ns/net`) and cookie
    /// (`SO_NETNS_COOKIE`, Linux 5.14+), as the writer says. A policy with `job_namespaces`
    /// acts in a namespace a report names besides the daemon's own.
    #[serde(default)]
    pub netns: Option<u32>,
    #[serde(default)]
    pub netns_cookie: Option<u64>,
}

/// A name that may become a metric label.
fn label_like(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b))
}

/// A report file's bytes (anyone's), or why they are not one.
pub fn parse(bytes: &[u8]) -> Result<JobReport, String> {
    if bytes.len() != REPORT_SIZE {
        return Err(format!("not a job report ({} bytes, one has {REPORT_SIZE})", bytes.len()));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_owned())?;
    let r: JobReport =
        serde_json::from_str(text.trim_end()).map_err(|e| format!("not a job report: {e}"))?;
    if r.version != VERSION {
        return Err(format!("version {} (this daemon reads {VERSION})", r.version));
    }
    if !label_like(&r.job) {
        return Err("job: 1-64 of [A-Za-z0-9_.:-]".into());
    }
    if r.link.as_deref().is_some_and(|l| !label_like(l)) {
        return Err("link: 1-64 of [A-Za-z0-9_.:-]".into());
    }
    if !matches!(r.kind.as_str(), "ddp" | "outer" | "init") {
        return Err("kind: \"ddp\", \"outer\" or \"init\"".into());
    }
    if r.codec.len() > 16 || !label_like(&r.codec) {
        return Err("codec: 1-16 of [A-Za-z0-9_.:-]".into());
    }
    if r.world == 0 || r.world > MAX_WORLD || r.rank >= r.world {
        return Err(format!("rank {} of world {}", r.rank, r.world));
    }
    for (name, v) in [("step_s", r.step_s), ("compute_s", r.compute_s), ("wait_s", r.wait_s)] {
        if !(0.0..=MAX_SECONDS).contains(&v) {
            return Err(format!("{name} {v:e}: not a total of seconds"));
        }
    }
    // Written as step_s = compute_s + wait_s, rounded to microseconds each.
    if (r.compute_s + r.wait_s - r.step_s).abs() > 1e-5 * (1.0 + r.step_s) {
        return Err("compute_s + wait_s is not step_s".into());
    }
    if r.loss.is_some_and(|l| !l.is_finite()) {
        return Err("loss is not a finite number".into());
    }
    Ok(r)
}

/// The live reports of `dir` by file name; `refused` is told each file not taken and why.
/// Dead processes' files are removed when `clean` is set.
pub fn scan(
    dir: &Path,
    clean: bool,
    refused: impl FnMut(&str, String),
) -> Vec<(String, JobReport)> {
    drop_dir::scan(dir, clean, REPORT_SIZE, "job report", |_, b| parse(b), refused)
}

/// Creates the directory for the reports (see [`drop_dir::create_dir`]).
pub fn create_dir(dir: &Path) -> io::Result<()> {
    drop_dir::create_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As `python/linkpilot/jobreport.py` writes it (its own test writes this same text).
    pub const WRITTEN: &str = r#"{"version":1,"job":"lm-7","rank":1,"world":4,"kind":"ddp","link":"wan","steps":12,"step_s":3.5,"compute_s":2.75,"wait_s":0.75,"wire_bytes":1200000,"failed":0,"codec":"int8","sync_every":null,"loss":2.25,"netns":4026531993,"netns_cookie":4099,"updated":1796198400.5}"#;

    fn padded(text: &str) -> Vec<u8> {
        let mut b = text.as_bytes().to_vec();
        b.resize(REPORT_SIZE - 1, b' ');
        b.push(b'\n');
        b
    }

    #[test]
    fn reads_what_the_training_side_writes() {
        let r = parse(&padded(WRITTEN)).unwrap();
        assert_eq!((r.job.as_str(), r.rank, r.world, r.steps), ("lm-7", 1, 4, 12));
        assert_eq!((r.wait_s, r.wire_bytes, r.codec.as_str()), (0.75, 1_200_000, "int8"));
        assert_eq!((r.link.as_deref(), r.sync_every, r.loss), (Some("wan"), None, Some(2.25)));
        assert_eq!((r.netns, r.netns_cookie), (Some(4026531993), Some(4099)));
        // Started with the process group, before a hook took it over.
        let started = parse(&padded(&WRITTEN.replace(r#""ddp""#, r#""init""#))).unwrap();
        assert_eq!(started.kind, "init");
    }

    #[test]
    fn hostile_reports_are_refused_with_the_reason() {
        let cases = [
            (WRITTEN.replace("lm-7", "a\\nb"), "job: 1-64"),
            (WRITTEN.replace("lm-7", &"x".repeat(65)), "job: 1-64"),
            (WRITTEN.replace(r#""wan""#, r#""w a n""#), "link: 1-64"),
            (WRITTEN.replace(r#""rank":1"#, r#""rank":4"#), "rank 4 of world 4"),
            (WRITTEN.replace(r#""world":4"#, r#""world":0"#), "rank 1 of world 0"),
            (WRITTEN.replace("3.5", "-3.5"), "step_s -3.5e0"),
            (WRITTEN.replace("3.5", "1e300"), "step_s 1e300"),
            (WRITTEN.replace("0.75", "0.5"), "compute_s + wait_s is not step_s"),
            (WRITTEN.replace(r#""steps":12"#, r#""steps":-1"#), "not a job report"),
            (WRITTEN.replace("1200000", "18446744073709551616"), "not a job report"),
            (WRITTEN.replace(r#""version":1"#, r#""version":2"#), "version 2"),
            (WRITTEN.replace(r#""ddp""#, r#""nccl""#), "kind"),
            (WRITTEN.replace("int8", "int8-with-a-long-name"), "codec: 1-16"),
            (WRITTEN.replace("2.25", "NaN"), "not a job report"),
            (WRITTEN.replace("4026531993", "4294967296"), "not a job report"),
            (WRITTEN[..40].to_owned(), "not a job report"),
        ];
        for (text, want) in cases {
            let e = parse(&padded(&text)).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
        assert!(parse(WRITTEN.as_bytes()).unwrap_err().contains("bytes, one has 1024"));
        let mut bad = padded(WRITTEN);
        bad[3] = 0xff;
        assert_eq!(parse(&bad).unwrap_err(), "not UTF-8");
    }
}
