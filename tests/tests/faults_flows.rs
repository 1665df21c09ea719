//! A full flow table: 70,000 real TCP connections (both ends in the daemon's namespace, each end
//! an entry, 140,000 ends for 131,072 entries) held open, then churned (the oldest closed, new
//! ones opened, thousands a second) while iperf3 crosses the watched link. The daemon keeps
//! deciding (ticks in its status), reads the table as bpftool counts it, keeps measuring the
//! iperf3 flow (the least recently used entries are evicted, not the busy one), its memory stays
//! bounded (VmRSS), closed connections leave the table (all but those whose close the program
//! never ran for, by the kernel's trace beside bpftool's run count, or failed to remove, by its
//! own count), the evictions are counted (at least the established ends ss lists beyond the
//! entries bpftool counts) and warned about, the runs the kernel skipped are counted as bpftool
//! counts them, and the namespace is left as it was.

use std::time::{Duration, Instant};

use linkpilot_common::MAX_FLOWS;
use linkpilot_tests::{
    connections::Connections,
    daemon::{sample, scrape, status_json, wait_for},
    faults::{self, end, iperf3, maps_of, rss, stop, ticks_during},
    netns::{Netns, Pair},
    oracle::{map_entries, map_named, recursion_misses, run_count, BpfStats, KernelTrace},
};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Established TCP sockets in `ns`, as `ss` lists them.
fn established(ns: &Netns) -> usize {
    ns.exec(&["ss", "-Htn", "state", "established"]).lines().count()
}

/// What the daemon shows of peer b (the iperf3 flow) and its table.
#[derive(Debug)]
struct Sample {
    /// Status: the RTT window's p99, the flows with a fresh RTT sample, tx bits/s.
    p99_ms: Option<f64>,
    flows: u64,
    tx_bps: f64,
    /// Metrics: the peer's srtt (kept between table reads).
    srtt_s: Option<f64>,
    /// Status: entries the daemon last read, and the last tick's work.
    table: u64,
    work_ms: f64,
}

fn sample_of(dir: &std::path::Path, netns: &str) -> Sample {
    let st = status_json(dir);
    let p = st["peers"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["interface"] == "lpa0" && p["peer"] == "b").cloned())
        .unwrap_or_default();
    let srtt_s = scrape(netns).lines().find_map(|l| {
        let rest = l.strip_prefix("linkpilot_peer_rtt_seconds{")?;
        (rest.contains("peer=\"b\"") && rest.contains("stat=\"srtt\""))
            .then(|| l.rsplit(' ').next()?.parse().ok())?
    });
    Sample {
        p99_ms: p["p99_ms"].as_f64(),
        flows: p["flows"].as_u64().unwrap_or(0),
        tx_bps: p["tx_bps"].as_f64().unwrap_or(0.0),
        srtt_s,
        table: st["flows"].as_u64().unwrap_or(0),
        work_ms: st["last_tick_work_ms"].as_f64().unwrap_or(0.0),
    }
}

const MB: f64 = 1024.0 * 1024.0;

#[test]
fn a_full_flow_table_under_churn_keeps_the_daemon_deciding_and_measuring() {
    // Connections (default 70,000: 140,000 ends), churn seconds and churn rate (replacements a
    // second); longer forms through the environment.
    let n: usize = env_or("LINKPILOT_FAULT_FLOWS", 70_000);
    let secs: f64 = env_or("LINKPILOT_FAULT_SECONDS", 5.0);
    let rate: u32 = env_or("LINKPILOT_FAULT_CHURN", 2_000);
    let pair = Pair::new("198.18.146.1", "198.18.146.2");
    let dir = faults::temp_dir("flows");
    let (mut host, mut d) = faults::start_healthy(&pair, &dir);
    let pid = d.child.id();
    host.assert_one_set_attached(pid);
    let table = map_named(&maps_of(pid), "LP_FLOWS").expect("the daemon's LP_FLOWS");
    let rss_before = rss(pid);

    let t = Instant::now();
    let mut conns = Connections::open(&pair.a, pair.a_addr, n);
    let opened_in = t.elapsed();
    let held = established(&pair.a);
    assert!(held >= 2 * n, "ss lists {held} established sockets for {n} connections");
    let cap = u64::from(MAX_FLOWS);
    let full = map_entries(table);
    // An LRU table evicts in batches once it has no free entry: nearly every entry is in use.
    assert!(full as f64 >= cap as f64 * 0.99, "bpftool counts {full} of {cap} entries");
    wait_for("the daemon reads the full table", Duration::from_secs(10), || {
        status_json(&dir)["flows"].as_u64().unwrap_or(0) as f64 >= cap as f64 * 0.99
    });
    // What the table lost, the daemon says: every established end (ss) beyond the entries
    // present (bpftool) was evicted, and counted as such.
    let evicted_at_least = held.saturating_sub(full as usize) as f64;
    let evicted =
        || sample(&scrape(&pair.a.name), "linkpilot_datapath_lost_total{kind=\"flow_evicted\"}");
    wait_for("the evictions in the metrics", Duration::from_secs(10), || {
        evicted().unwrap_or(0.0) >= evicted_at_least
    });
    assert!(d.log().contains("evicted from the full flow table"), "{}", d.log());
    let rss_full = rss(pid);
    // Bounded by the table, not the connections: a read is at most MAX_FLOWS entries of 80 bytes.
    assert!(rss_full <= rss_before + (32 << 20), "RSS {rss_before} before, {rss_full} at full");
    eprintln!(
        "{n} connections opened in {opened_in:.1?}: ss {held} established ends, \
         bpftool {full}/{cap} entries, {:?} evictions counted, daemon RSS {:.1} MiB -> {:.1} MiB",
        evicted(),
        rss_before as f64 / MB,
        rss_full as f64 / MB
    );

    // From here on, every close must take its flow out of the table. The kernel's own record of
    // every state change beside its count of the program's runs: a close the program never ran
    // for leaves its flow behind until the LRU evicts it, whether the kernel counted the skip
    // (another BPF program or a map syscall active on that CPU: bpftool's recursion_misses) or
    // not (the classic tracepoint's perf layer drops a few events uncounted); so does a remove
    // the program counted as failed. Nothing else may stay.
    let stats = BpfStats::enable();
    let runs_before = run_count("lp_sock_state");
    // About 80 bytes an event, some 7 per replaced connection and one per end at the close:
    // 64 MiB per CPU holds them with room.
    let trace = KernelTrace::start_sized("lp_fflows", &["sock/inet_sock_set_state"], 64 << 10);

    // iperf3 across the watched link, measured although the table is full: its entry is made
    // by evicting an idle one.
    let procs = iperf3(&pair, secs as u32 + 20, "20M");
    wait_for("iperf3 measured with a full table", Duration::from_secs(10), || {
        let s = sample_of(&dir, &pair.a.name);
        s.p99_ms.is_some() && s.srtt_s.is_some() && s.flows >= 1 && s.tx_bps > 10e6
    });
    let mut samples = Vec::new();
    let mut churned = None;
    let (ticks, took) = ticks_during(&dir, || {
        std::thread::scope(|s| {
            let churn = s.spawn(|| conns.churn(rate, secs));
            while !churn.is_finished() {
                samples.push(sample_of(&dir, &pair.a.name));
                std::thread::sleep(Duration::from_millis(100));
            }
            churned = Some(churn.join().expect("the churn thread"));
        })
    });
    let replaced = churned.expect("churned");
    let after = map_entries(table);
    let held_after = established(&pair.a);
    let rss_churned = rss(pid);
    end(procs);
    let carrying = samples.iter().filter(|s| s.tx_bps > 10e6).count();
    let mut rates: Vec<f64> = samples.iter().map(|s| s.tx_bps / 1e6).collect();
    rates.sort_by(f64::total_cmp);
    eprintln!("iperf3's rate as the daemon read it, Mbit/s, sorted: {rates:.1?}");
    let work = samples.iter().map(|s| s.work_ms).fold(0.0, f64::max);
    eprintln!(
        "churn: {replaced} connections replaced in {took:.1?} ({:.0}/s), {ticks} ticks; \
         bpftool {after}/{cap} entries, ss {held_after} established, daemon RSS {:.1} MiB; \
         {} status samples: iperf3 measured in all, above 10 Mbit/s in {carrying}, \
         longest tick work {work:.1} ms",
        replaced as f64 / took.as_secs_f64(),
        rss_churned as f64 / MB,
        samples.len()
    );
    assert_eq!(conns.len(), n);
    // The fault happened: at least half the asked rate (thousands a second by default).
    assert!(replaced as f64 >= f64::from(rate) * secs * 0.5, "{replaced} replaced in {took:?}");
    // 100 ms ticks: at least 70% of them on a loaded 2-core machine.
    assert!(ticks as f64 >= took.as_secs_f64() * 10.0 * 0.7, "{ticks} ticks in {took:?}");
    assert!(after as f64 >= cap as f64 * 0.99, "bpftool counts {after} of {cap} after churn");
    assert!(held_after >= 2 * n, "ss lists {held_after} established ends after churn");
    for s in &samples {
        assert!(s.p99_ms.is_some() && s.srtt_s.is_some() && s.flows >= 1, "{samples:#?}");
        assert!(s.table as f64 >= cap as f64 * 0.99, "{samples:#?}");
    }
    let st = status_json(&dir);
    assert_eq!(st["sensing_errors"], 0, "{st}");
    // Bounded: the daemon reads at most MAX_FLOWS entries, so churn adds nothing.
    assert!(
        rss_churned <= rss_full + (16 << 20),
        "RSS {rss_full} at a full table, {rss_churned} after churn"
    );

    // Closed connections leave the table (their close is seen, not waited out in the LRU).
    conns.close();
    wait_for("no established connection left", Duration::from_secs(10), || {
        established(&pair.a) == 0
    });
    let remove_failed = || {
        sample(&scrape(&pair.a.name), "linkpilot_datapath_lost_total{kind=\"map_remove_failed\"}")
            .unwrap_or(0.0) as u64
    };
    // The trace first, the run count after: an event between the two reads adds a run, never
    // a traced event the program seems not to have run for.
    let not_run = || {
        let traced = trace.recorded();
        traced.saturating_sub(run_count("lp_sock_state") - runs_before)
    };
    let excused = || not_run() + remove_failed();
    let deadline = Instant::now() + Duration::from_secs(10);
    while map_entries(table) > excused() {
        if Instant::now() >= deadline {
            let states = pair.a.exec(&["ss", "-Htan"]);
            let mut by_state = std::collections::BTreeMap::<&str, usize>::new();
            for l in states.lines() {
                *by_state.entry(l.split_whitespace().next().unwrap_or("?")).or_default() += 1;
            }
            let dump = pair.a.exec(&["bpftool", "map", "dump", "id", &table.to_string()]);
            panic!(
                "the table did not empty within 10 s: bpftool {} entries; the kernel traced \
                 {} state changes, lp_sock_state ran {} times, {} skips counted; {} removes \
                 failed; sockets by state (ss): {by_state:?}; the entries:\n{}",
                map_entries(table),
                trace.recorded(),
                run_count("lp_sock_state") - runs_before,
                recursion_misses("lp_sock_state"),
                remove_failed(),
                dump.lines().take(40).collect::<Vec<_>>().join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "closed: bpftool {} entries left; the kernel traced {} state changes, the program \
         missed {} of them ({} counted as skipped), {} removes failed",
        map_entries(table),
        trace.recorded(),
        not_run(),
        recursion_misses("lp_sock_state"),
        remove_failed()
    );
    drop(trace);
    drop(stats);
    // The daemon counts what the kernel skipped, as bpftool does.
    let ours = || -> u64 {
        ["lp_sock_state", "lp_tcp_probe", "lp_tcp_retrans"]
            .iter()
            .map(|p| recursion_misses(p))
            .sum()
    };
    wait_for("the skipped runs in the metrics", Duration::from_secs(5), || {
        let metric = sample(
            &scrape(&pair.a.name),
            "linkpilot_datapath_lost_total{kind=\"program_skipped\"}",
        );
        metric == Some(ours() as f64)
    });
    eprintln!("the kernel skipped our tracepoint programs {} time(s)", ours());
    stop(&mut d);
    host.assert_unchanged();
    let _ = std::fs::remove_dir_all(&dir);
}
