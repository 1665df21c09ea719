//! Outside oracles: the kernel's own counters (nstat) and bpftool.

use serde_json::Value;

use crate::{netns::Netns, sh};

/// Absolute values of the kernel's SNMP counters in `ns`, read with `nstat -asz` (which neither
/// uses nor updates nstat's history file).
pub fn nstat(ns: &Netns, counters: &[&str]) -> Vec<u64> {
    nstat_in(&ns.name, counters)
}

/// [`nstat`] in the named network namespace (a lab host's, say).
pub fn nstat_in(netns: &str, counters: &[&str]) -> Vec<u64> {
    let out = crate::sh(&[&["ip", "netns", "exec", netns, "nstat", "-asz"], counters].concat());
    counters
        .iter()
        .map(|c| {
            out.lines()
                .find_map(|l| {
                    let mut it = l.split_whitespace();
                    (it.next() == Some(*c)).then(|| it.next()?.parse().ok()).flatten()
                })
                .unwrap_or_else(|| panic!("nstat printed no {c}:\n{out}"))
        })
        .collect()
}

/// BPF links in the kernel as (link type, program name), from `bpftool link show` and
/// `bpftool prog show`. bpftool 7.1 (Debian 12) prints TCX links as type 11 without the device,
/// so the type is returned as bpftool prints it: "11" for TCX, "perf_event" for tracepoints.
pub fn links() -> Vec<(String, String)> {
    links_of(&programs())
}

/// What `bpftool <object> show --json` lists (its array).
fn bpftool_show(object: &str) -> Vec<Value> {
    match serde_json::from_str(&sh(&["bpftool", object, "show", "--json"])).expect("JSON") {
        Value::Array(v) => v,
        other => panic!("bpftool {object} show --json is not an array: {other}"),
    }
}

/// Every loaded BPF program as (id, name; "?" when it has none), from `bpftool prog show`.
fn programs() -> Vec<(u64, String)> {
    bpftool_show("prog")
        .iter()
        .filter_map(|p| Some((p["id"].as_u64()?, p["name"].as_str().unwrap_or("?").to_owned())))
        .collect()
}

/// How many times the kernel skipped the programs named `name` because a BPF program was
/// already running on that CPU (`recursion_misses` in `bpftool prog show`; it prints none when
/// there were none): a tracepoint that fires in a softirq while one of ours runs in process
/// context is not seen by ours.
pub fn recursion_misses(name: &str) -> u64 {
    prog_field_sum(name, "recursion_misses")
}

/// How many times the programs named `name` ran (`run_cnt` in `bpftool prog show`; counted
/// only while `kernel.bpf_stats_enabled` is 1, see [`BpfStats`]).
pub fn run_count(name: &str) -> u64 {
    prog_field_sum(name, "run_cnt")
}

/// `field` of `bpftool prog show --json` summed over the programs named `name`.
fn prog_field_sum(name: &str, field: &str) -> u64 {
    bpftool_show("prog")
        .iter()
        .filter(|p| p["name"].as_str() == Some(name))
        .filter_map(|p| p[field].as_u64())
        .sum()
}

/// `kernel.bpf_stats_enabled` set to 1 while this lives, then set back to what it was.
pub struct BpfStats(String);

impl BpfStats {
    pub fn enable() -> Self {
        const PATH: &str = "/proc/sys/kernel/bpf_stats_enabled";
        let was = std::fs::read_to_string(PATH).expect("bpf_stats_enabled").trim().to_owned();
        std::fs::write(PATH, "1").expect("enabling bpf_stats");
        Self(was)
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", &self.0);
    }
}

/// [`links`] of the programs in `progs` (ids from [`ours_loaded`]).
pub fn links_of(progs: &[(u64, String)]) -> Vec<(String, String)> {
    bpftool_show("link")
        .iter()
        .filter_map(|l| {
            let (_, name) = progs.iter().find(|(id, _)| l["prog_id"].as_u64() == Some(*id))?;
            let ty = match &l["type"] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            Some((ty, name.clone()))
        })
        .collect()
}

/// Our programs that `watch` and `run` attach, with the link type bpftool shows for each ("11"
/// for TCX, "perf_event" for tracepoints, "raw_tracepoint" for the retransmissions' program): every name in common's list except the never-attached
/// baseline, so a program added there is checked here without editing the tests.
pub fn attached_programs() -> Vec<(&'static str, &'static str)> {
    use linkpilot_common::{
        PROGRAM_NAMES, PROG_SOCK_STATE, PROG_TCP_PROBE, PROG_TCP_RETRANSMIT, PROG_TC_EGRESS,
        PROG_TC_INGRESS, PROG_TC_NOOP,
    };
    PROGRAM_NAMES
        .iter()
        .filter(|n| **n != PROG_TC_NOOP)
        .map(|&n| match n {
            PROG_TC_INGRESS | PROG_TC_EGRESS => ("11", n),
            PROG_TCP_RETRANSMIT => ("raw_tracepoint", n),
            PROG_TCP_PROBE | PROG_SOCK_STATE => ("perf_event", n),
            other => panic!("{other}: say how bpftool shows its link"),
        })
        .collect()
}

/// Programs of ours (a name in common's list) loaded in the kernel, as (id, name). Ids are not
/// reused soon, so comparing two readings tells what one run loaded even while other daemons of
/// ours run on the machine.
pub fn ours_loaded() -> Vec<(u64, String)> {
    programs()
        .into_iter()
        .filter(|(_, n)| linkpilot_common::PROGRAM_NAMES.contains(&n.as_str()))
        .collect()
}

/// What [`ours_loaded`] shows now that `before` did not.
pub fn ours_loaded_since(before: &[(u64, String)]) -> Vec<(u64, String)> {
    ours_loaded().into_iter().filter(|p| !before.contains(p)).collect()
}

/// Those of our loaded programs that `held` picks, once their holder has exited and the kernel had
/// time to let go of them. Closing a link does not unlist its program at once: since Linux 6.13 a
/// link drops its program only after an RCU grace period, and when that is the last reference the
/// program's id is freed from a workqueue. A leaked program stays listed for good; ten seconds
/// tells the two apart on a loaded machine.
pub fn loaded_after_exit(held: impl Fn(&(u64, String)) -> bool) -> Vec<(u64, String)> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let left: Vec<_> = ours_loaded().into_iter().filter(|p| held(p)).collect();
        if left.is_empty() || std::time::Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Entries in BPF map `id` as `bpftool map dump` counts them ("Found N elements").
pub fn map_entries(id: u64) -> u64 {
    let out = sh(&["bpftool", "map", "dump", "id", &id.to_string()]);
    out.lines()
        .rev()
        .find_map(|l| l.strip_prefix("Found ")?.strip_suffix(" elements")?.parse().ok())
        .unwrap_or_else(|| panic!("bpftool map dump id {id} printed no count"))
}

/// The id of the BPF map named `name` among `ids`, from `bpftool map show`.
pub fn map_named(ids: &[u64], name: &str) -> Option<u64> {
    let maps: Value =
        serde_json::from_str(&sh(&["bpftool", "map", "show", "--json"])).expect("JSON");
    maps.as_array()?.iter().find_map(|m| {
        let id = m["id"].as_u64()?;
        (ids.contains(&id) && m["name"] == name).then_some(id)
    })
}

/// A file's SHA-256 as coreutils' `sha256sum` prints it.
pub fn sha256sum(path: &std::path::Path) -> String {
    let out = sh(&["sha256sum", &path.display().to_string()]);
    out.split_whitespace().next().unwrap_or_else(|| panic!("sha256sum printed nothing")).to_owned()
}

/// DSCP of each TCP segment with payload in `pcap`, in capture order (tshark).
pub fn data_dscp(pcap: &str) -> Vec<u64> {
    let fields = crate::sh(&[
        "tshark",
        "-r",
        pcap,
        "-T",
        "fields",
        "-e",
        "ip.dsfield.dscp",
        "-e",
        "tcp.len",
    ]);
    fields
        .lines()
        .filter_map(|l| {
            let mut f = l.split('\t').map(|x| x.parse::<u64>().unwrap_or(u64::MAX));
            let (dscp, len) = (f.next()?, f.next()?);
            (len > 0).then_some(dscp)
        })
        .collect()
}

/// The kernel's own record of tracepoint events: a tracefs instance of its own (so the global
/// buffer and other users are untouched) with the named `system/event`s enabled; removed when
/// dropped.
pub struct KernelTrace {
    dir: std::path::PathBuf,
    events: Vec<String>,
}

impl KernelTrace {
    pub fn start(name: &str, events: &[&str]) -> Self {
        Self::start_sized(name, events, 8192)
    }

    /// [`KernelTrace::start`] with a buffer of `kib` KiB per CPU.
    pub fn start_sized(name: &str, events: &[&str], kib: u64) -> Self {
        let dir = std::path::Path::new("/sys/kernel/tracing/instances").join(name);
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        std::fs::write(dir.join("buffer_size_kb"), kib.to_string()).expect("buffer_size_kb");
        for e in events {
            let enable = dir.join("events").join(e).join("enable");
            std::fs::write(&enable, "1")
                .unwrap_or_else(|err| panic!("{}: {err}", enable.display()));
        }
        Self { dir, events: events.iter().map(|e| (*e).to_owned()).collect() }
    }

    /// How many events the buffer holds, from the per-CPU counters (no text to format). Panics
    /// if the buffer lost any (overrun or dropped): the count would be short.
    pub fn recorded(&self) -> u64 {
        let mut total = 0;
        let cpus = std::fs::read_dir(self.dir.join("per_cpu")).expect("the trace's per_cpu");
        for cpu in cpus {
            let path = cpu.expect("a per_cpu entry").path().join("stats");
            let stats = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let field = |name: &str| -> u64 {
                stats
                    .lines()
                    .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
                    .unwrap_or_else(|| panic!("no {name} in {}:\n{stats}", path.display()))
            };
            let lost = field("overrun:") + field("dropped events:");
            assert_eq!(
                lost,
                0,
                "the trace lost {lost} event(s) ({}): make it larger",
                path.display()
            );
            total += field("entries:");
        }
        total
    }

    /// Every event recorded so far, one line each (the header's comment lines left out).
    pub fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("trace"))
            .expect("reading the trace")
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for KernelTrace {
    fn drop(&mut self) {
        for e in &self.events {
            let _ = std::fs::write(self.dir.join("events").join(e).join("enable"), "0");
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// One captured IPv4/TCP packet as tshark decodes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub dscp: u64,
    /// 0 Not-ECT, 1 ECT(1), 2 ECT(0), 3 CE.
    pub ecn: u64,
    /// tshark verified the IPv4 header checksum as good.
    pub checksum_good: bool,
    pub tcp_len: u64,
    /// Carries sequence space beyond all that its connection carried earlier in the capture.
    /// Exact for a capture on the sender, which sees every transmission: there the others are
    /// retransmissions (RTO, fast, tail loss probes). At a receiver, a lost segment's
    /// retransmission can look new.
    pub new_data: bool,
}

/// Every IPv4/TCP packet in `pcap`, in capture order, with the IPv4 checksum checked (tshark).
pub fn segments(pcap: &str) -> Vec<Segment> {
    let out = crate::sh(&[
        "tshark",
        "-r",
        pcap,
        "-o",
        "ip.check_checksum:TRUE",
        "-o",
        "tcp.relative_sequence_numbers:TRUE",
        "-T",
        "fields",
        "-e",
        "ip.dsfield.dscp",
        "-e",
        "ip.dsfield.ecn",
        "-e",
        "ip.checksum.status",
        "-e",
        "tcp.len",
        "-e",
        "tcp.stream",
        "-e",
        "tcp.seq",
    ]);
    // Highest sequence number plus one seen so far, per connection (relative numbers: no wrap
    // within a test's few hundred megabytes).
    let mut sent_to: std::collections::HashMap<u64, u64> = Default::default();
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let num = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(u64::MAX);
            let (len, seq) = (num(3), num(5));
            let end = sent_to.entry(num(4)).or_insert(0);
            let new_data = len > 0 && seq >= *end;
            if len > 0 {
                *end = (*end).max(seq.saturating_add(len));
            }
            Segment {
                dscp: num(0),
                ecn: num(1),
                checksum_good: num(2) == 1,
                tcp_len: len,
                new_data,
            }
        })
        .collect()
}

/// Whether every segment of new data in a capture on the sender left ECT(0), as the kernel sent
/// it with ECN on. Retransmissions are not judged: the kernel sends them Not-ECT (RFC 3168
/// 6.1.5; Linux clears ECT on them unless the congestion control needs ECN, as DCTCP does).
pub fn new_data_is_ect0(sent: &[Segment]) -> Result<(), String> {
    let new: Vec<_> = sent.iter().filter(|s| s.new_data).collect();
    let bad: Vec<_> = new.iter().filter(|s| s.ecn != 2).collect();
    if new.is_empty() {
        return Err("no data segment captured".into());
    }
    if bad.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{} of {} segments of new data left without ECT(0): {:?}",
        bad.len(),
        new.len(),
        &bad[..bad.len().min(5)]
    ))
}
