//! The SIGKILL cycle: `linkpilot run` on the lab's HK host during `hk-us-day`, with iperf3
//! across the lab and a training-side process reading the knob board in a loop
//! (`xtask/scripts/board_watch.py`, through the Python package's reader), is killed with SIGKILL
//! after a random 10-30 s (seeded) and restarted, `restarts` times; the last run ends on
//! SIGTERM. Judged by oracles outside the daemon:
//! - attachments: the links the running daemon holds (its fds' /proc fdinfo) are exactly one
//!   set of our programs as bpftool lists them, and no link of a killed run is left in bpftool's
//!   list;
//! - the board, as the reader saw it: stale within two heartbeats of each kill (plus the
//!   reader's 5 ms poll and scheduling, 50 ms), fresh with the new pid within a second of each
//!   start, the start being the moment the new daemon holds its links (what comes before it,
//!   loading and verifying the programs, is reported as the startup time);
//! - after the SIGTERM: the namespace's sysctls and the RoCE class (an rdma sysfs fixture and a
//!   configfs look-alike) as they were before the first start, and no state file left;
//! - the reader never crashed (exit status 0) and counted one fresh transition per start and a
//!   stale one per kill; stale spells while a daemon ran (missed beats) are counted and
//!   reported with the gap between the beats around them.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::{BufRead, BufReader, Write as _},
    path::Path,
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _};
use nix::{
    sys::signal::{kill, Signal},
    time::{clock_gettime, ClockId},
    unistd::Pid,
};
use serde_json::Value;

use super::{start_daemon, traffic, wait_up};
use crate::{
    lab::{Lab, Reaped},
    run::{output, workspace_root},
};

const SCENARIO: &str = "hk-us-day";
/// What the reader may add to the board's own staleness: its 5 ms poll and being scheduled on
/// a busy machine.
const READER_SLACK_MS: f64 = 50.0;
const FRESH_WITHIN_MS: f64 = 1000.0;
/// One link per program `run` attaches: TCX ingress and egress, three tracepoints, and the
/// sock_ops program on the cgroup v2 root (hk-us.toml gives the far site a transport profile).
const ATTACHMENTS: usize = 6;
/// The namespace's sysctls the policy changes (tcp buffers and `[host]` tcp_ecn and
/// tcp_slow_start_after_idle); the state file's keys are added to them.
const SYSCTLS: [&str; 4] = [
    "net/ipv4/tcp_rmem",
    "net/ipv4/tcp_wmem",
    "net/ipv4/tcp_ecn",
    "net/ipv4/tcp_slow_start_after_idle",
];

fn mono_ns() -> anyhow::Result<i128> {
    let t = clock_gettime(ClockId::CLOCK_MONOTONIC)?;
    Ok(i128::from(t.tv_sec()) * 1_000_000_000 + i128::from(t.tv_nsec()))
}

/// splitmix64: a seeded sequence without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Milliseconds uniformly in `lo..=hi` seconds.
    fn gap(&mut self, (lo, hi): (u64, u64)) -> Duration {
        Duration::from_millis(lo * 1000 + self.next() % ((hi - lo) * 1000 + 1))
    }
}

fn sysctl(netns: &str, key: &str) -> anyhow::Result<String> {
    output(
        Command::new("nsenter")
            .arg(format!("--net=/run/netns/{netns}"))
            .args(["cat", &format!("/proc/sys/{key}")]),
    )
    .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
    .with_context(|| format!("reading {key} in {netns}"))
}

/// The ConnectX sysfs fixture with port 1 on the HK host's eth0, and an rdma_cm configfs
/// look-alike whose class is 0: `run`'s arguments for them and the class file.
fn rdma_fixture(dir: &Path) -> anyhow::Result<(Vec<String>, std::path::PathBuf)> {
    let sysfs = dir.join("sysfs");
    let fixture = workspace_root().join("controller/tests/fixtures/sysfs-infiniband");
    crate::run::status("rdma fixture", Command::new("cp").arg("-r").arg(&fixture).arg(&sysfs))?;
    for entry in fs::read_dir(sysfs.join("mlx5_0/ports/1/gid_attrs/ndevs"))? {
        fs::write(entry?.path(), "eth0\n")?;
    }
    let tos = dir.join("rdma_cm/mlx5_0/ports/1/default_roce_tos");
    fs::create_dir_all(tos.parent().context("tos dir")?)?;
    fs::write(&tos, "0\n")?;
    let args = vec![
        "--rdma-root".into(),
        sysfs.display().to_string(),
        "--rdma-cm-root".into(),
        dir.join("rdma_cm").display().to_string(),
    ];
    Ok((args, tos))
}

/// The bpf links `pid` holds, from /proc/PID/fdinfo: (link id, type as the kernel names it).
fn held_links(pid: u32) -> anyhow::Result<BTreeMap<u64, String>> {
    let mut links = BTreeMap::new();
    for fd in fs::read_dir(format!("/proc/{pid}/fd"))? {
        let fd = fd?;
        if fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy() == "anon_inode:bpf_link") {
            let info = fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                fd.file_name().to_string_lossy()
            ))?;
            let field = |k: &str| info.lines().find_map(|l| l.strip_prefix(k)).map(str::trim);
            let id = field("link_id:").and_then(|v| v.parse().ok()).context("fdinfo link_id")?;
            links.insert(id, field("link_type:").unwrap_or("?").to_owned());
        }
    }
    Ok(links)
}

/// Every bpf link bpftool lists: link id -> program name.
fn bpftool_links() -> anyhow::Result<BTreeMap<u64, String>> {
    let json = |args: &[&str]| -> anyhow::Result<Value> {
        let out = output(Command::new("bpftool").args(args)).context("bpftool")?;
        Ok(serde_json::from_str(&out)?)
    };
    let progs: BTreeMap<u64, String> = json(&["prog", "show", "--json"])?
        .as_array()
        .context("bpftool prog show")?
        .iter()
        .filter_map(|p| Some((p["id"].as_u64()?, p["name"].as_str().unwrap_or("?").to_owned())))
        .collect();
    Ok(json(&["link", "show", "--json"])?
        .as_array()
        .context("bpftool link show")?
        .iter()
        .filter_map(|l| {
            let name = progs.get(&l["prog_id"].as_u64()?).cloned().unwrap_or_default();
            Some((l["id"].as_u64()?, name))
        })
        .collect())
}

/// Exactly one set: the daemon holds one link per program it attaches (2 TCX, 3 tracepoints,
/// sock_ops), bpftool lists each of them with our program's name, once.
fn one_set(pid: u32) -> anyhow::Result<BTreeSet<u64>> {
    let held = held_links(pid)?;
    let listed = bpftool_links()?;
    let names: BTreeSet<&str> =
        held.keys().filter_map(|id| listed.get(id)).map(String::as_str).collect();
    let want: BTreeSet<&str> = linkpilot_common::PROGRAM_NAMES
        .into_iter()
        .filter(|n| *n != linkpilot_common::PROG_TC_NOOP)
        .chain([linkpilot_common::transport::PROG_SOCK_OPS])
        .collect();
    let kinds: Vec<&str> = held.values().map(String::as_str).collect();
    ensure!(
        held.len() == want.len() && names == want,
        "the daemon holds links {held:?}, bpftool names them {names:?}; want one of each of {want:?}"
    );
    let count = |kind: &str| kinds.iter().filter(|k| **k == kind).count();
    ensure!(
        count("tcx") == 2 && count("cgroup") == 1,
        "want 2 TCX links, 1 cgroup link (sock_ops) and the rest perf (tracepoints): {kinds:?}"
    );
    Ok(held.keys().copied().collect())
}

fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> anyhow::Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if start.elapsed() > limit {
            bail!("{what}: not within {limit:?}");
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// The first event after index `from` that `f` accepts, and the index after it.
fn event_where(
    events: &Mutex<Vec<Value>>,
    from: usize,
    f: impl Fn(&Value) -> bool,
) -> Option<(usize, Value)> {
    let e = events.lock().ok()?;
    e.iter().enumerate().skip(from).find(|(_, v)| f(v)).map(|(i, v)| (i + 1, v.clone()))
}

fn event(events: &Mutex<Vec<Value>>, from: usize, kind: &str) -> Option<(usize, Value)> {
    event_where(events, from, |v| v["event"] == kind)
}

fn mono(v: &Value) -> i128 {
    i128::from(v["mono_ns"].as_i64().unwrap_or(0))
}

/// After a SIGKILL at `killed`: the index after the event that made the board stale, the
/// milliseconds from the kill until the reader saw it (0 when it already was: a missed beat
/// just before), and the board's heartbeat interval.
fn stale_after(events: &Mutex<Vec<Value>>, from: usize, killed: i128) -> Option<(usize, f64, f64)> {
    let e = events.lock().ok()?;
    let interval = |v: &Value| v["interval_ms"].as_f64().unwrap_or(0.0);
    let tail = e.get(from..)?;
    if let Some(p) = tail.iter().rposition(|v| mono(v) <= killed) {
        if tail[p]["event"] == "stale" && !tail[p + 1..].iter().any(|v| v["event"] == "fresh") {
            return Some((from + p + 1, 0.0, interval(&tail[p])));
        }
    }
    let p = tail.iter().position(|v| v["event"] == "stale" && mono(v) > killed)?;
    Some((from + p + 1, (mono(&tail[p]) - killed) as f64 / 1e6, interval(&tail[p])))
}

/// The reader's stale spells while a daemon ran (between `from` and `to`): for each, the gap
/// between the heartbeat it last saw and the next one it saw, ms.
fn missed_beats(events: &Mutex<Vec<Value>>, from: usize, to: usize) -> Vec<f64> {
    let Ok(e) = events.lock() else { return Vec::new() };
    let Some(run) = e.get(from..to.min(e.len())) else { return Vec::new() };
    run.iter()
        .enumerate()
        .filter(|(_, v)| v["event"] == "stale")
        .map(|(i, v)| {
            let next = run[i + 1..].iter().find(|n| n["event"] == "fresh");
            let beat = |x: &Value| x["heartbeat_ns"].as_f64().unwrap_or(0.0);
            next.map_or(f64::NAN, |n| (beat(n) - beat(v)) / 1e6)
        })
        .collect()
}

pub fn run(
    dir: &Path,
    lab_name: &str,
    bin: &Path,
    seed: u64,
    restarts: u32,
    gap: (u64, u64),
) -> anyhow::Result<()> {
    println!(
        "soak kill: seed {seed}: SIGKILL linkpilot run {restarts} times, {}-{} s apart, on \
         {SCENARIO} with iperf3 and a board reader; results in {}",
        gap.0,
        gap.1,
        dir.display()
    );
    let mut rng = Rng(seed);
    let (rdma_args, tos) = rdma_fixture(dir)?;
    let secs = u64::from(restarts + 1) * (gap.1 + 10) + 120;
    let running = Lab::start(&crate::lab::bin("linkpilot-lab"), dir, SCENARIO, lab_name, 1, secs)?;
    let hk = running.host("Hk", 0).clone();
    let policy = workspace_root().join("policies/hk-us.toml");
    let mut before: BTreeMap<String, String> = BTreeMap::new();
    for key in SYSCTLS {
        before.insert(key.into(), sysctl(&hk.netns, key)?);
    }
    // Trimmed: configfs takes and shows the class with or without the newline.
    let tos_before = fs::read_to_string(&tos)?.trim().to_owned();
    let board = dir.join("knobs");
    let mut reader = Reaped(
        Command::new(crate::python::python())
            .arg(workspace_root().join("xtask/scripts/board_watch.py"))
            .arg(&board)
            .env("PYTHONPATH", workspace_root().join("python"))
            .stdout(Stdio::piped())
            .stderr(fs::File::create(dir.join("reader.err"))?)
            .spawn()
            .context("starting the board reader (.venv/bin/python; cargo xtask setup makes it)")?,
        "board reader",
    );
    let events = Arc::new(Mutex::new(Vec::<Value>::new()));
    if let Some(out) = reader.0.stdout.take() {
        let events = events.clone();
        let mut log = fs::File::create(dir.join("reader.jsonl"))?;
        thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = writeln!(log, "{line}");
                if let (Ok(v), Ok(mut e)) = (serde_json::from_str::<Value>(&line), events.lock()) {
                    e.push(v);
                }
            }
        });
    }
    wait_for("the board reader", Duration::from_secs(30), || event(&events, 0, "ready"))?;
    let traffic = traffic(&running, dir, Instant::now() + Duration::from_secs(secs), false)?;
    let (mut fresh_ms, mut stale_ms, mut killed_links) = (Vec::new(), Vec::new(), BTreeSet::new());
    let mut heartbeat_ms: f64 = 0.0;
    let mut startup_ms = Vec::new();
    let mut hiccups: Vec<f64> = Vec::new();
    let mut seen = 0;
    let mut rmem_changed = false;
    let mut tos_changed = false;
    for run in 0..=restarts {
        let spawned = mono_ns()?;
        let mut daemon = start_daemon(bin, &hk.netns, dir, &policy, &rdma_args)?;
        let pid = daemon.0.id();
        // Attached: the moment the process holds its links (the kernel's fdinfo, polled every
        // 10 ms). Before it, the daemon loads and verifies its programs; the board follows at
        // its first tick.
        let attached = wait_for(&format!("run {run}: its links"), Duration::from_secs(30), || {
            (held_links(pid).ok()?.len() >= ATTACHMENTS).then(mono_ns)?.ok()
        })?;
        let (i, fresh) =
            wait_for(&format!("run {run}: the board fresh"), Duration::from_secs(10), || {
                event_where(&events, seen, |v| {
                    v["event"] == "fresh" && v["pid"].as_u64() == Some(u64::from(pid))
                })
            })?;
        seen = i;
        let at = fresh["mono_ns"].as_i64().unwrap_or(0) as i128;
        let (ms, startup) = ((at - attached) as f64 / 1e6, (attached - spawned) as f64 / 1e6);
        ensure!(
            ms <= FRESH_WITHIN_MS,
            "run {run}: the reader saw the board fresh {ms:.0} ms after the daemon attached (> {FRESH_WITHIN_MS} ms)"
        );
        fresh_ms.push(ms);
        startup_ms.push(startup);
        wait_up(&mut daemon, dir, Duration::from_secs(30))?;
        let ours =
            wait_for(&format!("run {run}: one set of links"), Duration::from_secs(10), || {
                one_set(pid).ok()
            })
            .or_else(|_| one_set(pid))?;
        let listed = bpftool_links()?;
        let left: Vec<&u64> = killed_links.iter().filter(|id| listed.contains_key(*id)).collect();
        ensure!(left.is_empty(), "run {run}: links of killed runs still listed: {left:?}");
        if run == 0 {
            rmem_changed = wait_for("the first run's sysctls", Duration::from_secs(20), || {
                (sysctl(&hk.netns, SYSCTLS[0]).ok()? != before[SYSCTLS[0]]).then_some(true)
            })?;
        }
        let state: Value = wait_for(
            &format!("run {run}: the sysctl state file of the originals"),
            Duration::from_secs(10),
            || {
                serde_json::from_str(&fs::read_to_string(dir.join("sysctl-originals.json")).ok()?)
                    .ok()
            },
        )?;
        for (key, original) in state["values"].as_object().into_iter().flatten() {
            let key = key.clone();
            if !before.contains_key(&key) {
                before.insert(key.clone(), "(not read before the first start)".into());
            }
            let original =
                original.as_str().unwrap_or("").split_whitespace().collect::<Vec<_>>().join(" ");
            ensure!(before[&key] == original, "run {run}: the state file keeps {key} = {original:?} as the original, but it was {:?}", before[&key]);
        }
        tos_changed |= fs::read_to_string(&tos)?.trim() != tos_before;
        println!(
            "  run {run}: pid {pid} attached {startup:.0} ms after the spawn, the board fresh {ms:.0} ms later; links {ours:?}"
        );
        let lifetime = rng.gap(gap);
        if let Some(st) = daemon.wait_until(Instant::now() + lifetime) {
            bail!(
                "run {run}: the daemon exited by itself ({st}); see {}",
                dir.join("daemon.log").display()
            );
        }
        if run == restarts {
            let termed = mono_ns()?;
            kill(Pid::from_raw(pid as i32), Signal::SIGTERM)?;
            let st = daemon
                .wait_until(Instant::now() + Duration::from_secs(20))
                .context("the daemon did not stop on SIGTERM")?;
            ensure!(st.success(), "the last run exited with {st} on SIGTERM");
            println!("  run {run}: SIGTERM after {:.1} s: exited 0", lifetime.as_secs_f64());
            // The board goes stale once it stops beating; the spells before that were misses.
            let end = wait_for("the board stale after SIGTERM", Duration::from_secs(2), || {
                stale_after(&events, seen, termed)
            })?;
            hiccups.extend(missed_beats(&events, seen, end.0 - 1));
            break;
        }
        let killed = mono_ns()?;
        kill(Pid::from_raw(pid as i32), Signal::SIGKILL)?;
        let _ = daemon.0.wait();
        let before_kill = seen;
        let (i, ms, interval) =
            wait_for(&format!("run {run}: the board stale"), Duration::from_secs(2), || {
                stale_after(&events, seen, killed)
            })?;
        seen = i;
        let missed = missed_beats(&events, before_kill, seen - 1);
        if !missed.is_empty() {
            println!("  run {run}: the reader saw the board stale while it ran: beat gaps {missed:.0?} ms");
        }
        hiccups.extend(missed);
        ensure!(
            ms <= 2.0 * interval + READER_SLACK_MS,
            "run {run}: the reader saw the board stale {ms:.0} ms after SIGKILL (heartbeat {interval} ms)"
        );
        stale_ms.push(ms);
        heartbeat_ms = heartbeat_ms.max(interval);
        wait_for(
            &format!("run {run}: the killed run's links to go"),
            Duration::from_secs(5),
            || {
                let listed = bpftool_links().ok()?;
                ours.iter().all(|id| !listed.contains_key(id)).then_some(())
            },
        )?;
        killed_links.extend(ours);
        println!(
            "  run {run}: SIGKILL after {:.1} s; the reader saw the board stale {ms:.0} ms later",
            lifetime.as_secs_f64()
        );
    }
    // Once it has finally exited: what it changed is back, and nothing of it is left.
    let mut changed = Vec::new();
    for (key, was) in &before {
        let now = sysctl(&hk.netns, key)?;
        if &now != was {
            changed.push(format!("{key}: {was:?} before, {now:?} after"));
        }
    }
    let tos_after = fs::read_to_string(&tos)?.trim().to_owned();
    if tos_after != tos_before {
        changed.push(format!("RoCE class: {tos_before:?} before, {tos_after:?} after"));
    }
    for f in ["sysctl-originals.json", "roce-tc-originals.json"] {
        if dir.join(f).exists() {
            changed.push(format!("{f} left behind"));
        }
    }
    let listed = bpftool_links()?;
    if killed_links.iter().any(|id| listed.contains_key(id)) {
        changed.push("links of earlier runs still listed".into());
    }
    ensure!(changed.is_empty(), "the host is not as it was: {}", changed.join("; "));
    ensure!(
        rmem_changed && tos_changed,
        "the daemon never changed tcp_rmem or the RoCE class: nothing was proven restored"
    );
    kill(Pid::from_raw(reader.0.id() as i32), Signal::SIGTERM)?;
    let st = reader
        .wait_until(Instant::now() + Duration::from_secs(10))
        .context("the board reader did not stop")?;
    let done =
        wait_for("the reader's counts", Duration::from_secs(5), || event(&events, 0, "done"))?.1;
    let err = fs::read_to_string(dir.join("reader.err")).unwrap_or_default();
    ensure!(st.success(), "the board reader exited with {st}: {err}");
    let starts = u64::from(restarts) + 1;
    ensure!(
        done["to_fresh"].as_u64() == Some(starts + hiccups.len() as u64) && done["to_stale"].as_u64() >= Some(u64::from(restarts)),
        "the reader counted {} fresh and {} stale transitions for {starts} starts, {restarts} kills \
         and {} stale spells while a daemon ran",
        done["to_fresh"],
        done["to_stale"],
        hiccups.len()
    );
    drop(traffic);
    drop(running);
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    println!(
        "soak kill: seed {seed}: {restarts} SIGKILLs survived: one set of links after each start; \
         the board stale at most {:.0} ms after a kill (two heartbeats: {:.0} ms), fresh at most \
         {:.0} ms after the daemon attached (startup before that: {:.0}..{:.0} ms); sysctls {:?} and the RoCE class as before; the reader made {} \
         reads ({} fresh, {} stale, {} before the first board, {} busy), codecs {}, exit 0; \
         stale spells while a daemon ran: {} (beat gaps {:.0?} ms)",
        max(&stale_ms),
        2.0 * heartbeat_ms,
        max(&fresh_ms),
        startup_ms.iter().copied().fold(f64::INFINITY, f64::min),
        max(&startup_ms),
        before.keys().collect::<Vec<_>>(),
        done["reads"],
        done["fresh"],
        done["stale"],
        done["missing"],
        done["busy"],
        done["codecs"],
        hiccups.len(),
        hiccups
    );
    Ok(())
}
