//! The status API: a Unix socket (default /run/linkpilot/status.sock, mode 0600) that answers
//! one request line with one JSON line. Only root (or the daemon's own user) may ask: the
//! socket's mode keeps others out and the peer's credentials are checked as well, since the
//! directory's permissions are not ours to trust. `linkpilot status` is the client.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::{fs::PermissionsExt, net::UnixStream as StdUnixStream},
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader as TokioBufReader},
    net::UnixListener,
};
use tracing::{debug, warn};

use super::{
    jobs::{self, JobStatus},
    ledger::ActuatorStatus,
    status_request::{reply, MAX_REQUEST, REFUSED},
};
use crate::{
    board::tuner_stats::TunerProcess,
    control::{
        estimator::Signals,
        knobs::bytes,
        outcome::{HeldChange, Verdict},
        Knobs,
    },
};

pub const DEFAULT_SOCKET: &str = "/run/linkpilot/status.sock";

/// What `linkpilot status` shows.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    pub pid: u32,
    pub uptime_s: f64,
    pub policy: String,
    /// SHA-256 of the running policy's bytes (hex, as sha256sum prints it).
    #[serde(default)]
    pub policy_sha256: String,
    /// Loading and attaching the programs: the socket answers from the moment it is bound, so a
    /// client asking during the start gets this rather than a timeout.
    #[serde(default)]
    pub starting: bool,
    pub dry_run: bool,
    /// Why nothing is applied although this is not a dry run (the policy names no peers).
    #[serde(default)]
    pub observe_only: Option<String>,
    pub interfaces: Vec<String>,
    /// Watched interfaces that are gone: watched again once they are back.
    #[serde(default)]
    pub interfaces_missing: Vec<String>,
    pub tick_ms: f64,
    pub ticks: u64,
    /// Work of the last tick (reading maps, sensors, core, actuators).
    pub last_tick_work_ms: f64,
    pub reloads_applied: u64,
    pub reloads_rejected: u64,
    pub last_reload_error: Option<String>,
    /// Ticks skipped because a sensing read failed: in all, in a row now, the latest error.
    #[serde(default)]
    pub sensing_errors: u64,
    #[serde(default)]
    pub sensing_failing_ticks: u32,
    #[serde(default)]
    pub last_sensing_error: Option<String>,
    pub flows: u64,
    pub flows_capacity: u64,
    /// Sysctls an administrator changed under us, no longer managed.
    pub sysctls_released: Vec<String>,
    /// Sysctls absent or read-only here (another network namespace), left alone.
    #[serde(default)]
    pub sysctls_unmanaged: Vec<String>,
    /// RoCE port classes an administrator changed under us, no longer managed.
    #[serde(default)]
    pub roce_tc_released: Vec<String>,
    /// Each actuator: what the decisions want, what is in place, whether it is pending.
    #[serde(default)]
    pub actuators: Vec<ActuatorStatus>,
    pub links: Vec<LinkStatus>,
    /// The plan in place (in a dry run or observing only: the one that would be).
    #[serde(default)]
    pub plan: Option<crate::control::Plan>,
    /// Training processes with the NCCL tuner plugin loaded: what they adopted and asked NCCL for.
    #[serde(default)]
    pub nccl_tuner: Vec<TunerProcess>,
    /// Training jobs' reports: what the network costs their steps.
    #[serde(default)]
    pub jobs: Vec<JobStatus>,
    /// Report files the latest read refused: "file: why".
    #[serde(default)]
    pub job_reports_refused: Vec<String>,
    /// Per-peer transport profiles.
    #[serde(default)]
    pub transport: super::transport::TransportStatus,
    /// The latest judgment of a state change by the jobs' progress, per link.
    #[serde(default)]
    pub verdicts: Vec<Verdict>,
    /// `compression = "auto"`: each link's latest codec prediction, pending or judged.
    #[serde(default)]
    pub codec_checks: Vec<crate::control::codec::Check>,
    /// State changes waiting for their judgment: (link, from, to, judged at ms).
    #[serde(default)]
    pub pending_judgments: Vec<(String, String, String, u64)>,
    /// State changes held off after reverts.
    #[serde(default)]
    pub held: Vec<HeldChange>,
    pub peers: Vec<PeerStatus>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LinkStatus {
    pub link: String,
    pub state: String,
    pub knobs: Knobs,
    pub signals: Signals,
    pub decision_id: u64,
    pub reason: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PeerStatus {
    pub interface: String,
    pub peer: String,
    pub srtt_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub rx_bps: f64,
    pub tx_bps: f64,
    pub ce_fraction: f64,
    /// Share of the CE and ECE marks received that were on reporting jobs' flows.
    #[serde(default)]
    pub job_ce_share: f64,
    #[serde(default)]
    pub job_ece_share: f64,
    pub retrans_per_s: f64,
    pub flows: usize,
}

pub type Shared = Arc<Mutex<Status>>;

/// Creates the socket (replacing a stale one, never a live one, and nothing that is not a
/// socket), readable and writable by the owner only.
pub fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("checking {}", path.display())),
        // Only a socket of ours may be replaced: a file, link or directory someone put there
        // is theirs.
        Ok(m) if !m.file_type().is_socket() => anyhow::bail!(
            "{}: exists and is not a socket (a {}); remove it or pass --status-socket",
            path.display(),
            if m.file_type().is_symlink() {
                "symbolic link"
            } else if m.is_dir() {
                "directory"
            } else {
                "file"
            }
        ),
        // A socket someone answers on is a running daemon's (a dry run takes no lock).
        Ok(_) if StdUnixStream::connect(path).is_ok() => anyhow::bail!(
            "{}: another linkpilot answers there; pass --status-socket",
            path.display()
        ),
        Ok(_) => std::fs::remove_file(path)
            .with_context(|| format!("removing the stale {}", path.display()))?,
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("restricting {}", path.display()))?;
    Ok(listener)
}

/// Answers requests until the task is dropped: one line each, as `status_request::reply`
/// decides.
pub async fn serve(listener: UnixListener, shared: Shared) {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let mut backoff = super::serve::AcceptBackoff::default();
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                let delay = backoff.failed("status", &e, std::time::Instant::now());
                tokio::time::sleep(delay).await;
                continue;
            }
        };
        backoff.ok();
        let allowed = stream.peer_cred().is_ok_and(|c| c.uid() == 0 || c.uid() == me);
        let shared = shared.clone();
        tokio::spawn(async move {
            let (r, mut w) = stream.into_split();
            let answer = if !allowed {
                warn!("status: refused a client that is not root");
                REFUSED.to_owned()
            } else {
                let mut line = Vec::new();
                let limit = MAX_REQUEST as u64 + 1;
                let read = tokio::time::timeout(
                    Duration::from_secs(2),
                    TokioBufReader::new(r.take(limit)).read_until(b'\n', &mut line),
                )
                .await;
                if !matches!(read, Ok(Ok(_))) {
                    return;
                }
                reply(&line, || shared.lock().map(|s| s.clone()).unwrap_or_default())
            };
            // A client that does not read its reply is not kept waiting for.
            let line = format!("{answer}\n");
            let write = w.write_all(line.as_bytes());
            match tokio::time::timeout(Duration::from_secs(2), write).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => debug!("status reply: {e}"),
                Err(_) => debug!("status reply: the client did not read it within 2 s"),
            }
        });
    }
}

/// Asks a running daemon (blocking; the CLI's side).
pub fn query(path: &Path) -> anyhow::Result<Status> {
    let mut s = StdUnixStream::connect(path).map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                "is `linkpilot run` running?"
            }
            std::io::ErrorKind::PermissionDenied => "the status API is root-only",
            _ => "",
        };
        anyhow::anyhow!("{}: {e} ({hint})", path.display())
    })?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    // A client the daemon refuses is answered and closed without being read, so the request
    // can meet a closed socket (EPIPE) while the refusal waits to be read: read it either way.
    let sent = s.write_all(b"status\n");
    let mut line = String::new();
    let read = BufReader::new(&s).read_line(&mut line);
    if line.is_empty() {
        sent.with_context(|| format!("{}: sending the request", path.display()))?;
    }
    read.context("reading the status reply")?;
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
        if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
            anyhow::bail!("{}: {e}", path.display());
        }
    }
    serde_json::from_str(&line).with_context(|| format!("{}: not a status reply", path.display()))
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}ms"))
}

/// The table `linkpilot status` prints.
pub fn render(s: &Status) -> String {
    let mut out = format!(
        "linkpilot {} pid {} up {:.0}s{}  policy {} (sha256 {})  tick {:.0}ms ({} run, last \
         {:.2}ms)\n",
        s.version,
        s.pid,
        s.uptime_s,
        if s.dry_run {
            " DRY RUN"
        } else if s.observe_only.is_some() {
            " OBSERVING ONLY (no peers named)"
        } else {
            ""
        },
        s.policy,
        s.policy_sha256.get(..12).unwrap_or("-"),
        s.tick_ms,
        s.ticks,
        s.last_tick_work_ms,
    );
    if s.starting {
        out += "starting: loading and attaching the programs; nothing decided yet\n";
    }
    out += &format!(
        "interfaces {}  flows {}/{}  reloads {} applied, {} rejected\n",
        s.interfaces.join(","),
        s.flows,
        s.flows_capacity,
        s.reloads_applied,
        s.reloads_rejected
    );
    if let Some(e) = &s.last_reload_error {
        out += &format!("last rejected reload: {}\n", e.lines().next().unwrap_or(""));
    }
    if let Some(e) = &s.last_sensing_error {
        out += &format!(
            "sensing: {} failed tick(s), {} in a row now; last: {e}\n",
            s.sensing_errors, s.sensing_failing_ticks
        );
    }
    let released: Vec<&str> =
        s.sysctls_released.iter().chain(&s.roce_tc_released).map(String::as_str).collect();
    if !released.is_empty() {
        out += &format!("released (changed by an administrator): {}\n", released.join(", "));
    }
    if !s.sysctls_unmanaged.is_empty() {
        out += &format!("not managed here: {}\n", s.sysctls_unmanaged.join(", "));
    }
    out += &render_actuators(s);
    out += &super::transport::render(&s.transport);
    out += &format!(
        "\n{:<12} {:<10} {:>9} {:>9} {:>7} {:>7} {:>8} {:>6} {:>4} {:>3} {:>4} {:>8}\n",
        "LINK",
        "STATE",
        "RTT",
        "P99",
        "CE",
        "RETX",
        "COMPRESS",
        "CHUNK",
        "IBTO",
        "TC",
        "WDOG",
        "TCPBUF"
    );
    for l in &s.links {
        let (k, g) = (&l.knobs, &l.signals);
        out += &format!(
            "{:<12} {:<10} {:>9} {:>9} {:>6.2}% {:>6.2}% {:>8} {:>6} {:>4} {:>3} {:>4} {:>8}\n",
            l.link,
            l.state,
            ms(g.rtt_ms),
            ms(g.rtt_p99_ms),
            g.ce_fraction * 100.0,
            g.retrans * 100.0,
            k.compression.to_string(),
            bytes(k.chunk_bytes),
            k.nccl_ib_timeout,
            crate::control::knobs::kept(k.roce_traffic_class),
            k.watchdog_s,
            // 0: "keep", the host's maxima left alone.
            if k.tcp_buffer_bytes == 0 { "keep".to_owned() } else { bytes(k.tcp_buffer_bytes) },
        );
    }
    for l in &s.links {
        out += &format!("  {} #{}: {}\n", l.link, l.decision_id, l.reason);
        let y = &l.knobs.sync;
        if y.sync_every != 1 {
            out += &format!(
                "  {} cross-site sync: every {} inner steps, {} pseudo-gradients, {} fragment(s), \
                 overlap {}\n",
                l.link,
                y.every(),
                y.outer_codec(),
                y.fragments,
                y.overlap
            );
        }
    }
    for v in &s.verdicts {
        out +=
            &format!("  {} outcome of {} -> {}: {}, {}\n", v.link, v.from, v.to, v.verdict, v.why);
    }
    for c in &s.codec_checks {
        out += &format!("  codec {}\n", c.describe());
    }
    for (link, from, to, at_ms) in &s.pending_judgments {
        out += &format!("  {link} {from} -> {to} is judged at {:.1} s\n", *at_ms as f64 / 1e3);
    }
    for h in &s.held {
        out += &format!(
            "  {} {} -> {} held off for {:.0} s more (reverted {} time(s) in a row)\n",
            h.link, h.from, h.to, h.remaining_s, h.reverts
        );
    }
    out += &render_tuner(&s.nccl_tuner);
    out += &jobs::render(&s.jobs, &s.job_reports_refused);
    out += &format!(
        "\n{:<12} {:<12} {:>9} {:>9} {:>11} {:>11} {:>7} {:>8} {:>8} {:>6}\n",
        "INTERFACE", "PEER", "SRTT", "P99", "RX", "TX", "CE", "JOB-CE", "RETX/s", "FLOWS"
    );
    for p in &s.peers {
        out += &format!(
            "{:<12} {:<12} {:>9} {:>9} {:>6.1}Mb/s {:>6.1}Mb/s {:>6.2}% {:>7.0}% {:>8.1} {:>6}\n",
            p.interface,
            p.peer,
            ms(p.srtt_ms),
            ms(p.p99_ms),
            p.rx_bps / 1e6,
            p.tx_bps / 1e6,
            p.ce_fraction * 100.0,
            p.job_ce_share.max(p.job_ece_share) * 100.0,
            p.retrans_per_s,
            p.flows
        );
    }
    out
}

/// One line per actuator; a pending one says since when and why.
fn render_actuators(s: &Status) -> String {
    let mut out = String::new();
    for a in &s.actuators {
        let or_dash = |v: &str| if v.is_empty() { "-".to_owned() } else { v.to_owned() };
        if !a.pending {
            out += &format!("  {:<12} in place: {}\n", a.actuator, or_dash(&a.wanted));
            continue;
        }
        let since = a.pending_since.map_or(String::new(), |t| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64();
            format!(" for {:.0}s", (now - t).max(0.0))
        });
        out += &format!(
            "  {:<12} PENDING{since} ({} failed writes): wants {}, has {}; {}\n",
            a.actuator,
            a.errors,
            or_dash(&a.wanted),
            a.applied.as_deref().map_or("nothing yet".to_owned(), or_dash),
            a.last_error.as_deref().unwrap_or("")
        );
    }
    if out.is_empty() {
        return out;
    }
    format!("actuators\n{out}")
}

/// The NCCL tuner plugin's section of the table: the processes that have it loaded and, per
/// process, what it asked NCCL for.
fn render_tuner(procs: &[TunerProcess]) -> String {
    if procs.is_empty() {
        return String::new();
    }
    let mut out = String::from("\nNCCL tuner plugin\n");
    for p in procs {
        let decision = match p.adoption.as_str() {
            "adopted" => format!("decision adopted at step {}", p.adopted_step),
            other => format!("decision {other}: NCCL's own choices"),
        };
        out += &format!(
            "  pid {}: {} communicator(s), {decision}, {} of {} calls followed it, \
             NCCL_BUFFSIZE {}\n",
            p.pid,
            p.communicators,
            p.adopted_calls,
            p.calls,
            bytes(p.buffsize_bytes)
        );
        out += &format!(
            "    {:<14} {:>17} {:<20} {:>8} {:>8} {:>9} {:>9}\n",
            "COLLECTIVE", "SIZE", "CHOICE", "CHANNELS", "CHUNK", "STEP", "CALLS"
        );
        for c in &p.choices {
            let size = match c.size_to {
                Some(to) => format!("{}-{}", bytes(c.size_from), bytes(to)),
                None => format!("{}+", bytes(c.size_from)),
            };
            let choice = match (&c.own_choice, &c.algo, &c.proto) {
                (Some(why), _, _) => format!("NCCL's ({why})"),
                (None, None, None) => "NCCL's".to_owned(),
                (None, a, p) => {
                    format!("{}/{}", a.as_deref().unwrap_or("any"), p.as_deref().unwrap_or("any"))
                }
            };
            let channels = if c.channels > 0 { c.channels.to_string() } else { "-".into() };
            let chunk = if c.chunk_bytes > 0 { bytes(c.chunk_bytes) } else { "-".into() };
            out += &format!(
                "    {:<14} {:>17} {:<20} {:>8} {:>8} {:>9} {:>9}\n",
                c.collective,
                size,
                choice,
                channels,
                chunk,
                c.step.max(c.chunk_step),
                c.calls.max(c.chunk_calls)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::board::tuner_stats::TunerChoice;

    #[tokio::test]
    async fn bind_replaces_only_a_stale_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status.sock");
        // A stale socket (its listener gone) is replaced; a live one is refused.
        drop(bind(&path).unwrap());
        let live = bind(&path).unwrap();
        let e = bind(&path).unwrap_err().to_string();
        assert!(e.contains("another linkpilot answers there"), "{e}");
        drop(live);
        std::fs::remove_file(&path).unwrap();
        // A regular file or a symlink at the path is someone else's: refused, left alone.
        std::fs::write(&path, "data").unwrap();
        let e = bind(&path).unwrap_err().to_string();
        assert!(e.contains("exists and is not a socket (a file)"), "{e}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "data");
        std::fs::remove_file(&path).unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "data").unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let e = bind(&path).unwrap_err().to_string();
        assert!(e.contains("not a socket (a symbolic link)"), "{e}");
        assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_symlink());
    }

    #[test]
    fn a_starting_daemon_says_so_and_a_running_one_does_not() {
        let starting = Status { starting: true, ..Status::default() };
        assert!(render(&starting).contains("starting: loading and attaching the programs"));
        assert!(!render(&Status::default()).contains("starting"));
    }

    #[test]
    fn pending_actuators_say_what_they_want_have_and_why() {
        let a = |actuator: &str, pending: bool| ActuatorStatus {
            actuator: actuator.into(),
            wanted: "wan congested #7".into(),
            applied: Some("wan healthy #3".into()),
            pending,
            pending_since: pending.then_some(0.0),
            last_error: pending.then(|| "writing /run/x/nccl.env: Read-only file system".into()),
            errors: 12,
        };
        let s =
            Status { actuators: vec![a("dscp", false), a("env_file", true)], ..Status::default() };
        let text = render(&s);
        assert!(
            text.contains("\nactuators\n  dscp         in place: wan congested #7\n"),
            "{text}"
        );
        let line = text.lines().find(|l| l.contains("env_file")).unwrap();
        assert!(line.contains("PENDING for ") && line.contains("(12 failed writes)"), "{line}");
        assert!(line.contains("wants wan congested #7, has wan healthy #3; writing"), "{line}");
    }

    #[test]
    fn the_tuner_section_shows_each_processes_choices() {
        let p = TunerProcess {
            pid: 4242,
            communicators: 1,
            calls: 10,
            adopted_calls: 9,
            adopted_step: 42,
            adoption: "adopted".into(),
            buffsize_bytes: 32 << 20,
            choices: vec![
                TunerChoice {
                    collective: "allreduce".into(),
                    size_from: 16 << 20,
                    size_to: Some(32 << 20),
                    algo: Some("tree".into()),
                    proto: Some("simple".into()),
                    chunk_bytes: 2 << 20,
                    step: 42,
                    calls: 9,
                    ..TunerChoice::default()
                },
                TunerChoice {
                    collective: "allgather".into(),
                    size_from: 1024,
                    size_to: Some(2048),
                    own_choice: Some("below min_bytes".into()),
                    calls: 1,
                    ..TunerChoice::default()
                },
            ],
            ..TunerProcess::default()
        };
        let text = render(&Status { nccl_tuner: vec![p], ..Status::default() });
        let lines: Vec<&str> = text.lines().collect();
        let at = lines.iter().position(|l| *l == "NCCL tuner plugin").unwrap();
        assert!(lines[at + 1]
            .contains("pid 4242: 1 communicator(s), decision adopted at step 42, 9 of 10 calls"));
        assert_eq!(
            lines[at + 3].split_whitespace().collect::<Vec<_>>(),
            ["allreduce", "16MiB-32MiB", "tree/simple", "-", "2MiB", "42", "9"]
        );
        assert!(lines[at + 4].contains("NCCL's (below min_bytes)"), "{text}");
    }
}
