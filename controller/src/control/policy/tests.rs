//! Shipped policies parse; golden error messages.

use super::*;

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
            "p.toml:15:9: state \"congested\" needs enter thresholds (any of rtt_inflation, cross_rtt_inflation, rtt_p99, jitter, ce_fraction, cross_ce_fraction, retrans, cnp_rate, goodput_below, unanswered)",
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
fn host_and_env_sections() {
    let cases = [
        ("\n[host]\ntcp_ecn = 1\nnetdev_max_backlog = 250000\n[env]\nNCCL_ALGO = \"Tree\"\n", "OK"),
        (
            "\n[host]\ntcp_ecn = 3\nnetdev_max_backlog = 0\n",
            "p.toml:14:11: host tcp_ecn 3 must be 0 (off), 1 (ask for and accept ECN) or 2 (accept when asked, the kernel's default)\n\
             p.toml:15:22: host netdev_max_backlog 0 must be 1 to 2147483647 (a C int)",
        ),
        (
            "\n[host]\ntcp_slow_start_after_idle = 2\n",
            "p.toml:14:29: host tcp_slow_start_after_idle 2 must be 0 (keep the window after idle) or 1 (restart it, the kernel's default)",
        ),
        (
            "\n[host]\nnetdev_max_backlog = 2147483648\n",
            "p.toml:14:22: host netdev_max_backlog 2147483648 must be 1 to 2147483647 (a C int)",
        ),
        (
            "\n[host]\ntcp_ecn = \"on\"\n",
            "p.toml:14:11: invalid type: string \"on\", expected i64, or \"keep\"",
        ),
        ("\n[host]\ntcp_ecn = \"keep\"\ntcp_slow_start_after_idle = \"keep\"\n", "OK"),
        (
            "\n[host]\nrmem_max = 1\n",
            "p.toml:14:1: unknown field `rmem_max`, expected one of `tcp_ecn`, `netdev_max_backlog`, `tcp_slow_start_after_idle`",
        ),
        (
            "\n[env]\nNCCL_ALGO = \"Tree\"\nNCCL_IB_TIMEOUT = \"20\"\n",
            "p.toml:15:1: env NCCL_IB_TIMEOUT: linkpilot computes it (NCCL_IB_TIMEOUT, NCCL_IB_RETRY_CNT, NCCL_IB_TC, NCCL_BUFFSIZE, NCCL_TUNER_PLUGIN, TORCH_NCCL_ASYNC_ERROR_HANDLING, LINKPILOT_*): set it through the knobs, not [env]",
        ),
        (
            "\n[env]\nLINKPILOT_STATE = \"healthy\"\n",
            "p.toml:14:1: env LINKPILOT_STATE: linkpilot computes it (NCCL_IB_TIMEOUT, NCCL_IB_RETRY_CNT, NCCL_IB_TC, NCCL_BUFFSIZE, NCCL_TUNER_PLUGIN, TORCH_NCCL_ASYNC_ERROR_HANDLING, LINKPILOT_*): set it through the knobs, not [env]",
        ),
        (
            "\n[env]\n\"NCCL-ALGO\" = \"Tree\"\n",
            "p.toml:14:1: env \"NCCL-ALGO\" is not an environment variable name (a letter or '_', then letters, digits and '_')",
        ),
        (
            "\n[env]\nNCCL_ALGO = \"Tree\\nNCCL_IB_TIMEOUT=1\"\n",
            "p.toml:14:13: env NCCL_ALGO: value \"Tree\\nNCCL_IB_TIMEOUT=1\" must be one line without NUL",
        ),
        (
            "\n[env]\nNCCL_ALGO = \"Tree; rm -rf /\"\n",
            "p.toml:14:13: env NCCL_ALGO: value \"Tree; rm -rf /\" may only use letters, digits and _ - . , : / = + @ % ^ (the env file is sourced by shells, unquoted)",
        ),
        (
            "\n[env]\nNCCL_NTHREADS = 512\n",
            "p.toml:14:17: invalid type: integer `512`, expected a string",
        ),
    ];
    for (extra, want) in cases {
        assert_eq!(errors(extra), want, "for:\n{extra}");
    }
}

#[test]
fn the_static_policy_is_the_whole_recipe() {
    let fixed = Policy::parse(SHIPPED[2].1, "static").unwrap();
    assert_eq!(
        fixed.host,
        Host {
            tcp_ecn: Some(1),
            netdev_max_backlog: Some(250_000),
            tcp_slow_start_after_idle: None
        }
    );
    let env: Vec<(&str, &str)> = fixed.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(
        env,
        [
            ("NCCL_ALGO", "Tree"),
            ("NCCL_MIN_NRINGS", "2"),
            ("NCCL_NET_GDR_LEVEL", "2"),
            ("NCCL_NTHREADS", "512"),
            ("NCCL_PROTO", "Simple"),
        ]
    );
    // The reference link's adaptive policy takes the recipe's host settings too (its states read
    // CE marks, which need ECN negotiated) and keeps windows across idle gaps; the default one
    // leaves the host as it is. Neither fixes NCCL variables.
    let hk = Policy::parse(SHIPPED[1].1, "hk-us").unwrap();
    let keeps_windows = Host { tcp_slow_start_after_idle: Some(0), ..fixed.host };
    assert_eq!((hk.host, hk.env.len()), (keeps_windows, 0));
    let default = Policy::parse(SHIPPED[0].1, "default").unwrap();
    assert_eq!((default.host, default.env.len()), (Host::default(), 0));
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

/// A congested state whose knobs add `sync` (TOML lines), behind `bounds` (a `[bounds]` line).
fn with_sync(bounds: &str, sync: &str) -> String {
    let src = format!(
        "{bounds}\n[[link]]\nname = \"wan\"\ninterfaces = [\"eth0\"]\ncapacity = \"10Gbit/s\"\n\n\
         [[state]]\nname = \"healthy\"\n[state.knobs]\ncompression = \"none\"\ndscp = 26\n\
         roce_traffic_class = 106\n{sync}\n"
    );
    match Policy::parse(&src, "p.toml") {
        Ok(p) => format!("OK {:?}", p.states[0].knobs.sync_every),
        Err(e) => e.to_string(),
    }
}

#[test]
fn synchronization_knobs_are_checked_against_their_bounds() {
    let b = "[bounds]\nsync_every = { min = 8, max = 400, margin = \"25%\", max_drift = 1600 }";
    let cases = [
        ("", "", "OK Fixed(1)"),
        (b, "sync_every = \"auto\"\nfragments = 4\noverlap = 1", "OK Auto"),
        (b, "sync_every = 40\nouter_codec = \"int4\"\nfragments = 4\noverlap = 9", "OK Fixed(40)"),
        (
            b,
            "sync_every = 500",
            "p.toml:10:1: state \"healthy\": sync_every 500 lies outside the bounds 8..=400 (1, the per-step exchange, is always allowed)",
        ),
        (
            b,
            "sync_every = 40\nfragments = 41",
            "p.toml:10:1: state \"healthy\": fragments 41 must be from 1 to sync_every's 40 (one send a step at most)",
        ),
        (
            b,
            "sync_every = \"auto\"\nfragments = 9",
            "p.toml:10:1: state \"healthy\": fragments 9 must be from 1 to sync_every's smallest, 8 (one send a step at most)",
        ),
        (
            b,
            "sync_every = 40\nfragments = 4\noverlap = 10",
            "p.toml:10:1: state \"healthy\": overlap 10 must be below the 10 steps between two sends (sync_every 40 / fragments 4)",
        ),
        (
            b,
            "sync_every = \"every\"",
            "p.toml:14:14: invalid type: string \"every\", expected u32, or \"auto\"",
        ),
        (
            "[bounds]\nsync_every = { min = 10, max = 5 }",
            "",
            "p.toml:2:14: sync_every bounds: min 10 must be at least 1 and at most max 5",
        ),
        (
            "[bounds]\nsync_every = { max = 300, max_drift = 100 }",
            "",
            "p.toml:2:14: sync_every max_drift 100 must be at least max 300: a site may always finish a round",
        ),
    ];
    for (bounds, sync, want) in cases {
        assert_eq!(with_sync(bounds, sync), want, "{bounds} / {sync}");
    }
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

#[test]
fn the_outcome_section_is_checked() {
    let p = Policy::parse(SHIPPED[0].1, "default").unwrap();
    assert!(p.outcome.judge, "judging is on unless a policy turns it off");
    assert_eq!((p.outcome.window, p.outcome.slower_by), (Nanos(30_000_000_000), 0.1));
    let ok = errors("[outcome]\nwindow = \"20s\"\nsteps_to_loss = { int8 = 1.05, topk = 1.3 }");
    assert_eq!(ok, "OK");
    let bad = errors(
        "[outcome]\nwindow = \"0s\"\nslower_by = \"100%\"\nmin_steps = 0\nhold = \"120min\"\n\
         steps_to_loss = { int9 = 1.0, int8 = 0.0 }",
    );
    for want in [
        "p.toml:12:1: outcome window 0s must be between 1s and 600s",
        "outcome slower_by must be above 0% and below 100%",
        "outcome min_steps must be at least 1",
        "outcome hold must be above 0s and at most hold_max",
        "outcome steps_to_loss names \"int9\"; codecs are none, fp16, bf16, int8, int4, topk",
        "outcome steps_to_loss.int8 = 0 must be between 0.1 and 100",
    ] {
        assert!(bad.contains(want), "{want:?} not in:\n{bad}");
    }
    assert!(errors("[outcome]\nwindows = \"1s\"").contains("unknown field `windows`"));
}

#[test]
fn dscp_and_roce_class_may_be_kept_on_the_whole_ladder() {
    let ladder = |healthy: &str, congested: &str| {
        format!(
            "[[link]]\nname = \"wan\"\ninterfaces = [\"eth0\"]\n\n\
             [[state]]\nname = \"healthy\"\n[state.knobs]\ncompression = \"none\"\n{healthy}\n\n\
             [[state]]\nname = \"congested\"\nenter = {{ ce_fraction = \"1%\" }}\n\
             [state.knobs]\ncompression = \"int8\"\n{congested}\n"
        )
    };
    // Written as "keep" or left out: the same, in every state.
    for (h, c) in [("dscp = \"keep\"\nroce_traffic_class = \"keep\"", "dscp = \"keep\""), ("", "")]
    {
        let p = Policy::parse(&ladder(h, c), "p.toml").unwrap();
        for s in &p.states {
            assert_eq!((s.knobs.dscp, s.knobs.roce_traffic_class), (None, None), "{}", s.name);
        }
    }
    let p =
        Policy::parse(&ladder("dscp = 26\nroce_traffic_class = \"keep\"", "dscp = 46"), "p.toml")
            .unwrap();
    let knobs: Vec<_> =
        p.states.iter().map(|s| (s.knobs.dscp, s.knobs.roce_traffic_class)).collect();
    assert_eq!(knobs, [(Some(26), None), (Some(46), None)]);
    // Kept in one state, set in another: refused where the second state's knobs are.
    let e =
        Policy::parse(&ladder("dscp = 26", "dscp = \"keep\""), "p.toml").unwrap_err().to_string();
    assert_eq!(
        e,
        "p.toml:14:1: state \"congested\" keeps dscp while state \"healthy\" sets it; \"keep\" \
         (or leaving it out) applies to every state of the ladder or to none"
    );
    let e =
        Policy::parse(&ladder("", "roce_traffic_class = 106"), "p.toml").unwrap_err().to_string();
    assert!(
        e.contains("state \"congested\" sets roce_traffic_class while state \"healthy\" keeps it"),
        "{e}"
    );
    let e = Policy::parse(&ladder("dscp = \"kept\"", ""), "p.toml").unwrap_err().to_string();
    assert!(e.starts_with("p.toml:9:8: ") && e.contains("or \"keep\""), "{e}");
    let e = Policy::parse(&ladder("dscp = 64", "dscp = 46"), "p.toml").unwrap_err().to_string();
    assert!(e.contains("state \"healthy\": dscp 64 must be 0..=63, or \"keep\""), "{e}");
}

#[test]
fn transport_profiles_are_checked_and_algorithms_located() {
    let with = |transport: &str| {
        format!(
            "[[link]]\nname = \"wan\"\ninterfaces = [\"eth0\"]\n\n\
             [[state]]\nname = \"healthy\"\n[state.knobs]\ncompression = \"none\"\n\
             [state.transport]\n{transport}\n"
        )
    };
    let p = Policy::parse(
        &with("congestion_control = \"bbr\"\ninitial_cwnd = 10\nsocket_buffers = \"auto\"\necn = true"),
        "p.toml",
    )
    .unwrap();
    assert!(p.has_transport());
    let t = p.states[0].knobs.transport.unwrap();
    assert_eq!(t.congestion_control.map(|c| c.to_string()), Some("bbr".into()));
    assert_eq!((t.initial_cwnd, t.socket_buffers, t.ecn), (10, Some(Setting::Auto), true));
    let avail = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
    assert!(p.check_algorithms(&avail("reno cubic bbr")).is_ok());
    let e = p.check_algorithms(&avail("reno cubic")).unwrap_err().to_string();
    assert_eq!(
        e,
        "p.toml:10:22: state \"healthy\": congestion control \"bbr\" is not available on this \
         host (it offers: reno cubic; a module such as tcp_bbr may add it)"
    );
    for (bad, want) in [
        ("congestion_control = \"BBR!\"", "p.toml:10:22: state \"healthy\": congestion control \"BBR!\" is not an algorithm's name"),
        ("initial_cwnd = 0", "transport initial_cwnd must be 1..=1000 segments"),
        ("socket_buffers = \"4GiB\"", "transport socket_buffers 4GiB lies outside"),
        ("pacing = 1", "unknown field `pacing`"),
    ] {
        let e = Policy::parse(&with(bad), "p.toml").unwrap_err().to_string();
        assert!(e.contains(want), "{bad}: {e}");
    }
    let none = Policy::parse(&with("").replace("[state.transport]\n", ""), "p.toml").unwrap();
    assert!(!none.has_transport() && none.congestion_controls.is_empty());
}

#[test]
fn every_knob_has_a_default_so_a_state_may_set_none() {
    let src = "[[link]]\nname = \"wan\"\ninterfaces = [\"eth0\"]\n\n\
               [[state]]\nname = \"healthy\"\n[state.knobs]\n";
    let p = Policy::parse(src, "p.toml").unwrap_or_else(|e| panic!("{e}"));
    let k = p.states[0].knobs;
    assert_eq!(
        (k.compression, k.dscp, k.roce_traffic_class),
        (Setting::Fixed(Compression::None), None, None)
    );
    assert_eq!((k.chunk, k.tcp_buffers, k.transport), (Setting::Auto, Some(Setting::Auto), None));
}

#[test]
fn compression_auto_and_its_bounds() {
    let ladder = |healthy: &str, worse: &str, bounds: &str| {
        format!(
            "[bounds]\n{bounds}\n[[link]]\nname = \"wan\"\ninterfaces = [\"eth0\"]\n\
             [[state]]\nname = \"healthy\"\n[state.knobs]\ncompression = \"{healthy}\"\n\
             [[state]]\nname = \"mid\"\nenter = {{ ce_fraction = \"1%\" }}\n[state.knobs]\n\
             compression = \"auto\"\n\
             [[state]]\nname = \"worse\"\nenter = {{ ce_fraction = \"5%\" }}\n[state.knobs]\n\
             compression = \"{worse}\"\n"
        )
    };
    let errors = |src: &str| match Policy::parse(src, "p.toml") {
        Ok(_) => Vec::new(),
        Err(e) => e.to_string().lines().map(str::to_owned).collect::<Vec<_>>(),
    };
    let p = Policy::parse(&ladder("int8", "int4", ""), "p.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.states[1].knobs.compression, Setting::Auto);
    let b = &p.bounds;
    assert_eq!((b.codec_weakest, b.codec_strongest), (Compression::None, Compression::Int4));
    assert_eq!((b.codec_margin, b.codec_latency_rtts), (0.25, 1.0));
    // "auto" stands outside the ladder; the fixed codecs around it still form one.
    let e = errors(&ladder("int4", "int8", ""));
    assert!(
        e.iter().any(|e| e.contains("state \"worse\": compression int8 is lighter than int4 in the healthier state \"healthy\"")),
        "{e:?}"
    );
    assert!(errors(&ladder("none", "int4", "")).is_empty());
    let bad = "compression = { weakest = \"int4\", strongest = \"fp16\", margin = \"5%\", latency_rtts = 1000.0 }";
    let e = errors(&ladder("none", "int4", bad));
    assert!(
        e.iter()
            .any(|e| e.contains("compression bounds: weakest int4 sends less than strongest fp16")),
        "{e:?}"
    );
    assert!(
        e.iter().any(|e| e.contains("compression latency_rtts 1000 must be from 0 to 100")),
        "{e:?}"
    );
    let e = errors(&ladder("auto-ish", "int4", ""));
    assert!(
        e.iter()
            .any(|e| e.contains("invalid compression \"auto-ish\"") && e.contains("or \"auto\"")),
        "{e:?}"
    );
}

/// "keep" socket buffer maxima: the whole ladder or none of it; nothing that needs the buffers
/// sized (socket_buffers "auto", a probed capacity) beside it; "keep" host sysctls are unset.
#[test]
fn kept_socket_buffers_and_host_sysctls() {
    let kept = Policy::parse(
        "[[link]]\nname = \"wan\"\ninterfaces = [\"eth0\"]\ncapacity = \"10Gbit/s\"\n\
         [[state]]\nname = \"healthy\"\n[state.knobs]\ntcp_buffers = \"keep\"\n\
         [host]\ntcp_ecn = \"keep\"\nnetdev_max_backlog = 1000\n",
        "p.toml",
    )
    .unwrap();
    assert_eq!(kept.states[0].knobs.tcp_buffers, None);
    assert_eq!(kept.host, Host { netdev_max_backlog: Some(1000), ..Host::default() });
    let cases = [
        (
            "\n[[state]]\nname = \"congested\"\nenter = { retrans = \"1%\" }\n[state.knobs]\n\
             dscp = 26\nroce_traffic_class = 106\ntcp_buffers = \"keep\"\n",
            "p.toml:16:1: state \"congested\" keeps tcp_buffers while state \"healthy\" sets it; \"keep\" (or leaving it out) applies to every state of the ladder or to none",
        ),
        (
            "\n[[state]]\nname = \"congested\"\nenter = { retrans = \"1%\" }\n[state.knobs]\n\
             dscp = 26\nroce_traffic_class = 106\ntcp_buffers = \"1KB\"\n",
            "p.toml:19:15: invalid size \"1KB\": expected a number and a unit: B, KiB, MiB, GiB, kB, MB, GB (e.g. \"2MiB\"), or \"auto\", or \"keep\"",
        ),
    ];
    for (extra, want) in cases {
        assert_eq!(errors(extra), want, "for:\n{extra}");
    }
    let with = |knobs: &str, capacity: &str| {
        let src = format!(
            "[[link]]\nname = \"wan\"\ninterfaces = [\"eth0\"]\ncapacity = \"{capacity}\"\n\
             [[state]]\nname = \"healthy\"\n[state.knobs]\ntcp_buffers = \"keep\"\n{knobs}"
        );
        Policy::parse(&src, "p.toml").map(|_| ()).map_err(|e| e.to_string())
    };
    let e = with("[state.transport]\nsocket_buffers = \"auto\"\n", "10Gbit/s").unwrap_err();
    assert!(
        e.contains("socket_buffers \"auto\" is the state's tcp_buffers, which is \"keep\""),
        "{e}"
    );
    assert!(with("[state.transport]\nsocket_buffers = \"8MiB\"\n", "10Gbit/s").is_ok());
    let e = with("", "auto").unwrap_err();
    assert!(e.contains("capacity \"auto\", which probes the rate"), "{e}");
}
