//! Shipped policies parse; golden error messages; links, peers and the limits the programs and
//! the knob board set. The `errors` fixture here serves the section and knob tests too.

use super::*;

mod knobs;
mod sections;

#[test]
fn shipped_policies_parse() {
    for (name, src) in SHIPPED {
        let p = Policy::parse(src, name).unwrap_or_else(|e| panic!("{name}:\n{e}"));
        assert!(!p.links.is_empty() && !p.states.is_empty(), "{name}");
    }
    let hk = Policy::parse(SHIPPED[1].1, "hk-us").unwrap();
    let healthy = &hk.states[0].knobs;
    assert_eq!(healthy.chunk, Setting::Fixed(8 << 20));
    assert_eq!(
        (healthy.roce_traffic_class, healthy.nccl_ib_timeout),
        (Some(106), Setting::Fixed(22))
    );
    assert_eq!(hk.states[0].knobs.compression, Setting::Fixed(Compression::Int8));
    assert!(hk.states[1..]
        .iter()
        .all(|s| s.knobs.compression == Setting::Fixed(Compression::Int4)));
    let fixed = Policy::parse(SHIPPED[2].1, "static").unwrap();
    assert_eq!(fixed.states.len(), 1);
    assert_eq!(fixed.states[0].knobs.compression, Setting::Fixed(Compression::Int8));
    // NCCL_ALGO=Tree, NCCL_PROTO=Simple of the reference case, in every state.
    let tree_simple = NcclRule { algo: Some(0), proto: Some(2), max_channels: 0 };
    assert_eq!(hk.nccl, Nccl { min_bytes: 1 << 20, rules: vec![tree_simple; 4] });
    assert_eq!(fixed.nccl.rules, vec![tree_simple]);
    // The built-in rules: NCCL's own choice while healthy, Simple once worse.
    let default = Policy::parse(SHIPPED[0].1, "default").unwrap();
    let simple = NcclRule { proto: Some(2), ..NcclRule::default() };
    assert_eq!(default.nccl.rules, vec![NcclRule::default(), simple, simple, simple]);
    assert_eq!(default.nccl.min_bytes, 1 << 20);
}

/// The errors of `src` appended to a minimal valid policy, as printed.
fn errors(extra_states: &str) -> String {
    let src = format!(
        "[[link]]\nname = \"wan\"\ninterfaces = [\"eth0\"]\ncapacity = \"10Gbit/s\"\n\n\
         [[state]]\nname = \"healthy\"\n[state.knobs]\ncompression = \"none\"\ndscp = 26\n\
         roce_traffic_class = 106\n{extra_states}"
    );
    match Policy::parse(&src, "p.toml") {
        Ok(_) => "OK".into(),
        Err(e) => e.to_string(),
    }
}

fn congested(enter: &str, exit: &str, compression: &str) -> String {
    format!(
        "\n[[state]]\nname = \"congested\"\nenter = {{ {enter} }}\n{exit}[state.knobs]\n\
         compression = \"{compression}\"\ndscp = 26\nroce_traffic_class = 106\n"
    )
}

#[test]
fn golden_errors() {
    let cases = [
        (congested("ce_fraction = \"1%\"", "", "int8"), "OK"),
        (
            "\n[[state]]\nname = \"x\"\nbogus = 1\n".to_owned(),
            "p.toml:15:1: unknown field `bogus`, expected one of `name`, `enter`, `exit`, `knobs`, `transport`",
        ),
        (
            congested("ce_fraction = \"1 percent\"", "", "int8"),
            "p.toml:15:25: invalid percentage \"1 percent\": expected a number followed by % (e.g. \"0.5%\")",
        ),
        (
            congested("ce_fraction = \"1%\"", "exit = { ce_fraction = \"2%\" }\n", "int8"),
            "p.toml:16:8: state \"congested\": exit ce_fraction 2% must be at or below its enter threshold 1%, or the state could never be left",
        ),
        (
            congested("ce_fraction = \"1%\"", "", "none")
                + &congested("ce_fraction = \"1%\"", "", "int8").replace("congested", "worse"),
            "p.toml:23:9: state \"worse\": ce_fraction 1% overlaps state \"congested\" (1%); states are ordered healthiest first, so its threshold must be higher",
        ),
        (
            congested("ce_fraction = \"1%\"", "", "int8")
                + &congested("ce_fraction = \"5%\"", "", "fp16").replace("congested", "worse"),
            "p.toml:24:1: state \"worse\": compression fp16 is lighter than int8 in the healthier state \"congested\"; compression may only get stronger as states worsen",
        ),
        (
            congested("", "", "int8"),
            "p.toml:15:9: state \"congested\" needs enter thresholds (any of rtt_inflation, cross_rtt_inflation, rtt_p99, jitter, cross_jitter, ce_fraction, cross_ce_fraction, retrans, cnp_rate, goodput_below, unanswered)",
        ),
        (
            "[bounds]\nchunk = { min = \"8MiB\", max = \"4MiB\", initial = \"4MiB\" }\n".to_owned(),
            "p.toml:13:9: chunk bounds: min 8MiB must be above 0 and at most max 4MiB\np.toml:13:9: chunk initial 4MiB must lie within min 8MiB and max 4MiB",
        ),
        (
            "\n[[state]]\nname = \"x\\nNCCL_IB_TIMEOUT=1\"\nenter = { ce_fraction = \"1%\" }\n[state.knobs]\ncompression = \"int8\"\ndscp = 26\nroce_traffic_class = 106\n".to_owned(),
            "p.toml:14:8: state name \"x\\nNCCL_IB_TIMEOUT=1\" may only use letters, digits, '.', '_' and '-'",
        ),
        (
            "\n[nccl]\nmin_bytes = \"1000KiB\"\nalgo = \"tree\"\n".to_owned(),
            "p.toml:13:1: nccl min_bytes 1000KiB must be 0 or a power of two (the plugin counts collectives in power-of-two size classes)",
        ),
        (
            "\n[nccl.state.healthy]\nalgo = \"Tree\"\nproto = \"ll256\"\nmax_channels = 65\n".to_owned(),
            "p.toml:13:1: nccl.state.healthy: algo \"Tree\" is not one of auto, tree, ring, collnet_direct, collnet_chain, nvls, nvls_tree, pat\n\
             p.toml:13:1: nccl.state.healthy: proto \"ll256\" is not one of auto, ll, ll128, simple\n\
             p.toml:13:1: nccl.state.healthy: max_channels 65 must be 0 (NCCL's count) to 64",
        ),
        (
            "\n[nccl.state.sever]\nalgo = \"tree\"\n".to_owned(),
            "p.toml:13:1: nccl.state.sever: no such state (the ladder: healthy)",
        ),
        (
            "\n[nccl]\nchannels = 4\n".to_owned(),
            "p.toml:14:1: unknown field `channels`, expected one of `min_bytes`, `algo`, `proto`, `max_channels`, `state`",
        ),
    ];
    for (extra, want) in cases {
        assert_eq!(errors(&extra), want, "for:\n{extra}");
    }
}

#[test]
fn limits_the_programs_and_the_board_have_are_checked() {
    // Appended TOML lands in the last table; start new ones where needed.
    let link = |i: usize| {
        format!("\n[[link]]\nname = \"l{i}\"\ninterfaces = [\"e{i}\"]\ncapacity = \"1Gbit/s\"\n")
    };
    let nine: String = (1..=8).map(link).collect();
    assert!(errors(&nine).contains("at most 8 links: the knob board holds that many"));
    let same_iface =
        "\n[[link]]\nname = \"lan\"\ninterfaces = [\"eth0\"]\ncapacity = \"1Gbit/s\"\n";
    let e = errors(same_iface);
    assert!(e.contains("interface \"eth0\" is already on link \"wan\""), "{e}");
    // DSCP rules: a link's interfaces x its peers (x 1 without peers).
    let peers = |n: usize| -> String {
        (0..n)
            .map(|i| format!("[[link.peer]]\nname = \"p{i}\"\ncidrs = [\"10.0.{i}.0/24\"]\n"))
            .collect()
    };
    let e = errors(&format!(
        "\n[[link]]\nname = \"many\"\ninterfaces = [\"e1\", \"e2\", \"e3\", \"e4\"]\n\
         capacity = \"1Gbit/s\"\n{}",
        peers(16)
    ));
    assert!(
        e.contains(
            "65 DSCP rules needed (each link's interfaces x its peers, or x 1 without peers: \
             \"wan\" 1 x 1 + \"many\" 4 x 16); at most 64 fit: name fewer interfaces or peers"
        ),
        "{e}"
    );
    // Eight links (the board's limit), seven of them with two interfaces and four peers, fit.
    let eight: String = (1..=7)
        .map(|i| {
            format!(
                "\n[[link]]\nname = \"l{i}\"\ninterfaces = [\"a{i}\", \"b{i}\"]\n\
                 capacity = \"1Gbit/s\"\n{}",
                peers(4)
            )
        })
        .collect();
    assert_eq!(errors(&eight), "OK");
    // 15 peers of 18 prefixes: few enough peers and DSCP rules, but 270 prefixes for a trie
    // of 256.
    let peers: String = (0..15)
        .map(|i| {
            let cidrs: Vec<String> = (0..18).map(|j| format!("\"10.{i}.{j}.0/24\"")).collect();
            format!("[[link.peer]]\nname = \"p{i}\"\ncidrs = [{}]\n", cidrs.join(", "))
        })
        .collect();
    let e = errors(&format!(
        "\n[[link]]\nname = \"many\"\ninterfaces = [\"e1\"]\ncapacity = \"1Gbit/s\"\n{peers}"
    ));
    assert_eq!(
        e,
        "p.toml:1:1: 270 peer prefixes (CIDRs of all peers together, IPv4 as IPv4-mapped IPv6); \
         the programs' peer table holds at most 256"
    );
    // One prefix under two peers (one spelt IPv4-mapped): refused, naming both.
    let e = errors(
        "\n[[link.peer]]\nname = \"us\"\ncidrs = [\"198.18.2.0/24\"]\n\
         [[link.peer]]\nname = \"eu\"\ncidrs = [\"::ffff:198.18.2.0/120\"]\n",
    );
    assert!(e.contains("peer \"eu\"") && e.contains("of peer \"us\" already"), "{e}");
    let e = errors("\n[bounds]\ntcp_buffers = { min = \"4MiB\", max = \"4GiB\" }\n");
    assert!(e.contains("tcp_buffers max 4GiB must be below 2GiB"), "{e}");
    for bad in ["k = nan", "k = inf", "k = -1.0"] {
        let e = errors(&format!("\n[bounds]\nnccl_ib_timeout = {{ {bad}, min = 14, max = 24 }}\n"));
        assert!(e.contains("nccl_ib_timeout k must be above 0"), "{bad}: {e}");
    }
    let e = errors("\n[estimator]\nwindow = \"10min\"\newma_half_life = \"0ms\"\n");
    assert!(
        e.contains("p.toml:") && e.contains("estimator window 600s must be at most 60s"),
        "{e}"
    );
    assert!(e.contains("estimator ewma_half_life must be above 0"), "{e}");
}

/// A link without a capacity is "auto" (so is `capacity = "auto"`); goodput_below, a share of
/// the nominal capacity, is then refused with the link and the state named.
#[test]
fn capacity_may_be_auto_but_not_with_goodput_below() {
    let with = |capacity: &str, extra: &str| {
        format!(
            "[[link]]\nname = \"wan\"\ninterfaces = [\"eth0\"]\n{capacity}\n\n\
             [[state]]\nname = \"healthy\"\n[state.knobs]\ncompression = \"none\"\ndscp = 26\n\
             roce_traffic_class = 106\n{extra}"
        )
    };
    for capacity in ["", "capacity = \"auto\""] {
        let p = Policy::parse(&with(capacity, ""), "p.toml").unwrap();
        assert_eq!(p.links[0].capacity_bps, None);
    }
    let p = Policy::parse(&with("capacity = \"1Gbit/s\"", ""), "p.toml").unwrap();
    assert_eq!(p.links[0].capacity_bps, Some(1e9));
    let slow = "[[state]]\nname = \"slow\"\nenter = { goodput_below = \"10%\" }\n\
                [state.knobs]\ncompression = \"int8\"\ndscp = 26\nroce_traffic_class = 106\n";
    let e = Policy::parse(&with("", slow), "p.toml").unwrap_err().to_string();
    assert!(
        e.contains("link \"wan\" has capacity \"auto\" (no capacity given), but state \"slow\" uses goodput_below"),
        "{e}"
    );
    assert!(Policy::parse(&with("capacity = \"1Gbit/s\"", slow), "p.toml").is_ok());
    let e = Policy::parse(&with("capacity = \"fast\"", ""), "p.toml").unwrap_err().to_string();
    assert!(e.contains("or \"auto\""), "{e}");
}
