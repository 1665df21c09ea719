//! linkpilot.outer across the lab: one rank per site (python/tests/outer_rank.py, torch over
//! gloo on the hosts' eth0) syncing every 12 steps in 2 fragments overlapped by 4 steps, across
//! 180 ms of RTT that is cut for 15 s in the middle (every packet dropped in the lab's router,
//! at a step count, so a slow start cannot move it). The lab's own byte counters judge the bytes
//! per round; the ranks' step times judge the overlap and the ride through the outage. Then one
//! rank against two, and two ranks a site (DDP inside, the outer state sharded): the lab's
//! counters judge that as many bytes cross as with one rank a site, and `ss` that every rank
//! pair carries its own shard over its own connections.

use std::{
    process::Command,
    thread,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use linkpilot_lab::{
    lab::{Host, Lab, LabConfig, Site},
    scenario::{Direction, Scenario},
};
use linkpilot_tests::{ddp_rank, python};
use serde_json::Value;

const DOWN_S: f64 = 15.0;
const SCENARIO: &str = r#"
name = "outer-calm"
description = "180 ms RTT, 50 Mbit/s"
[[phase]]
name = "calm"
duration = "20min"
[phase.link]
delay = "90ms"
rate = "50Mbit/s"
queue = "5MiB"
"#;
/// H, fragments, overlap, codec; steps of ~0.1 s (a sleep standing in for compute).
const PLAN: &str = "12,2,4,int8";
const STEPS: u64 = 820;
/// The ranks pause at these steps (loop indices) while the test reads the lab's counters.
const PAUSES: [u64; 2] = [40, 160];
/// The pauses of the sharding test: 84 steps (7 rounds) apart.
const SHARD_PAUSES: [u64; 2] = [24, 108];
/// The link is cut when rank 0 has reported this step.
const CUT_AT: u64 = 360;

/// A rank process and every line it printed so far.
struct Rank {
    proc: ddp_rank::Rank,
    seen: Vec<Value>,
}

impl Rank {
    /// The outage test's rank (of two).
    fn start(host: &Host, master: &Host, rank: usize) -> Self {
        let pauses = PAUSES.map(|p| p.to_string()).join(",");
        let args = ["--steps", &STEPS.to_string(), "--plan", PLAN, "--sleep", "0.1"];
        let more = ["--deadline", "1.5", "--max-drift", "1000", "--width", "2048"];
        Self::spawn(host, master, rank, 2, &[&args[..], &more, &["--pause-at", &pauses]].concat())
    }

    fn spawn(host: &Host, master: &Host, rank: usize, world: usize, args: &[&str]) -> Self {
        let worker = concat!(env!("CARGO_MANIFEST_DIR"), "/../python/tests/outer_rank.py");
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", host.netns))
            .arg(python())
            .arg(worker)
            .args(["--rank", &rank.to_string(), "--world", &world.to_string(), "--port", "0"])
            .args(["--master", &format!("{}:29500", master.ipv4)])
            .args(args)
            .args(["--pause-s", "3"])
            .env("GLOO_SOCKET_IFNAME", "eth0")
            .env("PYTHONUNBUFFERED", "1")
            .env("OMP_NUM_THREADS", "1");
        Self { proc: ddp_rank::Rank::spawn(&mut cmd), seen: Vec::new() }
    }

    /// Reads lines up to one that has `key` equal to `value` (any value when None).
    fn until(&mut self, key: &str, value: Option<u64>, limit: Duration) -> &Value {
        let lines = self.proc.until_where(key, |x| value.is_none_or(|w| x == w), limit);
        self.seen.extend(lines);
        self.seen.last().expect("the line found")
    }

    fn steps(&self) -> impl Iterator<Item = &Value> {
        self.seen.iter().filter(|v| v.get("step").is_some())
    }

    fn exchanges(&self) -> impl Iterator<Item = &Value> {
        // Step lines, then the done line (what closing finished).
        self.seen.iter().filter_map(|v| v["exchanges"].as_array()).flatten()
    }
}

/// Drops every packet the lab's router forwards (both directions), or stops dropping.
fn cut(lab: &Lab, down: bool) {
    let ns = ["ip", "netns", "exec", lab.wan_netns(), "nft"];
    let args: &[&str] = if down {
        &["add table inet lpcut; add chain inet lpcut forwarded { type filter hook forward priority -100; policy drop; }"]
    } else {
        &["delete table inet lpcut"]
    };
    linkpilot_tests::sh(&[&ns[..], args].concat());
}

fn now_s() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_secs_f64()
}

fn wan_bytes(lab: &Lab) -> u64 {
    lab.stats(Direction::HkToUs).bytes_in + lab.stats(Direction::UsToHk).bytes_in
}

fn f(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

fn u(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

#[test]
fn rounds_overlap_send_the_codecs_bytes_and_ride_through_an_outage() {
    let scenario = Scenario::parse(SCENARIO, "outer-calm", None).expect("scenario");
    let config = LabConfig { name: "touter".into(), ..LabConfig::default() };
    let lab = Lab::start(config, scenario).expect("lab");
    let (hk, us) = lab.hk_us();
    let mut ranks = [Rank::start(&hk, &hk, 0), Rank::start(&us, &hk, 1)];

    // Bytes: the counters read while both ranks pause, after their last exchange landed.
    let mut counters = Vec::new();
    for step in PAUSES {
        for r in &mut ranks {
            r.until("idle", Some(step), Duration::from_secs(120));
        }
        thread::sleep(Duration::from_millis(1500));
        counters.push(wan_bytes(&lab));
    }
    ranks[0].until("step", Some(CUT_AT), Duration::from_secs(120));
    let down_from = now_s();
    cut(&lab, true);
    thread::sleep(Duration::from_secs_f64(DOWN_S));
    cut(&lab, false);
    let down_to = now_s();
    for r in &mut ranks {
        r.until("done", None, Duration::from_secs(300));
        assert!(r.proc.child.wait().expect("rank exit").success(), "a rank failed");
    }

    // 1. Bytes per round: what crossed between the pauses against the codec's size of the
    // fragments both sites sent in those steps (their messages add a 128-byte header; TCP/IP
    // headers and ACKs come on top).
    let window = |v: &&Value| {
        (PAUSES[0] + 2..=PAUSES[1] + 1).contains(&u(v, "sent")) && v["outcome"] != "skipped"
    };
    let codec_bytes: u64 = ranks
        .iter()
        .flat_map(|r| r.exchanges().filter(window).map(|x| u(x, "wire_bytes")).collect::<Vec<_>>())
        .sum();
    let sends = ranks[0].exchanges().filter(window).count();
    let lab_bytes = counters[1] - counters[0];
    let ratio = lab_bytes as f64 / codec_bytes as f64;
    eprintln!("{sends} sends a site between the pauses: lab {lab_bytes} B, codec {codec_bytes} B");
    assert!(sends >= 18, "{sends} sends");
    assert!((1.0..1.10).contains(&ratio), "lab/codec bytes {ratio:.3}");

    // 2. Overlap: 4 whole rounds of calm after the second pause take less than their compute
    // plus their exchanges one after the other would.
    let first = PAUSES[1] + 1;
    let rounds: Vec<&Value> =
        ranks[0].steps().filter(|v| (first..first + 48).contains(&u(v, "step"))).collect();
    let compute: f64 = rounds.iter().map(|v| f(v, "compute_s")).sum();
    let wall: f64 = compute + rounds.iter().map(|v| f(v, "sync_s")).sum::<f64>();
    let exchange: f64 = ranks[0]
        .exchanges()
        .filter(|x| (first + 1..=first + 48).contains(&u(x, "sent")))
        .map(|x| f(x, "exchange_s"))
        .sum();
    eprintln!("4 rounds: wall {wall:.2} s, compute {compute:.2} s, exchanges {exchange:.2} s");
    assert!(exchange > 0.2 * compute, "exchanges too short to show overlap: {exchange:.2} s");
    assert!(wall < compute + 0.5 * exchange, "wall {wall:.2} s: the exchanges were not hidden");

    // 3. The outage: inner steps go on at 80% of the calm rate or more (the exchange in flight
    // is given up on after its deadline), nothing fails, and after the link is back the sites
    // resync and every fragment of the next rounds is the same on both.
    let rate = |from: f64, to: f64| {
        ranks[0].steps().filter(|v| (from..to).contains(&f(v, "t"))).count() as f64 / (to - from)
    };
    let (calm, down) = (rate(down_from - 15.0, down_from), rate(down_from, down_to));
    eprintln!("steps/s: calm {calm:.2}, link cut {down:.2}");
    assert!(down >= 0.8 * calm, "steps/s through the outage {down:.2}, calm {calm:.2}");
    let cut = ranks[0]
        .exchanges()
        .filter(|x| ["late", "failed"].contains(&x["outcome"].as_str().unwrap_or("")))
        .count();
    assert!(cut >= 1, "no exchange was in flight when the link went down");
    let done: Vec<&Value> = ranks.iter().map(|r| r.seen.last().expect("done")).collect();
    assert_eq!(done[0]["outer"], done[1]["outer"], "outer states differ: {done:?}");
    let epoch = ranks[0].steps().last().map(|v| u(v, "outer_epoch")).expect("steps");
    assert!(epoch >= 1, "no resync after the outage");
    let applied = |r: &Rank| -> Vec<(u64, u64, String)> {
        r.exchanges()
            .filter(|x| x["outcome"] == "applied" && u(x, "epoch") == epoch)
            .map(|x| (u(x, "round"), u(x, "fragment"), x["digest"].to_string()))
            .collect()
    };
    let (a0, a1) = (applied(&ranks[0]), applied(&ranks[1]));
    assert!(a0.len() >= 4, "{} fragments applied after the resync", a0.len());
    assert_eq!(a0, a1, "the sites' fragments differ after the resync");
}

/// Bytes a host's TCP connections to any of `peers` delivered (acknowledged), from `ss`.
fn bytes_to(host: &Host, peers: &[String]) -> u64 {
    let net = format!("--net=/run/netns/{}", host.netns);
    let out = linkpilot_tests::sh(&["nsenter", &net, "ss", "-tinH", "state", "established"]);
    let mut total = 0;
    let mut to_peer = false;
    for line in out.lines() {
        if !line.starts_with(char::is_whitespace) {
            // Recv-Q, Send-Q, local address:port, peer address:port.
            let peer = line.split_whitespace().nth(3).unwrap_or_default();
            let ip = peer.rsplit_once(':').map_or(peer, |(ip, _)| ip);
            to_peer =
                peers.iter().any(|p| ip.trim_start_matches("[::ffff:").trim_end_matches(']') == p);
        } else if to_peer {
            let acked = line.split_whitespace().find_map(|f| f.strip_prefix("bytes_acked:"));
            total += acked.map_or(0, |n| n.parse::<u64>().expect("bytes_acked"));
        }
    }
    total
}

/// What one sharding run measured between its two pauses: the lab's WAN bytes, the bytes each HK
/// host's connections to the US hosts delivered, the codec bytes the ranks sent, and rank 0's
/// exchange times.
#[derive(Debug)]
struct Crossed {
    lab: u64,
    hk_tx: Vec<u64>,
    codec: u64,
    exchange_s: Vec<f64>,
}

/// `hk` ranks in Hong Kong and `us` in the US, each on a host of its own, 200 steps of rounds of
/// 12 in 2 fragments of int8, every apply step waiting for its exchange (so every shard's rounds
/// keep to the schedule and the window between the pauses holds the same sends in every shape).
fn crossed(lab: &Lab, hk: usize, us: usize) -> Crossed {
    let hosts: Vec<Host> = (0..hk)
        .map(|i| lab.host(Site::Hk, i).clone())
        .chain((0..us).map(|i| lab.host(Site::Us, i).clone()))
        .collect();
    let world = hosts.len();
    let ranks = |from: usize, n: usize| (from..from + n).map(|r| r.to_string()).collect::<Vec<_>>();
    let sites = format!("{}/{}", ranks(0, hk).join(","), ranks(hk, us).join(","));
    // A shorter run than the outage test's: 7 rounds between the pauses. Its ranks mostly
    // sleep (a 0.1 s step, a 303k-parameter model), and bytes do not depend on the load, so it
    // runs beside the other lab tests.
    let pauses = SHARD_PAUSES.map(|p| p.to_string()).join(",");
    let args = ["--steps", "112", "--plan", PLAN, "--sleep", "0.1", "--patience", "30"];
    let more = ["--width", "8192", "--sites", &sites, "--pause-at", &pauses];
    let mut ranks: Vec<Rank> = (0..world)
        .map(|r| Rank::spawn(&hosts[r], &hosts[0], r, world, &[&args[..], &more].concat()))
        .collect();
    let mut counters = Vec::new();
    for step in SHARD_PAUSES {
        for r in &mut ranks {
            r.until("idle", Some(step), Duration::from_secs(120));
        }
        thread::sleep(Duration::from_millis(1500));
        let far: Vec<String> = hosts[hk..].iter().map(|h| h.ipv4.to_string()).collect();
        let sent: Vec<u64> = hosts[..hk].iter().map(|h| bytes_to(h, &far)).collect();
        counters.push((wan_bytes(lab), sent));
    }
    for r in &mut ranks {
        r.until("done", None, Duration::from_secs(120));
        assert!(r.proc.child.wait().expect("rank exit").success(), "a rank failed");
    }
    let window = |v: &&Value| (SHARD_PAUSES[0] + 2..=SHARD_PAUSES[1] + 1).contains(&u(v, "sent"));
    let codec = ranks
        .iter()
        .flat_map(|r| r.exchanges().filter(window).map(|x| u(x, "wire_bytes")).collect::<Vec<_>>())
        .sum();
    let done: Vec<&Value> = ranks.iter().map(|r| r.seen.last().expect("done")).collect();
    assert!(
        done.iter().all(|d| d["agreed"] == true && d["digest"] == done[0]["digest"]),
        "{done:?}"
    );
    Crossed {
        lab: counters[1].0 - counters[0].0,
        hk_tx: counters[1].1.iter().zip(&counters[0].1).map(|(b, a)| b - a).collect(),
        codec,
        exchange_s: ranks[0].exchanges().filter(window).map(|x| f(x, "exchange_s")).collect(),
    }
}

#[test]
fn unequal_and_sharded_sites_cross_the_bytes_of_one_rank_a_site() {
    let scenario = Scenario::parse(SCENARIO, "outer-calm", None).expect("scenario");
    let config = LabConfig { name: "toshard".into(), hosts_per_site: 2, ..LabConfig::default() };
    let lab = Lab::start(config, scenario).expect("lab");
    let one = crossed(&lab, 1, 1);
    let two = crossed(&lab, 2, 2);
    let unequal = crossed(&lab, 1, 2);
    let median = |c: &Crossed| {
        let mut t = c.exchange_s.clone();
        t.sort_by(f64::total_cmp);
        t.get(t.len() / 2).copied().unwrap_or(f64::NAN)
    };
    eprintln!("1 rank a site: {one:?}\n2 ranks a site, sharded: {two:?}\n1 against 2: {unequal:?}");
    eprintln!(
        "a fragment's exchange: {:.3} s with 1 pair, {:.3} s with 2",
        median(&one),
        median(&two)
    );
    // The same fragments' worth crossed: the codec bytes differ by the second pair's headers
    // only, and the WAN carried within 2% of what it carried for one pair.
    assert!(one.codec > 0 && two.codec.abs_diff(one.codec) * 100 < one.codec, "{one:?} {two:?}");
    let ratio = two.lab as f64 / one.lab as f64;
    assert!((0.98..1.02).contains(&ratio), "2 ranks a site crossed {ratio:.4} of 1 rank's bytes");
    // One rank against two (the state whole, as a one-rank site must keep it: the US's first
    // rank exchanges and hands over to the second): the same bytes as equal sites.
    let ratio = unequal.lab as f64 / one.lab as f64;
    assert!((0.98..1.02).contains(&ratio), "1 against 2 ranks crossed {ratio:.4} of 1 against 1");
    // Each HK rank sent its own shard from its own host, over its own connections: about half
    // of what the site sent across each.
    let share = two.hk_tx[1] as f64 / (two.hk_tx[0] + two.hk_tx[1]) as f64;
    assert!((0.4..0.6).contains(&share), "hk1 sent {share:.3} of the site's bytes across");
    assert!(two.hk_tx[0] + two.hk_tx[1] > two.codec / 3, "{two:?}");
}
