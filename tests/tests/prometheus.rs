//! The fleet's monitoring against a real Prometheus server: it scrapes `linkpilot run` on the lab
//! while iperf3 congests the link; `promtool` judges the exposition and the alert rules; every
//! PromQL query of the shipped Grafana dashboard, its variables replaced as Grafana does,
//! returns data through Prometheus's HTTP API; every metric family has a panel. The policy
//! comes from a directory laid out as kubelet mounts a ConfigMap, and is reloaded the way a
//! ConfigMap edit reaches a node (the `..data` link swapped).

use std::sync::LazyLock;

use linkpilot_tests::policy::PolicyToml;
use linkpilot_tests::rdma::RdmaFixture;
use std::{
    collections::BTreeSet,
    io::Write as _,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use linkpilot_tests::{
    configmap::ConfigMapDir,
    daemon::{ecn_lab, iperf3_client, iperf3_server, scrape, wait_for, Daemon},
    grafana, oracle,
    prometheus::{Prometheus, SCRAPE_INTERVAL_S},
    python,
    tuner::TrainingProcess,
    Reaped,
};
use nix::{sys::signal::Signal, unistd::Pid};

const RULES: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/prometheus/linkpilot-rules.yml");

static POLICY: LazyLock<String> = LazyLock::new(|| {
    PolicyToml::new()
        .hysteresis("30s", "1s")
        .lab_link("50Mbit/s")
        .healthy()
        .raw("[state.transport]\ncongestion_control = \"cubic\"")
        .congested_on_ce(10, 42)
        .build()
});

/// Steps of a synchronizer job every 0.2 s through `linkpilot.jobreport`, into the directory
/// its argument names.
const JOB_WRITER: &str = r#"
import sys, time
from linkpilot.jobreport import JobReport
r = JobReport(sys.argv[1], rank=0, world=2, kind="outer", job="prom")
while True:
    r.step(step_s=0.2, wait_s=0.05, wire_bytes=100_000, codec="int8", sync_every=16)
    r.set_loss(2.5)
    time.sleep(0.2)
"#;

/// `promtool check metrics` on an exposition: its complaints, empty when it passes.
fn promtool_check_metrics(exposition: &str) -> Result<(), String> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package `prometheus`)");
    child.stdin.take().expect("stdin").write_all(exposition.as_bytes()).expect("write");
    let out = child.wait_with_output().expect("promtool");
    let said =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() && said.trim().is_empty() {
        Ok(())
    } else {
        Err(format!("{}: {said}", out.status))
    }
}

/// Metric family names of an exposition (`# TYPE` lines), as PromQL names their series
/// (counters with `_total`).
fn families(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| match kind.trim() {
            "counter" if !name.ends_with("_total") => format!("{name}_total"),
            _ => name.to_owned(),
        })
        .collect()
}

#[test]
fn prometheus_scrapes_the_daemon_and_every_dashboard_query_returns_data() {
    let (_lab, hk, us) = ecn_lab("flprom", "10ms");
    let dir = linkpilot_tests::temp_dir("prometheus");
    // The policy as the DaemonSet's ConfigMap volume presents it at /etc/linkpilot.
    let mut config =
        ConfigMapDir::create(&dir.join("etc-linkpilot"), &[("policy.toml", POLICY.as_str())]);
    let policy = config.dir.join("policy.toml").display().to_string();
    let mut extra = vec!["--policy".to_owned(), policy];
    // The ConnectX sysfs fixture with port 1 on eth0 and an rdma_cm configfs fixture, so that
    // the NIC series exist.
    extra.extend(RdmaFixture::create(&dir, "eth0").args());
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let mut d = Daemon::start_with(&hk.netns, &dir, "", &extra);
    wait_for("the metrics endpoint", Duration::from_secs(20), || {
        if let Ok(Some(status)) = d.child.try_wait() {
            panic!("linkpilot run exited ({status}): {}", d.log());
        }
        hk.exec(&["curl", "-sf", "http://127.0.0.1:9464/metrics"]).is_ok()
    });
    let prom =
        Prometheus::start(&hk, &dir.join("prometheus"), "127.0.0.1:9464", &[Path::new(RULES)]);
    let promql = |q: &str| prom.query(q).unwrap_or_else(|e| panic!("{e}\n{}", prom.log()));

    // Real traffic for the rest of the test: the path marks CE, the link goes congested.
    let _server = Reaped::new(iperf3_server(&us));
    let client = Reaped::new(iperf3_client(&hk, &us, &["-C", "cubic", "-t", "120"]));
    wait_for("congested, as Prometheus sees it", Duration::from_secs(15), || {
        !promql("linkpilot_link_state{link=\"wan\",state=\"congested\"} == 1").is_empty()
    });

    // A ConfigMap edit reaching the node: the ..data link swapped to a new version.
    config.update(&[("policy.toml", &POLICY.replacen("dscp = 10", "dscp = 12", 1))]);
    wait_for(
        "the ConfigMap's policy applied, as Prometheus sees it",
        Duration::from_secs(10),
        || !promql("linkpilot_knob_dscp{link=\"wan\"} == 12").is_empty(),
    );
    assert_eq!(prom.value("linkpilot_policy_reloads_total{result=\"applied\"}"), 1.0);
    // Which version runs: one series, the digest of the file the node was given.
    let running = oracle::sha256sum(&config.dir.join("policy.toml"));
    let info = format!("linkpilot_policy_info{{sha256=\"{running}\"}}");
    assert_eq!((prom.value(&info), prom.value("count(linkpilot_policy_info)")), (1.0, 1.0));
    let log = d.log();
    assert!(log.contains("policy.toml changed: reloading"), "{log}");
    // An invalid one: rejected, the running policy kept, and the alert fires.
    config.update(&[("policy.toml", &POLICY.replacen("dscp = 10", "dscp = 99", 1))]);
    wait_for("LinkpilotPolicyRejected firing", Duration::from_secs(15), || {
        let alerts = prom.api("/api/v1/alerts", &[]).expect("alerts");
        alerts["alerts"].as_array().into_iter().flatten().any(|a| {
            a["labels"]["alertname"] == "LinkpilotPolicyRejected" && a["state"] == "firing"
        })
    });
    assert_eq!(prom.value("linkpilot_knob_dscp{link=\"wan\"}"), 12.0, "the running policy stays");
    assert_eq!((prom.value(&info), prom.value("count(linkpilot_policy_info)")), (1.0, 1.0));

    // A training process with the NCCL tuner plugin, so that the tuner's series exist.
    let _training =
        TrainingProcess::start(&dir.join("training"), &dir.join("knobs"), &dir.join("tuner"));
    wait_for("the tuner's choices, as Prometheus sees them", Duration::from_secs(10), || {
        !promql("linkpilot_nccl_tuner_choices").is_empty()
    });

    // A training process publishing a job report through the training side's own writer (a
    // synchronizer job: with a loss and a sync interval), so that the jobs' series exist.
    let _job = Reaped::new(
        Command::new(python())
            .args(["-c", JOB_WRITER, dir.join("jobs").to_str().expect("utf-8")])
            .spawn()
            .expect("the job-report writer"),
    );
    wait_for("the job's rates, as Prometheus sees them", Duration::from_secs(20), || {
        !promql("linkpilot_job_steps_per_second{training_job=\"prom\"}").is_empty()
    });

    // Enough samples for every rate and increase window of the dashboard, of the job's series
    // too (they start with the job, later than the others).
    wait_for("5 scrapes of the job's counters", Duration::from_secs(20), || {
        !promql("count_over_time(linkpilot_job_wire_bytes_total[1m]) >= 5").is_empty()
    });
    wait_for("10 scrapes", Duration::from_secs(20), || {
        !promql("count_over_time(linkpilot_ticks_total[1m]) >= 10").is_empty()
    });

    // Under steady traffic the peer's RTT is in every scrape, also those that fall between two
    // readings of the flow table (which is read less often than ticks come).
    let scrapes = "count_over_time(linkpilot_ticks_total[10s])";
    let srtt = "count_over_time(linkpilot_peer_rtt_seconds{peer=\"us\",stat=\"srtt\"}[10s])";
    assert_eq!(prom.value(srtt), prom.value(scrapes), "srtt missing from some scrapes");

    // The exposition itself, judged by promtool.
    let exposition = scrape(&hk.netns);
    promtool_check_metrics(&exposition).unwrap_or_else(|e| panic!("promtool check metrics: {e}"));

    // Every family the daemon exports has a panel.
    let dashboard = grafana::load();
    let queries = grafana::queries(&dashboard);
    let queried: BTreeSet<String> = queries
        .iter()
        .flat_map(|q| grafana::metric_names(&q.expr))
        .map(|n| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .unwrap_or(&n)
                .to_owned()
        })
        .collect();
    let exported = families(&exposition);
    let no_panel: Vec<_> = exported.difference(&queried).collect();
    assert!(no_panel.is_empty(), "families without a panel: {no_panel:?}");
    let unknown: Vec<_> = queried.difference(&exported).collect();
    assert!(unknown.is_empty(), "the dashboard queries what the daemon lacks: {unknown:?}");

    // Grafana's variables: each label_values() query has values; "All" is the allValue regex.
    let scrape = SCRAPE_INTERVAL_S;
    let mut values = vec![
        ("__interval".to_owned(), format!("{scrape}s")),
        // Grafana: max($__interval + scrape interval, 4 x scrape interval).
        ("__rate_interval".to_owned(), format!("{}s", (scrape + scrape).max(4 * scrape))),
    ];
    for v in grafana::variables(&dashboard) {
        let selector = grafana::substitute(&v.selector, &values);
        let found = prom.label_values(&selector, &v.label);
        assert!(
            !found.is_empty(),
            "variable ${}: label_values({selector}, {}) is empty",
            v.name,
            v.label
        );
        let value = v.all_value.clone().unwrap_or_else(|| found[0].clone());
        values.push((v.name.clone(), value));
    }

    // Every query returns data.
    let mut empty = Vec::new();
    for q in &queries {
        let expr = grafana::substitute(&q.expr, &values);
        assert!(!expr.contains('$'), "{}/{}: a variable left in {expr}", q.panel, q.ref_id);
        match prom.query(&expr) {
            Ok(r) if !r.is_empty() => {}
            Ok(_) => empty.push(format!("{} ({}): {expr}", q.panel, q.ref_id)),
            Err(e) => empty.push(format!("{} ({}): {e}", q.panel, q.ref_id)),
        }
    }
    assert!(
        empty.is_empty(),
        "{} of {} queries returned no data:\n{}",
        empty.len(),
        queries.len(),
        empty.join("\n")
    );
    eprintln!(
        "{} dashboard queries, all returned data; {} families, all with a panel",
        queries.len(),
        exported.len()
    );

    // The alert rules: loaded and evaluated without error.
    let rules = prom.api("/api/v1/rules", &[]).expect("rules");
    let all: Vec<&serde_json::Value> = rules["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(all.len(), 8, "{rules}");
    for r in all {
        assert_eq!(r["health"], "ok", "rule {}: {}", r["name"], r["lastError"]);
    }

    drop(client);
    nix::sys::signal::kill(Pid::from_raw(d.child.id() as i32), Signal::SIGTERM).expect("SIGTERM");
    assert!(d.child.wait().expect("exit").success(), "{}", d.log());
    drop(prom);
    let _ = std::fs::remove_dir_all(&dir);
}
