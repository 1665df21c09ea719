//! A state's knobs, checked: defaults, "keep" on the whole ladder or none, synchronization
//! within its bounds, and `compression = "auto"` with its bounds.

use super::*;

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
