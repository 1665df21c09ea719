use super::*;
use crate::board::tuner_stats::{TunerChoice, TunerProcess};

#[test]
fn retain_removes_the_series_of_renamed_links_states_and_peers() {
    let m = Metrics::new(false);
    let k = Knobs {
        compression: crate::control::knobs::Compression::None,
        chunk_bytes: 1 << 20,
        nccl_ib_timeout: 18,
        nccl_ib_retry_cnt: 7,
        watchdog_s: 600,
        dscp: Some(26),
        roce_traffic_class: Some(106),
        tcp_buffer_bytes: 1 << 22,
        sync: Default::default(),
        transport: None,
    };
    let s = Signals { rtt_ms: Some(20.0), rtt_p99_ms: Some(30.0), ..Signals::default() };
    let own = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let peer = |iface: &str, peer: &str| crate::sense::sensors::PeerSnapshot {
        link: iface.into(),
        peer: peer.into(),
        rtt: crate::sense::sensors::RttSnapshot { srtt_ms: Some(20.0), ..Default::default() },
        ..Default::default()
    };
    let snap = |peers| Snapshot { peers, ..Snapshot::default() };
    m.link("wan", &own(&["healthy", "congested"]), "healthy", &k, &s);
    m.decision("wan", "healthy");
    m.snapshot(&snap(vec![peer("eth0", "b"), peer("eth0", "other")]), true);
    // Renamed: the state, the link and the peer.
    m.retain(&own(&["lan"]), &own(&["calm", "congested"]), &[("eth0".into(), "other".into())]);
    m.link("lan", &own(&["calm", "congested"]), "calm", &k, &Signals::default());
    m.snapshot(&snap(vec![peer("eth0", "other")]), true);
    let text = m.render();
    let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    for old in ["\"healthy\"", "link=\"wan\"", "peer=\"b\""] {
        assert!(!samples.iter().any(|l| l.contains(old)), "{old} left in:\n{text}");
    }
    let on: Vec<&&str> = samples
        .iter()
        .filter(|l| l.starts_with("linkpilot_link_state{") && l.ends_with(" 1"))
        .collect();
    assert_eq!(on, [&"linkpilot_link_state{link=\"lan\",state=\"calm\"} 1"], "{text}");
    // Unmeasured RTT has no series (the new link's signals have none).
    assert!(!samples.iter().any(|l| l.starts_with("linkpilot_link_rtt_seconds")), "{text}");
    assert!(samples.iter().any(|l| l.contains("peer=\"other\",stat=\"srtt\"")), "{text}");
}

#[test]
fn tuner_choices_are_counted_and_forgotten_when_gone() {
    let m = Metrics::new(false);
    let choice = |algo: Option<&str>, own: Option<&str>| TunerChoice {
        collective: "allreduce".into(),
        algo: algo.map(str::to_owned),
        proto: algo.map(|_| "simple".to_owned()),
        own_choice: own.map(str::to_owned),
        ..TunerChoice::default()
    };
    let p = TunerProcess {
        calls: 10,
        adopted_calls: 8,
        choices: vec![
            choice(Some("tree"), None),
            choice(Some("tree"), None),
            choice(None, Some("x")),
        ],
        ..TunerProcess::default()
    };
    m.tuner(&[p.clone(), p]);
    let text = m.render();
    for line in [
        "linkpilot_nccl_tuner_processes 2",
        "linkpilot_nccl_tuner_calls{result=\"adopted\"} 16",
        "linkpilot_nccl_tuner_calls{result=\"own\"} 4",
        "linkpilot_nccl_tuner_choices{collective=\"allreduce\",algo=\"tree\",proto=\"simple\"} 4",
        "linkpilot_nccl_tuner_choices{collective=\"allreduce\",algo=\"nccl\",proto=\"nccl\"} 2",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
    }
    m.tuner(&[]);
    let text = m.render();
    assert!(!text.contains("algo=\"tree\""), "{text}");
    assert!(text.lines().any(|l| l == "linkpilot_nccl_tuner_processes 0"), "{text}");
}

#[test]
fn srtt_holds_between_flow_table_readings() {
    let m = Metrics::new(false);
    let peer = |srtt_ms| Snapshot {
        peers: vec![crate::sense::sensors::PeerSnapshot {
            link: "eth0".into(),
            peer: "us".into(),
            rtt: crate::sense::sensors::RttSnapshot { srtt_ms, ..Default::default() },
            ..Default::default()
        }],
        ..Snapshot::default()
    };
    let srtt = |m: &Metrics| {
        m.render()
            .lines()
            .find(|l| l.starts_with("linkpilot_peer_rtt_seconds{") && l.contains("srtt"))
            .map(str::to_owned)
    };
    m.snapshot(&peer(Some(20.0)), true);
    let read = srtt(&m);
    assert!(read.as_deref().is_some_and(|l| l.ends_with(" 0.02")), "{read:?}");
    // Ticks between readings have no samples by construction: the last reading's value stays.
    m.snapshot(&peer(None), false);
    assert_eq!(srtt(&m), read);
    // A reading without samples (an idle peer): gone.
    m.snapshot(&peer(None), true);
    assert_eq!(srtt(&m), None);
}

#[test]
fn the_policy_digest_is_one_series_that_follows_reloads() {
    let m = Metrics::new(false);
    let digest = |bytes: &[u8]| crate::control::policy::sha256_hex(bytes);
    // sha256sum of an empty file, as coreutils prints it.
    assert_eq!(digest(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    m.policy(&digest(b"v1"));
    m.policy(&digest(b"v2"));
    let text = m.render();
    let info: Vec<&str> =
        text.lines().filter(|l| l.starts_with("linkpilot_policy_info{")).collect();
    assert_eq!(
        info,
        [format!("linkpilot_policy_info{{sha256=\"{}\"}} 1", digest(b"v2"))],
        "{text}"
    );
}

/// A job's codec series follows its codec; a job whose processes are gone loses its series,
/// and the refusal counters exist at 0 before any refusal.
#[test]
fn job_series_follow_the_jobs_and_go_with_them() {
    use crate::daemon::jobs::{Added, JobStatus, Reading};
    let m = Metrics::new(false);
    let job = |codec: &str| JobStatus {
        job: "lm".into(),
        codec: codec.into(),
        ranks: vec![0, 1],
        comm_share: Some(0.25),
        ..JobStatus::default()
    };
    let added = [("lm".to_owned(), Added { steps: 4, wire_bytes: 1000, ..Added::default() })];
    let mut reading =
        Reading { jobs: vec![job("int8")], added: added.into_iter().collect(), refused: vec![] };
    m.jobs.update(&reading);
    reading.jobs = vec![job("int4")];
    reading.refused = vec![("implausible: a total went down".into(), "1-0123456789abcdef".into())];
    m.jobs.update(&reading);
    let text = m.render();
    for want in [
        "linkpilot_job_codec{training_job=\"lm\",codec=\"int4\"} 1",
        "linkpilot_job_rank_steps_total{training_job=\"lm\"} 8",
        "linkpilot_job_wire_bytes_total{training_job=\"lm\"} 2000",
        "linkpilot_job_comm_share{training_job=\"lm\"} 0.25",
        "linkpilot_job_ranks{training_job=\"lm\"} 2",
        "linkpilot_job_reports_refused_total{reason=\"implausible\"} 1",
        "linkpilot_job_reports_refused_total{reason=\"malformed\"} 0",
    ] {
        assert!(text.lines().any(|l| l == want), "no {want} in:\n{text}");
    }
    assert!(!text.contains("codec=\"int8\""), "{text}");
    m.jobs.update(&Reading::default());
    let text = m.render();
    assert!(!text.contains("training_job="), "{text}");
}

#[test]
fn outcome_series_follow_the_policys_links_and_keep_their_counts() {
    let m = Metrics::new(false);
    let verdict = |link: &str| crate::control::outcome::Verdict {
        at_ms: 0,
        link: link.into(),
        from: "calm".into(),
        to: "marked".into(),
        verdict: "reverted".into(),
        before: None,
        after: None,
        why: String::new(),
        hold_s: Some(20.0),
    };
    let held = |link: &str| crate::control::outcome::HeldChange {
        link: link.into(),
        from: "marked".into(),
        to: "calm".into(),
        remaining_s: 20.0,
        reverts: 1,
    };
    m.outcome.update(["wan", "lan"].into_iter(), &[]);
    m.outcome.verdict(&verdict("wan"));
    m.outcome.update(["wan", "lan"].into_iter(), &[held("wan")]);
    let text = m.render();
    let has = |t: &str, s: &str| t.lines().any(|l| l == s);
    assert!(has(&text, "linkpilot_outcome_verdicts_total{link=\"wan\",verdict=\"reverted\"} 1"));
    assert!(has(&text, "linkpilot_outcome_verdicts_total{link=\"lan\",verdict=\"kept\"} 0"));
    assert!(has(&text, "linkpilot_outcome_held_changes{link=\"wan\"} 1"), "{text}");
    // A reload drops "lan"; "wan" keeps its count.
    m.outcome.update(["wan"].into_iter(), &[]);
    let text = m.render();
    assert!(!text.contains("link=\"lan\""), "{text}");
    assert!(has(&text, "linkpilot_outcome_verdicts_total{link=\"wan\",verdict=\"reverted\"} 1"));
    assert!(has(&text, "linkpilot_outcome_held_changes{link=\"wan\"} 0"));
}

#[test]
fn codec_series_show_the_latest_prediction_and_count_verdicts() {
    use crate::control::{codec, Compression};
    let m = Metrics::new(false);
    let prediction = codec::Prediction {
        codec: Compression::Int8,
        exchange_s: 0.34,
        wait_s: 0.0,
        compute_s: 0.6,
        rate_bps: 5e8,
        rtt_ms: 180.0,
        payload_bytes: 4e7,
        hidden_s: 0.6,
    };
    let mut check = codec::Check::new(std::time::Duration::from_secs(3), "wan", prediction);
    m.codec.update(std::slice::from_ref(&check));
    let text = m.render();
    let has = |t: &str, s: &str| t.lines().any(|l| l == s);
    assert!(
        has(&text, "linkpilot_codec_predicted_seconds{link=\"wan\",of=\"exchange\"} 0.34"),
        "{text}"
    );
    assert!(has(&text, "linkpilot_codec_measured_wait_seconds{link=\"wan\"} NaN"), "{text}");
    assert!(has(
        &text,
        "linkpilot_codec_predictions_total{link=\"wan\",verdict=\"mispredicted\"} 0"
    ));
    check.verdict = "mispredicted".into();
    check.measured_wait_s = Some(0.22);
    m.codec.judged(&check);
    m.codec.update(std::slice::from_ref(&check));
    let text = m.render();
    assert!(has(&text, "linkpilot_codec_measured_wait_seconds{link=\"wan\"} 0.22"), "{text}");
    assert!(has(
        &text,
        "linkpilot_codec_predictions_total{link=\"wan\",verdict=\"mispredicted\"} 1"
    ));
    // A link without a prediction (a reload that made its codec fixed) has no series.
    m.codec.update(&[]);
    assert!(!m.render().contains("linkpilot_codec_"), "{}", m.render());
}
