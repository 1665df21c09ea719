//! Decisions judged by the job's outcome, with real DDP ranks (torch, gloo) across the lab: a
//! quiet 30 Mbit/s, 180 ms link, then ECN marks above 1 ms of queue, which move HK's daemon to
//! its "marked" state. Where that state's codec slows the job (no compression on a slow link),
//! the daemon reverts it and holds it off, longer at each revert; where it speeds the job up
//! (int8 instead of none), the change stays. The ranks' own clocks are the oracle of which
//! codec is slower; `linkpilot replay` of the daemon's recording gives the same decisions.

use linkpilot_tests::policy::{PolicyToml, PLAIN};
use std::time::{Duration, Instant};

use linkpilot_lab::{
    lab::{Lab, LabConfig},
    scenario::Scenario,
};
use linkpilot_tests::{
    daemon::{sample, scrape, status_json, Daemon},
    ddp_rank::{rank, Rank},
    linkpilot_bin,
};
use serde_json::Value;

/// The 30 Mbit/s, 180 ms link for 50 s with ECN marks above 1 ms of queue or without, then
/// the other way round for 10 min.
fn scenario(marked_first: bool) -> Scenario {
    let phase = |name: &str, duration: &str, ecn: bool| {
        let ecn = if ecn { "ecn = { mode = \"step\", threshold = \"1ms\" }" } else { "" };
        format!(
            "[[phase]]\nname = \"{name}\"\nduration = \"{duration}\"\n[phase.link]\n\
             delay = \"90ms\"\nrate = \"30Mbit/s\"\nqueue = \"8MiB\"\n{ecn}\n"
        )
    };
    let (a, b) = if marked_first { ("marked", "quiet") } else { ("quiet", "marked") };
    let text = format!(
        "name = \"outcome\"\ndescription = \"ECN marks on and off\"\n{}{}",
        phase(a, "50s", marked_first),
        phase(b, "600s", !marked_first)
    );
    Scenario::parse(&text, "outcome.toml", None).expect("scenario")
}

/// Calm without compression, "marked" (CE >= 1% for 300 ms, left after `exit_after` below)
/// with int8; a judge of 15 s windows, holds of 20 s doubling to 40 s. Compression only gets
/// stronger up the ladder: on this slow link the change that slows the job is leaving
/// "marked".
fn policy(exit_after: &str) -> String {
    PolicyToml::new()
        .table("[host]\ntcp_ecn = 1")
        .table(&format!("[hysteresis]\nexit_after = \"{exit_after}\""))
        .table("[outcome]\nwindow = \"15s\"\nsettle = \"3s\"\nhold = \"20s\"\nhold_max = \"40s\"")
        .lab_link("30Mbit/s")
        .state("calm", "", "", PLAIN)
        .state("marked", "ce_fraction = \"1%\"", "", ("int8", 26, 106))
        .build()
}

/// The lab, HK's daemon on `policy`, and two ranks: HK's following its daemon's board and
/// reporting to it, US's without a board (its safe codec, none, is the weakest: the ranks
/// agree on HK's).
struct Setup {
    _lab: Lab,
    dir: std::path::PathBuf,
    daemon: Option<Daemon>,
    ranks: Vec<Rank>,
    hk: String,
    /// Rank 0's lines so far.
    lines: Vec<Value>,
}

fn setup(tag: &str, marked_first: bool, exit_after: &str) -> Setup {
    let scenario = scenario(marked_first);
    let config = LabConfig { name: tag.into(), hosts_per_site: 1, ..LabConfig::default() };
    let lab = Lab::start(config, scenario).expect("lab");
    let (hk, us) = lab.hk_us();
    // US's side echoes the marks only on connections it negotiated ECN for.
    us.exec(&["sysctl", "-qw", "net.ipv4.tcp_ecn=1"]).expect("sysctl");
    let dir = linkpilot_tests::temp_dir(&format!("outcome-{tag}"));
    let mut daemon = Daemon::start(&hk.netns, &dir, &policy(exit_after));
    let jobs = dir.join("jobs");
    daemon.wait_up();
    assert!(jobs.is_dir(), "the job-report directory");
    let env = [("LINKPILOT_JOBS", jobs.to_str().expect("utf-8")), ("LINKPILOT_JOB", "lab-job")];
    let elsewhere = dir.join("us-jobs");
    std::fs::create_dir_all(&elsewhere).expect("dir");
    let us_env = [("LINKPILOT_JOBS", elsewhere.to_str().expect("utf-8"))];
    let extra = ["--step-sleep", "0.5", "--large-bucket-bytes", "0", "--timeout-s", "300"];
    let nowhere = dir.join("no-board");
    let ranks = vec![
        rank(&hk, &hk, 0, 2, &dir.join("knobs"), 1000, &extra, &env),
        rank(&us, &hk, 1, 2, &nowhere, 1000, &extra, &us_env),
    ];
    Setup { _lab: lab, dir, daemon: Some(daemon), ranks, hk: hk.netns, lines: Vec::new() }
}

impl Setup {
    /// Polls until `done(status)` holds, keeping rank 0's lines; panics with the daemon's log
    /// after `limit`.
    fn until(&mut self, what: &str, limit: Duration, done: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            self.lines.extend(self.ranks[0].drain());
            let _ = self.ranks[1].drain();
            let st = status_json(&self.dir);
            if done(&st) {
                return st;
            }
            let log = self.daemon.as_ref().map(Daemon::log).unwrap_or_default();
            assert!(start.elapsed() < limit, "no {what} within {limit:?}; status {st}\n{log}");
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The decisions the daemon logged.
    /// The jobs of the latest snapshot in the daemon's recording that has any.
    fn recorded_jobs(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.dir.join("trace.jsonl")).unwrap_or_default();
        text.lines()
            .rev()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find_map(|v| v["jobs"].as_array().cloned())
            .unwrap_or_default()
    }

    fn decisions(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.dir.join("decisions.jsonl")).unwrap_or_default();
        text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    /// The rank's steps in order: (codec, seconds from the previous step's end to its own, by
    /// the rank's clock).
    fn steps(&self) -> Vec<(String, f64)> {
        let mut codec = std::collections::BTreeMap::new();
        let mut ends = Vec::new();
        for v in &self.lines {
            if let (Some(s), Some(c)) = (v["step"].as_u64(), v["codec"].as_str()) {
                codec.insert(s, c.to_owned());
            }
            if let (Some(s), Some(t)) = (v["idle"].as_u64(), v["t"].as_f64()) {
                ends.push((s, t));
            }
        }
        ends.windows(2)
            .filter_map(|w| {
                let c = codec.get(&w[1].0)?;
                Some((c.clone(), w[1].1 - w[0].1 - 0.5))
            })
            .collect()
    }

    /// Stops the daemon, then replays its recording on its policy: the same decisions, and the
    /// plan the daemon had in place when it was last asked is the replay's at that snapshot.
    fn replay_matches(&mut self) {
        let in_place = status_json(&self.dir)["plan"].clone();
        drop(self.daemon.take());
        // `linkpilot replay FLAG` of the recording on its policy: one JSON value per line.
        let replay = |flag: &str| -> Vec<Value> {
            let out = linkpilot_tests::run(&[
                &linkpilot_bin().display().to_string(),
                "replay",
                flag,
                "--policy",
                &self.dir.join("policy.toml").display().to_string(),
                &self.dir.join("trace.jsonl").display().to_string(),
            ]);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(|l| serde_json::from_str(l).expect("JSON"))
                .collect()
        };
        let replayed = replay("--json");
        let logged = self.decisions();
        let key = |d: &Value| (d["id"].clone(), d["state"].clone(), d["changes"].clone());
        assert!(logged.len() >= 2, "{logged:?}");
        let (l, r): (Vec<_>, Vec<_>) = (
            logged.iter().map(key).collect(),
            replayed.iter().map(key).take(logged.len()).collect(),
        );
        assert_eq!(l, r, "replayed decisions differ from the logged ones");
        for (a, b) in logged.iter().zip(&replayed) {
            assert_eq!(a["reason"], b["reason"]);
        }
        let at = in_place["at_ms"].as_u64().unwrap_or_else(|| panic!("no plan: {in_place}"));
        let plans = replay("--plans");
        let replayed = plans.iter().find(|p| p["at_ms"].as_u64() == Some(at));
        assert_eq!(replayed, Some(&in_place), "the replay's plan at {at} ms");
        let link = &in_place["links"][0];
        assert!(link["decision"].as_u64() >= Some(2) && link["peers"][0] == "us", "{in_place}");
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.ranks.clear();
        drop(self.daemon.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn mean(steps: &[(String, f64)], codec: &str) -> f64 {
    let v: Vec<f64> = steps.iter().filter(|(c, _)| c == codec).map(|(_, s)| *s).collect();
    assert!(v.len() >= 3, "{codec}: {steps:?}");
    v.iter().sum::<f64>() / v.len() as f64
}

fn reverts(decisions: &[Value]) -> Vec<String> {
    decisions
        .iter()
        .filter_map(|d| d["reason"].as_str())
        .filter(|r| r.contains("reverted"))
        .map(str::to_owned)
        .collect()
}

/// Marks first: the daemon moves to "marked" (int8); once they stop it leaves it for calm
/// (none), which on this link slows the job: reverted, held off 20 s, left again, reverted again
/// and held off 40 s.
#[test]
fn a_change_that_slows_the_job_is_reverted_and_backed_off() {
    let mut s = setup("oslow", true, "2s");
    let st = s.until("two reverts", Duration::from_secs(300), |st| {
        st["held"][0]["reverts"].as_u64() == Some(2)
    });
    let reverts = reverts(&s.decisions());
    assert_eq!(reverts.len(), 2, "{reverts:?}");
    assert!(reverts[0].starts_with("marked: outcome of marked -> calm: jobs"), "{reverts:?}");
    assert!(reverts[0].contains("held off for 20.0 s"), "{}", reverts[0]);
    assert!(reverts[1].contains("held off for 40.0 s"), "{}", reverts[1]);
    assert_eq!(st["links"][0]["state"], "marked", "{st}");
    assert_eq!(st["verdicts"][0]["verdict"], "reverted", "{st}");
    let m = scrape(&s.hk);
    let series = "linkpilot_outcome_verdicts_total{link=\"wan\",verdict=\"reverted\"}";
    assert_eq!(sample(&m, series), Some(2.0), "{m}");
    assert_eq!(sample(&m, "linkpilot_outcome_held_changes{link=\"wan\"}"), Some(1.0), "{m}");
    // The ranks' own clocks: uncompressed steps were the slower ones, and the ranks went back
    // to int8 after each revert.
    s.lines.extend(s.ranks[0].drain());
    let steps = s.steps();
    let (int8, none) = (mean(&steps, "int8"), mean(&steps, "none"));
    assert!(none > int8 * 1.1, "none {none:.2} s vs int8 {int8:.2} s a step");
    let mut runs: Vec<&str> = steps.iter().map(|(c, _)| c.as_str()).collect();
    runs.dedup();
    assert!(runs.windows(4).any(|w| w == ["int8", "none", "int8", "none"]), "{runs:?}");
    eprintln!("int8 {int8:.2} s, none {none:.2} s a step; {reverts:#?}");
    s.replay_matches();
}

/// Marks after 50 s quiet: the daemon moves from calm (none) to "marked" (int8), which speeds
/// the job up on this link: kept.
#[test]
fn a_change_that_helps_the_job_is_kept() {
    let mut s = setup("okeep", false, "600s");
    let st = s.until("a judgment", Duration::from_secs(240), |st| {
        st["verdicts"].as_array().is_some_and(|v| !v.is_empty())
    });
    assert_eq!(st["verdicts"][0]["verdict"], "kept", "{st}");
    assert_eq!(st["links"][0]["state"], "marked", "{st}");
    assert!(reverts(&s.decisions()).is_empty());
    let steps = s.steps();
    let (int8, none) = (mean(&steps, "int8"), mean(&steps, "none"));
    assert!(int8 < none, "int8 {int8:.2} s vs none {none:.2} s a step");
    eprintln!("int8 {int8:.2} s, none {none:.2} s a step; {}", st["verdicts"][0]);
    // What the recording carries of the job for `compression = "auto"`: its kind, compute and
    // wire bytes, against the rank's own step lines (read after: they only add to them).
    let jobs = s.recorded_jobs();
    let j = jobs.first().unwrap_or_else(|| panic!("no jobs in the recording"));
    assert_eq!((j["kind"].as_str(), j["processes"].as_u64()), (Some("ddp"), Some(1)), "{j}");
    let (compute, step_s) = (j["compute_seconds"].as_f64(), j["step_seconds"].as_f64());
    assert!(compute.zip(step_s).is_some_and(|(c, t)| c > 0.0 && c <= t), "{j}");
    std::thread::sleep(Duration::from_secs(2));
    s.lines.extend(s.ranks[0].drain());
    let sent: u64 = s.lines.iter().filter_map(|v| v["wire_bytes"].as_u64()).sum();
    let wire = j["wire_bytes"].as_u64().unwrap_or(0);
    assert!(wire > 0 && wire <= sent, "the daemon counted {wire} B, the rank's lines {sent} B");
    s.replay_matches();
}
