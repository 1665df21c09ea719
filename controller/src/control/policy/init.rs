//! `linkpilot policy init`: a commented starting policy for one link from a few answers (its
//! interface, the far side's prefixes, its capacity and base RTT). The ladder is the shipped
//! `hk-us.toml`'s, the one measured on the lab's days: escalation on the signals of others'
//! traffic with the job's own at a higher bar, int8 then int4, BBR toward the peers. The RTT and
//! capacity size the bounds (buffers and chunks from the bandwidth-delay product, jitter
//! thresholds from the RTT). Nothing the site owns is changed unless asked: DSCP and the RoCE
//! class stay "keep" without `--dscp` / `--roce-traffic-class`, and no `[host]` sysctl is set.

use std::fmt::Write as _;

use linkpilot_common::units::{BitRate, Bytes, Nanos};

use super::{Policy, PolicyErrors};

/// What `policy init` is told.
#[derive(Clone, Debug)]
pub struct InitAnswers {
    pub link: String,
    pub interface: String,
    /// (name, prefixes) of the far side; none: every destination on the interface counts.
    pub peers: Vec<(String, Vec<String>)>,
    pub capacity: BitRate,
    /// The link's round-trip time when idle.
    pub rtt: Nanos,
    /// The DSCP to write on the link's TCP packets to its peers; none: "keep".
    pub dscp: Option<u8>,
    /// NCCL_IB_TC and the RoCE ports' class; none: "keep".
    pub roce_traffic_class: Option<u8>,
    /// Whether the states give connections to the peers BBR (`[state.transport]`).
    pub transport: bool,
    /// Whether the daemon sizes the host's socket buffer maxima (`tcp_buffers = "auto"`);
    /// otherwise "keep", as the site has them.
    pub tcp_buffers: bool,
}

/// Parses `NAME=CIDR[,CIDR...]`.
pub fn parse_peer(s: &str) -> Result<(String, Vec<String>), String> {
    let (name, cidrs) = s
        .split_once('=')
        .ok_or_else(|| format!("peer {s:?}: expected NAME=CIDR[,CIDR...], e.g. us=10.2.0.0/16"))?;
    let cidrs: Vec<String> = cidrs.split(',').map(|c| c.trim().to_owned()).collect();
    if name.trim().is_empty() || cidrs.iter().any(String::is_empty) {
        return Err(format!("peer {s:?}: expected NAME=CIDR[,CIDR...], e.g. us=10.2.0.0/16"));
    }
    Ok((name.trim().to_owned(), cidrs))
}

fn pow2_at_least(x: f64) -> u64 {
    let x = x.max(1.0);
    2u64.saturating_pow(x.log2().ceil() as u32)
}

fn ms(n: u64) -> String {
    if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}s", n / 1000)
    } else {
        format!("{n}ms")
    }
}

fn quoted(items: &[String]) -> String {
    items.iter().map(|i| format!("{i:?}")).collect::<Vec<_>>().join(", ")
}

/// A jitter threshold: `share` of the RTT, to 10 ms above 50 ms (so the hk-us ladder's
/// 100/50/200/100 ms come out at its 180 ms), never under `floor` (a LAN's scheduling noise).
fn jitter(rtt_ms: f64, share: f64, floor: u64) -> String {
    let v = rtt_ms * share;
    let v = if v > 50.0 { (v / 10.0).round() * 10.0 } else { v.round() };
    ms((v as u64).max(floor))
}

/// The policy's text, checked: an answer the checks refuse (a bad prefix, an interface name the
/// parser cannot take) comes back as their errors, located in the generated text.
pub fn render(a: &InitAnswers) -> Result<String, PolicyErrors> {
    let rtt_ms = (a.rtt.0 as f64 / 1e6).max(0.001);
    let bdp = a.capacity.0 / 8.0 * rtt_ms / 1e3;
    // Buffers up to twice the BDP (the auto formula's factor), within what a socket may hold.
    let buffers_max = pow2_at_least(2.0 * bdp).clamp(8 << 20, 1 << 30);
    let chunk_max = pow2_at_least(bdp / 64.0).clamp(4 << 20, 256 << 20);
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(
        w,
        "# linkpilot policy for link {:?} on {}: {} at {} round trip.",
        a.link,
        a.interface,
        fmt_rate(a.capacity),
        ms(rtt_ms.round() as u64)
    );
    let _ = write!(
        w,
        "\
# Written by `linkpilot policy init`; every key is in docs/policy.md. The ladder is the shipped
# hk-us.toml's, measured in the WAN lab (BENCHMARKS.md); the bounds are sized for this link.
# First run it observe-only: `linkpilot run --dry-run --policy THIS` and `linkpilot status`
# show the states and knobs it would set, changing nothing.
#
# What it changes when it acts: the knob board and env file the training jobs read (codec,
# chunk, NCCL timeouts, sync plan).
{transport}{buffers}# DSCP and the RoCE class stay as the site has them (\"keep\") unless --dscp /
# --roce-traffic-class set them. No [host] sysctl is set: the ones the lab's runs hold are at
# the end, commented out.
",
        buffers = if a.tcp_buffers {
            "# The socket buffer maxima (tcp_buffers \"auto\": 2 x the delivered rate x the RTT,\n\
             # within [bounds]).\n"
                .to_owned()
        } else {
            format!(
                "# Not the socket buffer maxima (tcp_buffers \"keep\"): one connection's window is\n\
                 # capped by net.core.rmem_max / wmem_max and tcp_rmem / tcp_wmem, and filling this\n\
                 # link takes {} (the bandwidth-delay product); raise them on the hosts, or\n\
                 # `--tcp-buffers auto` lets linkpilot size them.\n",
                Bytes(bdp as u64)
            )
        },
        transport = if a.transport {
            "# BBR on TCP connections to the peers, in every state ([state.transport];\n\
             # --no-transport leaves it out).\n"
        } else {
            ""
        },
    );
    let _ = writeln!(w, "\n[bounds]");
    let _ = writeln!(
        w,
        "# Socket buffers up to 2 x capacity x RTT (8MiB to 1GiB): {}; chunks up to the BDP / 64.",
        Bytes(buffers_max)
    );
    let _ = writeln!(
        w,
        "tcp_buffers = {{ min = \"4MiB\", max = \"{}\", bdp_factor = 2.0, max_step = 4.0 }}",
        Bytes(buffers_max)
    );
    let _ = writeln!(w, "chunk = {{ min = \"1MiB\", max = \"{}\", initial = \"4MiB\", in_flight = 64, max_step = 2.0 }}", Bytes(chunk_max));
    let _ = write!(
        w,
        "\
# Jobs that synchronize across sites every H steps (linkpilot.outer): \"auto\" H fits a
# fragment's exchange inside the inner steps it overlaps with, 25% to spare.
sync_every = {{ min = 8, max = 200, margin = \"25%\", max_drift = 800 }}
"
    );
    let _ = writeln!(
        w,
        "\n[[link]]\nname = {:?}\ninterfaces = [{:?}]\ncapacity = \"{}\"",
        a.link,
        a.interface,
        fmt_rate(a.capacity)
    );
    if a.peers.is_empty() {
        let _ = writeln!(
            w,
            "# No [[link.peer]]: every destination on {} counts as this link's.",
            a.interface
        );
        let _ = writeln!(w, "# Name the far side's prefixes to leave other traffic alone.");
    }
    for (name, cidrs) in &a.peers {
        let _ = writeln!(w, "[[link.peer]]\nname = {name:?}\ncidrs = [{}]", quoted(cidrs));
    }
    let _ = write!(
        w,
        r#"
# The ladder, healthiest first: any enter condition held for 300 ms enters a state (possibly
# skipping levels); all exit conditions held for 10 s step down one level.
#
# cross_ce_fraction, cross_rtt_inflation and cross_jitter read others' traffic: a job's own
# bursts keep a marking queue above its step, its flows' RTT above the baseline and their RTT
# spread wide, and counted they would hold the link in a worse state all day. The job's own
# view stays in every state at a higher bar (rtt_inflation at twice cross_rtt_inflation's), for
# a link whose capacity dropped under a lone job; retransmissions count whoever caused them.
"#
    );
    let knobs = |w: &mut String, codec: &str, outer: &str, timeout: &str, first: bool| {
        let _ = writeln!(w, "[state.knobs]\ncompression = {codec:?}\nchunk = \"auto\"");
        let _ = writeln!(w, "nccl_ib_timeout = {timeout}");
        let _ = match a.dscp {
            Some(d) => writeln!(w, "dscp = {d}"),
            None if first => {
                writeln!(w, "dscp = \"keep\"                # --dscp N marks TCP to the peers")
            }
            None => writeln!(w, "dscp = \"keep\""),
        };
        let _ = match a.roce_traffic_class {
            Some(t) => writeln!(w, "roce_traffic_class = {t}"),
            None if first => writeln!(
                w,
                "roce_traffic_class = \"keep\"  # --roce-traffic-class N sets NCCL_IB_TC"
            ),
            None => writeln!(w, "roce_traffic_class = \"keep\""),
        };
        let _ = writeln!(w, "tcp_buffers = {:?}", if a.tcp_buffers { "auto" } else { "keep" });
        let _ = writeln!(w, "sync_every = \"auto\"\nouter_codec = {outer:?}\nfragments = 4");
        if a.transport {
            let _ = writeln!(w, "[state.transport]\ncongestion_control = \"bbr\"");
        }
    };
    let _ = writeln!(w, "[[state]]\nname = \"healthy\"");
    knobs(w, "int8", "int8", "\"auto\"", true);
    // The worse states' knobs: int4 in each; severe fixes the IB timeout at 24.
    let (mut worse, mut severe) = (String::new(), String::new());
    knobs(&mut worse, "int4", "int4", "\"auto\"", false);
    knobs(&mut severe, "int4", "int4", "24", false);
    let _ = write!(
        w,
        r#"
[[state]]
name = "congested"
enter = {{ cross_ce_fraction = "1%", retrans = "0.5%", cross_rtt_inflation = "20%", rtt_inflation = "40%", cnp_rate = "1000/s" }}
exit = {{ cross_ce_fraction = "0.2%", retrans = "0.1%", cross_rtt_inflation = "10%", rtt_inflation = "25%", cnp_rate = "200/s" }}
{worse}
[[state]]
name = "degraded"
enter = {{ cross_ce_fraction = "5%", retrans = "2%", cross_rtt_inflation = "50%", rtt_inflation = "80%", cross_jitter = "{}" }}
exit = {{ cross_ce_fraction = "1%", retrans = "0.5%", cross_rtt_inflation = "20%", rtt_inflation = "40%", cross_jitter = "{}" }}
{worse}
[[state]]
name = "severe"
# unanswered: retransmitted and heard nothing back for 1 s: a dead link or peer.
enter = {{ retrans = "5%", rtt_inflation = "100%", cross_jitter = "{}", unanswered = "1s" }}
exit = {{ retrans = "2%", rtt_inflation = "50%", cross_jitter = "{}", unanswered = "500ms" }}
{severe}"#,
        jitter(rtt_ms, 5.0 / 9.0, 20),
        jitter(rtt_ms, 5.0 / 18.0, 10),
        jitter(rtt_ms, 10.0 / 9.0, 40),
        jitter(rtt_ms, 5.0 / 9.0, 20),
    );
    let _ = write!(
        w,
        r#"
# Host sysctls the lab's runs hold (restored when linkpilot stops); uncomment what you want
# linkpilot to own. tcp_slow_start_after_idle = 0 keeps the window across a compute gap, which
# every exchange follows; tcp_ecn = 1 makes our own connections negotiate ECN.
# [host]
# tcp_slow_start_after_idle = 0
# tcp_ecn = 1
"#
    );
    Policy::parse(&s, "<policy init>")?;
    Ok(s)
}

/// A rate as the policy writes it: the largest unit that keeps it whole.
fn fmt_rate(r: BitRate) -> String {
    for (scale, unit) in [(1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")] {
        if r.0 >= scale && (r.0 / scale).fract() == 0.0 {
            return format!("{}{unit}", r.0 / scale);
        }
    }
    format!("{}bit/s", r.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answers(peers: Vec<(String, Vec<String>)>, rate: &str, rtt: &str) -> InitAnswers {
        InitAnswers {
            link: "hk-us".into(),
            interface: "eth2".into(),
            peers,
            capacity: rate.parse().unwrap(),
            rtt: rtt.parse().unwrap(),
            dscp: None,
            roce_traffic_class: None,
            transport: true,
            tcp_buffers: false,
        }
    }

    fn shipped(name: &str) -> Policy {
        let text = super::super::SHIPPED.iter().find(|(n, _)| *n == name).unwrap().1;
        Policy::parse(text, name).unwrap()
    }

    /// At the lab's 180 ms, the ladder is hk-us.toml's: the same thresholds, hysteresis and
    /// estimator (so a trace replays through the same states) and the same codecs; and it
    /// changes nothing the site owns unless asked.
    #[test]
    fn the_ladder_is_the_shipped_hk_us_one_and_keeps_what_the_site_owns() {
        let us = parse_peer("us=198.18.2.0/24,2001:db8:2::/64").unwrap();
        let text = render(&answers(vec![us.clone()], "100Mbit/s", "180ms")).unwrap();
        let ours = Policy::parse(&text, "init").unwrap();
        let hk_us = shipped("hk-us");
        assert_eq!(ours.estimator, hk_us.estimator);
        assert_eq!(ours.hysteresis, hk_us.hysteresis);
        assert_eq!(ours.states.len(), hk_us.states.len());
        for (a, b) in ours.states.iter().zip(&hk_us.states) {
            assert_eq!((&a.name, &a.enter, &a.exit), (&b.name, &b.enter, &b.exit));
            assert_eq!(a.knobs.compression, b.knobs.compression, "{}", a.name);
            assert_eq!(a.knobs.transport, b.knobs.transport, "{}", a.name);
            let kept = (a.knobs.dscp, a.knobs.roce_traffic_class, a.knobs.tcp_buffers);
            assert_eq!(kept, (None, None, None), "{}", a.name);
        }
        assert_eq!(ours.host, super::super::Host::default());
        // Asked for: the values, in every state; no transport profile with --no-transport.
        let asked = InitAnswers {
            dscp: Some(10),
            roce_traffic_class: Some(106),
            transport: false,
            tcp_buffers: true,
            ..answers(vec![us], "100Mbit/s", "180ms")
        };
        let p = Policy::parse(&render(&asked).unwrap(), "asked").unwrap();
        for s in &p.states {
            assert_eq!((s.knobs.dscp, s.knobs.roce_traffic_class), (Some(10), Some(106)));
            assert_eq!(s.knobs.tcp_buffers, Some(super::super::Setting::Auto));
            assert!(s.knobs.transport.is_none(), "{}", s.name);
        }
    }

    #[test]
    fn sizes_follow_the_bdp_and_the_result_passes_the_checks() {
        let us = parse_peer("us=10.2.0.0/16,2001:db8:2::/64").unwrap();
        let text = render(&answers(vec![us], "40Gbit/s", "180ms")).unwrap();
        // 40 Gbit/s x 180 ms = 900 MB: buffers capped at 1 GiB, chunks 16 MiB (BDP / 64).
        assert!(text.contains("max = \"1GiB\""), "{text}");
        assert!(text.contains("max = \"16MiB\""), "{text}");
        assert!(
            text.contains("cross_jitter = \"100ms\"") && text.contains("cross_jitter = \"200ms\""),
            "{text}"
        );
        let p = Policy::parse(&text, "t").unwrap();
        assert_eq!(p.links[0].peers.len(), 1);
        // A LAN: small bounds, jitter thresholds at their floors.
        let text = render(&answers(vec![], "10Gbit/s", "200us")).unwrap();
        assert!(text.contains("cross_jitter = \"20ms\""), "{text}");
        assert!(text.contains("max = \"8MiB\""), "{text}");
        // Every RTT from a rack to a planet's far side makes a ladder the checks take.
        for rtt in ["50us", "1ms", "25ms", "35ms", "70ms", "180ms", "600ms", "2s"] {
            render(&answers(vec![], "100Mbit/s", rtt)).unwrap_or_else(|e| panic!("{rtt}: {e}"));
        }
        assert!(text.contains("No [[link.peer]]"), "{text}");
    }

    #[test]
    fn bad_answers_are_refused_with_what_is_wrong() {
        assert!(parse_peer("us").unwrap_err().contains("NAME=CIDR"));
        assert!(parse_peer("=10.0.0.0/8").is_err());
        assert!(parse_peer("us=10.0.0.0/8,").is_err());
        let bad = parse_peer("us=10.0.0.300/8").unwrap();
        let e = render(&answers(vec![bad], "1Gbit/s", "10ms")).unwrap_err().to_string();
        assert!(e.contains("10.0.0.300/8"), "{e}");
    }
}
