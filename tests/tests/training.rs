//! Real DDP ranks (torch, gloo) in the lab's HK and US hosts across `steady-180ms`, with the
//! linkpilot hook following boards written by `linkpilot board feed`: the lab's own byte
//! counters judge the WAN bytes per step that each codec promises.

use std::sync::LazyLock;

use linkpilot_tests::policy::PolicyToml;
use std::{thread, time::Duration};

use linkpilot_lab::{
    lab::{Host, Lab, LabConfig, Site},
    scenario::{Direction, Scenario},
};
use linkpilot_tests::{
    daemon::{sample, scrape, status_json, wait_for, Daemon},
    ddp_rank::{rank, Feeder, Rank},
};
use serde_json::Value;

/// Steps before measuring (DDP rebuilds its buckets after the first; step 0 uses the safe codec
/// while the ranks agree), then steps measured.
const WARMUP: u64 = 2;
const MEASURED: u64 = 3;
const STEPS: u64 = WARMUP + MEASURED + 1;

fn steady_lab(name: &str, hosts_per_site: u8) -> Lab {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../lab/scenarios/steady-180ms.toml");
    let text = std::fs::read_to_string(path).expect("steady-180ms.toml");
    let scenario = Scenario::parse(&text, path, None).expect("scenario");
    let config = LabConfig { name: name.into(), hosts_per_site, ..LabConfig::default() };
    Lab::start(config, scenario).expect("lab")
}

fn wan_bytes(lab: &Lab) -> u64 {
    lab.stats(Direction::HkToUs).bytes_in + lab.stats(Direction::UsToHk).bytes_in
}

/// What one run measured per step over the measured steps: WAN bytes (the lab's counters, both
/// directions, read while the link is quiet between steps) and what the ranks' hooks say they
/// sent (the sum of every rank's bytes), and the codecs the steps used.
#[derive(Debug)]
struct Run {
    lab_per_step: f64,
    hook_per_step: f64,
    codecs: Vec<String>,
}

fn train(lab: &Lab, codec: &str, per_site: usize, sites: Option<&str>) -> Run {
    let hosts: Vec<Host> = [Site::Hk, Site::Us]
        .into_iter()
        .flat_map(|s| (0..per_site).map(move |i| lab.host(s, i).clone()))
        .collect();
    let world = hosts.len();
    let feeders: Vec<Feeder> = hosts.iter().map(|h| Feeder::new(&h.netns, codec)).collect();
    let extra: Vec<&str> = sites.map(|s| vec!["--sites", s]).unwrap_or_default();
    let mut ranks: Vec<Rank> = hosts
        .iter()
        .zip(&feeders)
        .enumerate()
        .map(|(r, (h, f))| rank(h, &hosts[0], r, world, &f.path, STEPS, &extra, &[]))
        .collect();
    let mut samples = Vec::new();
    let mut rank0 = Vec::new();
    for step in 0..=WARMUP + MEASURED {
        rank0.extend(ranks[0].until("idle", Duration::from_secs(120)));
        assert_eq!(rank0.last().expect("idle")["idle"], step);
        thread::sleep(Duration::from_millis(500)); // the other ranks' last bytes arrive
        if step >= WARMUP {
            samples.push(wan_bytes(lab));
        }
    }
    let measured =
        |v: &Value| v["step"].as_u64().is_some_and(|s| s > WARMUP && s <= WARMUP + MEASURED);
    let mut hook_bytes = 0;
    let mut codecs = Vec::new();
    let mut digests = Vec::new();
    for (i, r) in ranks.iter_mut().enumerate() {
        let mut lines = if i == 0 { std::mem::take(&mut rank0) } else { Vec::new() };
        lines.extend(r.until("done", Duration::from_secs(60)));
        for v in lines.iter().filter(|v| measured(v)) {
            hook_bytes += v["wire_bytes"].as_u64().expect("wire_bytes");
            if i == 0 {
                codecs.push(v["codec"].as_str().expect("codec").to_owned());
            }
        }
        digests.push(lines.last().expect("done")["digest"].as_str().expect("digest").to_owned());
    }
    for r in &mut ranks {
        let status = r.child.wait().expect("rank exit");
        assert!(status.success(), "a rank failed: {status}");
    }
    assert!(digests.iter().all(|d| d == &digests[0]), "replicas differ: {digests:?}");
    let lab_bytes = samples.last().expect("samples") - samples[0];
    Run {
        lab_per_step: lab_bytes as f64 / MEASURED as f64,
        hook_per_step: hook_bytes as f64 / MEASURED as f64,
        codecs,
    }
}

#[test]
fn wan_bytes_per_step_follow_the_codec() {
    let lab = steady_lab("ttrain", 1);
    let runs: Vec<(&str, Run)> =
        ["none", "int8", "int4"].into_iter().map(|c| (c, train(&lab, c, 1, None))).collect();
    for (codec, run) in &runs {
        eprintln!("{codec}: {run:?}");
        assert!(run.codecs.iter().all(|c| c == codec), "steps used {:?}", run.codecs);
        // TCP/IP headers and ACKs come on top of what the hook sends, and nothing else crosses.
        let overhead = run.lab_per_step / run.hook_per_step;
        assert!((1.0..1.10).contains(&overhead), "{codec}: lab/hook bytes {overhead:.3}");
    }
    let none = runs[0].1.lab_per_step;
    for ((_, run), promise) in runs[1..].iter().zip([0.25, 0.125]) {
        let ratio = run.lab_per_step / none;
        assert!((ratio / promise - 1.0).abs() < 0.10, "{ratio:.4} of fp32, promised {promise}");
    }
}

#[test]
fn two_ranks_per_site_send_no_more_across_than_one() {
    let lab = steady_lab("tsite", 2);
    let one = train(&lab, "int8", 1, None);
    let two = train(&lab, "int8", 2, Some("0,1/2,3"));
    eprintln!("1 rank per site: {one:?}\n2 ranks per site (sites): {two:?}");
    assert!(two.codecs.iter().all(|c| c == "int8"), "steps used {:?}", two.codecs);
    assert!(
        two.lab_per_step <= one.lab_per_step * 1.02,
        "2 per site {} B/step > 1 per site {} B/step",
        two.lab_per_step,
        one.lab_per_step
    );
    // Without the site grouping, four ranks gather every payload across: the grouping is
    // what keeps the WAN bytes flat.
    let flat = train(&lab, "int8", 2, None);
    eprintln!("2 ranks per site (flat): {flat:?}");
    assert!(flat.lab_per_step > one.lab_per_step * 1.3, "{flat:?}");
}

/// The daemon on HK with the steady link's policy (its nominal 200 Mbit/s).
static JOB_POLICY: LazyLock<String> = LazyLock::new(|| {
    PolicyToml::new().lab_link("200Mbit/s").state("healthy", "", "", ("int8", 26, 106)).build()
});

/// Two real ranks across the 180 ms link, HK's publishing a job report: HK's daemon shows the
/// job in status and metrics with the bytes per step the rank's own step lines give, a step no
/// shorter than its 1.2 s of compute, an exposed wait of at least the link's round trip (the
/// lab's delay), and forgets the job once the rank is gone.
#[test]
fn a_job_report_feeds_status_and_metrics() {
    let lab = steady_lab("tjobs", 1);
    let (hk, us) = lab.hk_us();
    let dir = linkpilot_tests::temp_dir("train-jobs");
    let mut daemon = Daemon::start(&hk.netns, &dir, &JOB_POLICY);
    let jobs = dir.join("jobs");
    daemon.wait_up();
    assert!(jobs.is_dir(), "the job-report directory");
    let feeders = [Feeder::new("jobs-hk", "int8"), Feeder::new("jobs-us", "int8")];
    let env = [("LINKPILOT_JOBS", jobs.to_str().expect("utf-8")), ("LINKPILOT_JOB", "lab-job")];
    // US's rank reports to a directory its host's daemon would read; not HK's.
    let elsewhere = dir.join("us-jobs");
    std::fs::create_dir_all(&elsewhere).expect("dir");
    let us_env = [("LINKPILOT_JOBS", elsewhere.to_str().expect("utf-8"))];
    // 16 steps: the window (10 s) then holds only steps after the first, whose buckets DDP
    // rebuilds (their bytes differ).
    let extra = ["--safe-codec", "int8", "--steps", "16"];
    let mut ranks = [
        rank(&hk, &hk, 0, 2, &feeders[0].path, STEPS, &extra, &env),
        rank(&us, &hk, 1, 2, &feeders[1].path, STEPS, &extra, &us_env),
    ];
    let mut job = Value::Null;
    wait_for("11 steps reported", Duration::from_secs(120), || {
        job = status_json(&dir)["jobs"][0].clone();
        job["steps"].as_u64().is_some_and(|s| s >= 11)
    });
    eprintln!("status: {job}");
    let metrics = scrape(&hk.netns);
    let mut lines = Vec::new();
    for (i, r) in ranks.iter_mut().enumerate() {
        let seen = r.until("done", Duration::from_secs(120));
        if i == 0 {
            lines = seen;
        }
        assert!(r.child.wait().expect("rank exit").success());
    }
    // What the rank's own step lines say each step after the first sent: one figure.
    let sent: std::collections::BTreeSet<u64> = lines
        .iter()
        .filter(|v| v["step"].as_u64().is_some_and(|s| s >= 1))
        .map(|v| v["wire_bytes"].as_u64().expect("wire_bytes"))
        .collect();
    assert_eq!(sent.len(), 1, "{sent:?}");
    let sent = *sent.first().expect("sent");
    assert_eq!((job["job"].as_str(), job["kind"].as_str()), (Some("lab-job"), Some("ddp")));
    assert_eq!((job["world"].as_u64(), job["ranks"].clone()), (Some(2), serde_json::json!([0])));
    assert_eq!(job["wire_bytes_per_step"].as_f64(), Some(sent as f64), "{job}");
    let step_s = job["step_s"].as_f64().expect("step_s");
    let wait_s = job["wait_s"].as_f64().expect("wait_s");
    assert!(step_s >= 1.2, "a step is at least its 1.2 s of compute: {step_s}");
    assert!((0.18..step_s).contains(&wait_s), "the exchange costs a round trip: {wait_s}");
    let share = job["comm_share"].as_f64().expect("comm_share");
    assert!((share - wait_s / step_s).abs() < 1e-9, "{job}");
    assert_eq!(job["link"].as_str(), Some("wan"));
    assert_eq!(sample(&metrics, "linkpilot_job_ranks{training_job=\"lab-job\"}"), Some(1.0));
    assert!(
        sample(&metrics, "linkpilot_job_rank_steps_total{training_job=\"lab-job\"}")
            .is_some_and(|s| s >= 1.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "linkpilot_job_codec{training_job=\"lab-job\",codec=\"int8\"}"),
        Some(1.0)
    );
    // The rank left without removing its file (os._exit): unlocked, so the daemon removes it.
    wait_for("the job gone from status", Duration::from_secs(10), || {
        status_json(&dir)["jobs"].as_array().is_some_and(Vec::is_empty)
    });
    assert_eq!(std::fs::read_dir(&jobs).expect("jobs").count(), 0);
    assert!(!scrape(&hk.netns).contains("training_job=\"lab-job\""));
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}
