//! The table `linkpilot status` prints from a [`Status`]: the daemon's header lines, the
//! actuators, links, judgments, the NCCL tuner plugin's processes, the jobs and the peers.
//! Kept apart from the socket (`socket.rs`): it is pure formatting, tested without a daemon.

use super::Status;
use crate::{board::tuner_stats::TunerProcess, control::knobs::bytes, daemon::jobs};

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
        out += "starting: opening its files, loading and attaching the programs; nothing decided yet\n";
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
    out += &crate::daemon::transport::render(&s.transport);
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
    use crate::{board::tuner_stats::TunerChoice, daemon::ledger::ActuatorStatus};

    #[test]
    fn a_starting_daemon_says_so_and_a_running_one_does_not() {
        let starting = Status { starting: true, ..Status::default() };
        assert!(render(&starting).contains("starting: opening its files, loading and attaching"));
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
