//! `linkpilot policy init`: a commented starting policy for one link from a few answers (its
//! interface, the far side's prefixes, its capacity and base RTT). The RTT and capacity size the
//! bounds (buffers and chunks from the bandwidth-delay product, timeouts from the RTT); the
//! ladder's thresholds are the shipped default's, with the jitter ones scaled to the RTT.

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

/// The policy's text, checked: an answer the checks refuse (a bad prefix, an interface name the
/// parser cannot take) comes back as their errors, located in the generated text.
pub fn render(a: &InitAnswers) -> Result<String, PolicyErrors> {
    let rtt_ms = (a.rtt.0 as f64 / 1e6).max(0.001);
    let bdp = a.capacity.0 / 8.0 * rtt_ms / 1e3;
    // Buffers up to twice the BDP (the auto formula's factor), within what a socket may hold.
    let buffers_max = pow2_at_least(2.0 * bdp).clamp(8 << 20, 1 << 30);
    let chunk_max = pow2_at_least(bdp / 64.0).clamp(4 << 20, 256 << 20);
    // Jitter thresholds: a share of the RTT, above a floor a LAN's scheduling noise stays
    // under; each of severe's twice degraded's, so the ladder never overlaps.
    let jitter = |share: f64, floor: u64| ms(((rtt_ms * share).round() as u64).max(floor));
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
    let _ = writeln!(w, "# Written by `linkpilot policy init`; every key is in docs/policy.md.");
    let _ = writeln!(w, "# First run it observe-only: `linkpilot run --dry-run --policy THIS` and");
    let _ = writeln!(
        w,
        "# `linkpilot status` show the states and knobs it would set, changing nothing."
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
[[state]]
name = "healthy"
[state.knobs]
compression = "none"
# "keep" (in every state) leaves a knob to the site: the packets' DSCP, or the RoCE class.
dscp = 26                  # AF31 on the link's egress packets to its peers
roce_traffic_class = 106   # NCCL_IB_TC: a class with ECN on your switches

[[state]]
name = "congested"
enter = {{ ce_fraction = "1%", retrans = "0.5%", rtt_inflation = "25%" }}
exit = {{ ce_fraction = "0.2%", retrans = "0.1%", rtt_inflation = "10%" }}
[state.knobs]
compression = "int8"
dscp = 26
roce_traffic_class = 106

[[state]]
name = "degraded"
enter = {{ ce_fraction = "5%", retrans = "2%", rtt_inflation = "60%", jitter = "{dj}" }}
exit = {{ ce_fraction = "1%", retrans = "0.5%", rtt_inflation = "25%", jitter = "{dx}" }}
[state.knobs]
compression = "int4"
dscp = 26
roce_traffic_class = 106

[[state]]
name = "severe"
# unanswered: retransmitted and heard nothing back for 1 s: a dead link or peer.
enter = {{ retrans = "5%", rtt_inflation = "120%", jitter = "{sj}", unanswered = "1s" }}
exit = {{ retrans = "2%", rtt_inflation = "60%", jitter = "{sx}", unanswered = "500ms" }}
[state.knobs]
compression = "int4"
dscp = 26
roce_traffic_class = 106
"#,
        dj = jitter(0.5, 20),
        dx = jitter(0.25, 10),
        sj = jitter(1.0, 40),
        sx = jitter(0.5, 20),
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
        }
    }

    #[test]
    fn sizes_follow_the_bdp_and_the_result_passes_the_checks() {
        let us = parse_peer("us=10.2.0.0/16,2001:db8:2::/64").unwrap();
        let text = render(&answers(vec![us], "40Gbit/s", "180ms")).unwrap();
        // 40 Gbit/s x 180 ms = 900 MB: buffers capped at 1 GiB, chunks 16 MiB (BDP / 64).
        assert!(text.contains("max = \"1GiB\""), "{text}");
        assert!(text.contains("max = \"16MiB\""), "{text}");
        assert!(text.contains("jitter = \"90ms\""), "{text}");
        let p = Policy::parse(&text, "t").unwrap();
        assert_eq!(p.links[0].peers.len(), 1);
        // A LAN: small bounds, jitter thresholds at their floors.
        let text = render(&answers(vec![], "10Gbit/s", "200us")).unwrap();
        assert!(text.contains("jitter = \"20ms\""), "{text}");
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
