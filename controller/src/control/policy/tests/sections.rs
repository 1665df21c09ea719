//! The optional sections of a policy, checked: `[host]`, `[env]`, `[outcome]` and each state's
//! `[state.transport]`, and the shipped static recipe that sets them.

use super::*;

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
