//! The plugin as NCCL meets it: a C harness (tests/harness.c, built here with the system's `cc`)
//! dlopens the .so, looks the symbols up v6 -> v5 -> v4, checks the layout from C and drives
//! init / getCollInfo / getChunkSize / finalize with NCCL-like cost tables, while this test
//! adopts and withdraws decisions through the gate as the training code does, with a knob board
//! beside it that must change nothing. And the libnccl.so.2 of the `nvidia-nccl-cu13` wheel must
//! name the symbols the plugin exports.

mod harness;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use harness::*;
use linkpilot::board::tuner_stats::{self, Counted};
use linkpilot_common::board::{nccl, offsets};

#[test]
fn abi_from_c_and_symbol_lookup_order() {
    let (_guard, dir) = temp_dir("abi");
    let mut h = Harness::start(&dir);
    // The C side's static asserts held (it compiled); the exported objects have the sizes of
    // ncclTuner_v6_t, v5 and v4, and members at the same offsets are the same functions.
    assert_eq!(
        h.one("abi").join(" "),
        "abi name linkpilot linkpilot linkpilot sizes 40 32 32 shared ok"
    );
}

#[test]
fn calls_follow_the_adopted_decision_never_the_hosts_board() {
    let (_guard, dir) = temp_dir("rules");
    let _board = hosts_own_board(&dir.join("knobs"));
    let mut h = Harness::start(&dir);

    // Init: NCCL's constants as they are (no job-wide latency given; the board's RTT is one
    // host's and stays out).
    let (c, net) = h.init(6);
    assert_eq!(net, NET_DEFAULTS);
    assert_eq!(h.logged("NCCL's own choices until the training code adopts a decision"), 1);

    // Nothing adopted: NCCL's own choices, though the host's board says congested.
    for _ in 0..3 {
        assert_eq!(h.coll(c, 6, ALLREDUCE, 64 << 20, &TABLE), (0, 0, TABLE.to_vec()));
        assert_eq!(
            h.chunk(c, ALLREDUCE, 64 << 20, nccl::ALGO_RING, nccl::PROTO_SIMPLE, 4 << 20),
            (0, 4 << 20)
        );
    }
    assert_eq!(h.logged("allreduce 64MiB-128MiB: NCCL's own choice (no decision adopted)"), 1);

    // Adopted (congested): Tree/Simple preferred (cost 0, nothing else moves), at most 4
    // channels, chunk scaled to 2 MiB: Ring 4 MiB -> 1 MiB, Tree 1 MiB -> 256 KiB.
    h.adopt(CONGESTED, 10);
    let tree_simple = with(TABLE, at(nccl::ALGO_TREE, nccl::PROTO_SIMPLE), 0.0);
    for _ in 0..3 {
        assert_eq!(h.coll(c, 6, ALLREDUCE, 64 << 20, &TABLE), (0, 4, tree_simple.clone()));
    }
    assert_eq!(
        h.chunk(c, ALLREDUCE, 64 << 20, nccl::ALGO_RING, nccl::PROTO_SIMPLE, 4 << 20),
        (0, 1 << 20)
    );
    assert_eq!(
        h.chunk(c, ALLREDUCE, 64 << 20, nccl::ALGO_TREE, nccl::PROTO_SIMPLE, 1 << 20),
        (0, 256 << 10)
    );
    // The adoption is said once per communicator, each change of a choice once.
    assert_eq!(
        h.logged("adopted at step 10 (link state 1): tree/simple from 1MiB, at most 4 channels, chunks as if NCCL_BUFFSIZE were 2MiB"),
        1,
        "{:#?}",
        h.logs
    );
    assert_eq!(
        h.logged("allreduce 64MiB-128MiB: tree/simple, at most 4 channels (adopted at step 10)"),
        1
    );
    assert_eq!(h.logged("allreduce 64MiB-128MiB ring/simple: chunk 1MiB (decided chunk 2MiB, NCCL_BUFFSIZE 8MiB; adopted at step 10)"), 1);
    // An entry NCCL did not allow (-1) is never touched: NCCL's own choice among the rest.
    let no_tree_simple: [f32; 21] =
        with(TABLE, at(nccl::ALGO_TREE, nccl::PROTO_SIMPLE), -1.0).try_into().unwrap();
    assert_eq!(h.coll(c, 6, ALLREDUCE, 64 << 20, &no_tree_simple), (0, 4, no_tree_simple.to_vec()));
    // Nothing allowed stays nothing allowed (no channel cap for an algorithm NCCL cannot run).
    assert_eq!(h.coll(c, 6, ALLREDUCE, 64 << 20, &[-1.0; 21]), (0, 0, vec![-1.0; 21]));
    // Below min_bytes, and collective types the plugin does not know: NCCL's own choices.
    assert_eq!(h.coll(c, 6, ALLREDUCE, 512 << 10, &TABLE), (0, 0, TABLE.to_vec()));
    assert_eq!(h.coll(c, 6, 9, 64 << 20, &TABLE), (0, 0, TABLE.to_vec()));
    assert_eq!(h.chunk(c, 9, 64 << 20, nccl::ALGO_RING, nccl::PROTO_SIMPLE, 4 << 20), (0, 4 << 20));
    // LL, LL128 and the algorithms NCCL_BUFFSIZE does not size keep NCCL's chunk.
    assert_eq!(
        h.chunk(c, ALLREDUCE, 64 << 20, nccl::ALGO_RING, nccl::PROTO_LL, 1 << 19),
        (0, 1 << 19)
    );
    assert_eq!(
        h.chunk(c, ALLREDUCE, 64 << 20, nccl::ALGO_NVLS, nccl::PROTO_SIMPLE, 1 << 17),
        (0, 1 << 17)
    );
    // A chunk above NCCL_BUFFSIZE: NCCL's largest (its buffer), not more.
    h.adopt("255 255 0 1 1048576 33554432", 11);
    assert_eq!(
        h.chunk(c, ALLREDUCE, 64 << 20, nccl::ALGO_RING, nccl::PROTO_SIMPLE, 4 << 20),
        (0, 4 << 20)
    );
    assert_eq!(h.logged("is above NCCL_BUFFSIZE 8MiB: NCCL's largest"), 1);
    // A decision of another layout, or an algorithm NCCL does not have: refused, nothing moves.
    assert_eq!(h.one("badsize"), ["rc", "-1"]);
    assert_eq!(h.one("adopt 9 2 4 1 1048576 2097152 12"), ["rc", "-2"]);
    assert_eq!(
        h.chunk(c, ALLREDUCE, 64 << 20, nccl::ALGO_RING, nccl::PROTO_SIMPLE, 4 << 20),
        (0, 4 << 20)
    );

    // What the counter file shows `linkpilot status` (read with the daemon's reader).
    h.adopt(CONGESTED, 12);
    h.coll(c, 6, ALLREDUCE, 64 << 20, &TABLE);
    h.chunk(c, ALLREDUCE, 64 << 20, nccl::ALGO_RING, nccl::PROTO_SIMPLE, 4 << 20);
    let p = h.counters(&dir, |p| p.adopted_step == 12 && p.calls == 11);
    assert_eq!(
        (p.pid, p.communicators, p.adoption.as_str(), p.adoptions),
        (h.child.id(), 1, "adopted", 3)
    );
    assert_eq!((p.calls, p.adopted_calls, p.buffsize_bytes), (11, 8, BUFFSIZE));
    let row =
        p.choices.iter().find(|r| r.collective == "allreduce" && r.size_from == 64 << 20).unwrap();
    assert_eq!(
        (row.algo.as_deref(), row.proto.as_deref(), row.channels, row.chunk_bytes, row.step),
        (Some("tree"), Some("simple"), 4, 1 << 20, 12)
    );

    // Withdrawn (the ranks' boards were not all fresh): NCCL's own choices, said once.
    assert_eq!(h.one("withdraw"), ["rc", "0"]);
    for _ in 0..3 {
        assert_eq!(h.coll(c, 6, ALLREDUCE, 64 << 20, &TABLE), (0, 0, TABLE.to_vec()));
        assert_eq!(
            h.chunk(c, ALLREDUCE, 64 << 20, nccl::ALGO_RING, nccl::PROTO_SIMPLE, 4 << 20),
            (0, 4 << 20)
        );
    }
    assert_eq!(h.logged("decision withdrawn"), 1, "{:#?}", h.logs);
    h.counters(&dir, |p| p.adoption == "withdrawn");
    // Bad arguments NCCL could pass: every call still succeeds and garbles nothing.
    assert_eq!(h.one(&format!("null {c}")).join(" "), "rcs 0 0 0 0 0 0 0 0 chunk 4096 garbled 0");

    // The last communicator's finalize removes the counter file.
    let file = h.counter_file(&dir).unwrap();
    assert_eq!(h.one(&format!("fin {c} 6")), ["rc", "0"]);
    assert!(!file.exists());
}

#[test]
fn network_latency_only_from_a_job_wide_value() {
    let (_guard, dir) = temp_dir("latency");
    let _board = hosts_own_board(&dir.join("knobs"));
    let mut h = Harness::start_with(&dir, &[("LINKPILOT_NCCL_NET_LATENCY_US", "90000")]);
    let (c6, net) = h.init(6);
    for (got, d) in net.iter().zip(NET_DEFAULTS) {
        let want = if d > 0.0 { d + 90_000.0 } else { 0.0 };
        assert!((got - want).abs() < 1e-6, "NET latencies {net:?}");
    }
    assert_eq!(h.logged("NCCL network latency + 90000 us (LINKPILOT_NCCL_NET_LATENCY_US)"), 1);
    let (c4, net4) = h.init(4);
    assert_eq!(net4[2], 14.0, "v4 has no constants to change");
    for c in [(c6, 6), (c4, 4)] {
        assert_eq!(h.one(&format!("fin {} {}", c.0, c.1)), ["rc", "0"]);
    }
    let mut bad = Harness::start_with(&dir, &[("LINKPILOT_NCCL_NET_LATENCY_US", "90ms")]);
    let (c, net) = bad.init(6);
    assert_eq!(net, NET_DEFAULTS);
    assert_eq!(
        bad.logged("LINKPILOT_NCCL_NET_LATENCY_US=\"90ms\" is not a number"),
        1,
        "{:#?}",
        bad.logs
    );
    assert_eq!(bad.one(&format!("fin {c} 6")), ["rc", "0"]);
}

#[test]
fn a_board_frozen_mid_write_changes_nothing() {
    // A daemon killed while writing leaves an odd sequence number: a reader that spins on it
    // stalls every call. The plugin reads no board, so its calls neither stall nor change.
    let (_guard, dir) = temp_dir("frozen");
    let board = dir.join("knobs");
    let w = hosts_own_board(&board);
    drop(w);
    let mut bytes = std::fs::read(&board).unwrap();
    bytes[offsets::SEQ..offsets::SEQ + 8].copy_from_slice(&7u64.to_le_bytes());
    std::fs::write(&board, bytes).unwrap();
    let mut h = Harness::start(&dir);
    let (c, _) = h.init(6);
    h.adopt(SEVERE, 3);
    let ring_ll = with(TABLE, at(nccl::ALGO_RING, nccl::PROTO_LL), 0.0);
    assert_eq!(h.coll(c, 6, ALLREDUCE, 64 << 20, &TABLE), (0, 2, ring_ll));
    assert_eq!(h.one(&format!("threads 8 {c}")), ["started", "8"]);
    std::thread::sleep(Duration::from_millis(300));
    let out = h.ask("stop");
    let calls: u64 = out
        .iter()
        .find_map(|l| l.strip_prefix("calls "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    // Every outcome the adopted severe rule's: Ring/LL, 2 channels; the workers' Ring/Simple
    // chunk (4 MiB at NCCL_BUFFSIZE 8 MiB) scaled to its 1 MiB.
    let severe = format!("sig c:{}:2", at(nccl::ALGO_RING, nccl::PROTO_LL));
    assert!(
        out.iter().all(|l| l.starts_with(&severe)
            || l.starts_with("sig k:524288")
            || l.starts_with("calls ")),
        "{out:?}"
    );
    assert!(calls > 1000, "{out:?}");
    assert_eq!(h.one(&format!("fin {c} 6")), ["rc", "0"]);
}

#[test]
fn v5_and_v4_communicators_work_alongside() {
    let (_guard, dir) = temp_dir("versions");
    let mut h = Harness::start(&dir);
    let (c5, _) = h.init(5);
    let (c4, _) = h.init(4);
    h.adopt(CONGESTED, 1);
    let tree_simple = with(TABLE, at(nccl::ALGO_TREE, nccl::PROTO_SIMPLE), 0.0);
    assert_eq!(h.coll(c5, 5, ALLREDUCE, 64 << 20, &TABLE), (0, 4, tree_simple.clone()));
    assert_eq!(h.coll(c4, 4, ALLREDUCE, 64 << 20, &TABLE), (0, 4, tree_simple.clone()));
    // One adoption, said once by each communicator.
    assert_eq!(h.logged("adopted at step 1 (link state 1)"), 2);
    h.counters(&dir, |p| p.communicators == 2);
    assert_eq!(h.one(&format!("fin {c5} 5")), ["rc", "0"]);
    h.counters(&dir, |p| p.communicators == 1);
    let file = h.counter_file(&dir).unwrap();
    assert_eq!(h.one(&format!("fin {c4} 4")), ["rc", "0"]);
    assert!(!file.exists());
    // NCCL unloads the library after the last communicator and loads it again for the next.
    // The counter writer's thread keeps the library loaded (glibc does not unload a library
    // whose thread registered thread-local destructors), so the adopted decision lasts: every
    // rank runs the same code and sees the same.
    assert_eq!(h.one("reload").join(" "), "reloaded v6 dlclose 0");
    let (c6, _) = h.init(6);
    assert_eq!(h.coll(c6, 6, ALLREDUCE, 64 << 20, &TABLE), (0, 4, tree_simple.clone()));
    h.adopt(SEVERE, 2);
    let ring_ll = with(TABLE, at(nccl::ALGO_RING, nccl::PROTO_LL), 0.0);
    assert_eq!(h.coll(c6, 6, ALLREDUCE, 64 << 20, &TABLE), (0, 2, ring_ll));
    assert!(h.counter_file(&dir).is_some());
    assert_eq!(h.one(&format!("fin {c6} 6")), ["rc", "0"]);
}

#[test]
fn eight_threads_while_decisions_are_adopted_10000_times() {
    let (_guard, dir) = temp_dir("threads");
    let mut h = Harness::start(&dir);
    let (c, _) = h.init(6);
    h.adopt(CALM, 0);
    assert_eq!(h.one(&format!("threads 8 {c}")), ["started", "8"]);
    // The calm rule sets a 6 MiB chunk but min_bytes 128 MiB: its 64 MiB collectives keep
    // NCCL's chunk. A read that tore between the chunk and min_bytes (different words of the
    // gate) would scale by 6 MiB: a 3 MiB chunk no decision asks for.
    let rules = [CALM, CONGESTED, SEVERE];
    for i in 0..10_000u64 {
        h.adopt(rules[(i % 3) as usize], i + 1);
    }
    let out = h.ask("stop");
    // Every outcome is one decision's. getCollInfo: (entry set to 0, channels), from one read
    // of the gate; a torn read would pair one rule's preference with another's cap.
    // getChunkSize (a separate call, maybe of another decision): Ring/Simple's 4 MiB at
    // NCCL_BUFFSIZE 8 MiB scaled to the rule's chunk.
    let allowed = [
        "c:-1:0".to_owned(),                                        // calm
        format!("c:{}:4", at(nccl::ALGO_TREE, nccl::PROTO_SIMPLE)), // congested
        format!("c:{}:2", at(nccl::ALGO_RING, nccl::PROTO_LL)),     // severe
        format!("k:{}", 4 << 20),
        format!("k:{}", 1 << 20),
        format!("k:{}", 512 << 10),
    ];
    let mut seen = 0;
    for line in &out {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w[0] {
            "sig" => {
                assert!(
                    allowed.contains(&w[1].to_owned()),
                    "outcome {} is no decision's: {out:?}",
                    w[1]
                );
                seen += usize::from(w[1].starts_with("c:"));
            }
            "calls" => {
                assert_eq!(
                    (w[3], w[5]),
                    ("0", "0"),
                    "overflowing outcomes or failed calls: {line}"
                );
                assert!(
                    w[1].parse::<u64>().unwrap() > 1000,
                    "too few calls to say anything: {line}"
                );
            }
            _ => panic!("{line}"),
        }
    }
    assert!(seen >= 2, "the workers should have seen the decision change: {out:?}");
    assert_eq!(h.one(&format!("fin {c} 6")), ["rc", "0"]);
}

#[test]
fn the_counter_file_truncated_and_replaced_from_outside_breaks_nothing() {
    // The directory is shared by every training process of the node (pods in their own PID
    // namespaces often have the same pid); anyone may truncate or replace a file in it.
    let (_guard, dir) = temp_dir("truncated");
    let mut h = Harness::start(&dir);
    let (c, _) = h.init(6);
    h.adopt(CONGESTED, 1);
    let file = h.counter_file(&dir).unwrap();
    let name = file.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with(&format!("{}-", h.child.id()))
            && name.len() == name.find('-').unwrap() + 17,
        "{name}"
    );
    assert_eq!(h.one(&format!("threads 8 {c}")), ["started", "8"]);
    // Truncated (opened O_TRUNC by someone else): the process lives on, and the next write makes
    // the file whole again.
    std::fs::OpenOptions::new().write(true).truncate(true).open(&file).unwrap();
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 0);
    std::thread::sleep(Duration::from_millis(200));
    let p = h.counters(&dir, |p| p.adoption == "adopted" && p.calls > 1000);
    assert_eq!(p.communicators, 1);
    // Replaced (another file renamed over its name): the process lives on; the new file is
    // nobody's (no lock), and the daemon's scan removes it.
    let other = dir.join("stats").join("planted");
    std::fs::write(&other, vec![0u8; linkpilot_common::tuner::TUNER_SIZE]).unwrap();
    std::fs::rename(&other, &file).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(matches!(tuner_stats::read_file(&file), Ok(Counted::Dead)));
    assert!(tuner_stats::scan(&dir.join("stats"), true).is_empty());
    assert!(!file.exists());
    let out = h.ask("stop");
    let tree = format!("sig c:{}:4", at(nccl::ALGO_TREE, nccl::PROTO_SIMPLE));
    assert!(out.iter().any(|l| l.starts_with(&tree)), "{out:?}");
    assert!(out.iter().any(|l| l.starts_with("calls ") && l.ends_with("bad_rc 0")), "{out:?}");
    assert_eq!(h.one(&format!("fin {c} 6")), ["rc", "0"]);
}

#[test]
fn a_forked_child_does_not_keep_a_dead_processs_file_alive() {
    // Data loaders fork workers after NCCL started: they inherit the counter file's descriptor,
    // and with it the flock, unless the plugin closes it in the child.
    let (_guard, dir) = temp_dir("fork");
    let mut h = Harness::start(&dir);
    let (_c, _) = h.init(6);
    let file = h.counter_file(&dir).unwrap();
    let answer = h.one("forkchild 60");
    assert_eq!(answer[2..], ["ready", "1"], "{answer:?}");
    let child: i32 = answer[1].parse().unwrap();
    assert!(matches!(tuner_stats::read_file(&file), Ok(Counted::Live(_))));
    h.child.kill().unwrap();
    h.child.wait().unwrap();
    // The parent is gone, its child lives on: the file is a dead process's.
    assert!(
        matches!(tuner_stats::read_file(&file), Ok(Counted::Dead)),
        "{:?}",
        tuner_stats::read_file(&file)
    );
    // SAFETY: signalling the child the harness forked for this test.
    unsafe { libc::kill(child, libc::SIGKILL) };
}

/// The libnccl.so.2 of the `nvidia-nccl-cu13` wheel (torch's NCCL) in the repository's .venv.
fn wheel_libnccl() -> PathBuf {
    let lib = Path::new(REPO).join(".venv/lib");
    let found = std::fs::read_dir(&lib).ok().and_then(|d| {
        d.flatten()
            .map(|e| e.path().join("site-packages/nvidia/nccl/lib/libnccl.so.2"))
            .find(|p| p.exists())
    });
    found.unwrap_or_else(|| {
        panic!(
            "no site-packages/nvidia/nccl/lib/libnccl.so.2 under {}: `cargo xtask setup` makes \
             the venv (torch pulls nvidia-nccl-cu13)",
            lib.display()
        )
    })
}

#[test]
fn nccls_own_binary_looks_up_the_symbols_we_export() {
    let nccl = std::fs::read(wheel_libnccl()).unwrap();
    // NUL-terminated strings "ncclTunerPlugin_vN" (the names NCCL hands to dlsym).
    let names = |prefix: &[u8]| -> Vec<String> {
        let mut v: Vec<String> = nccl
            .windows(prefix.len() + 2)
            .filter(|w| {
                w.starts_with(prefix)
                    && w[prefix.len()].is_ascii_digit()
                    && w[prefix.len() + 1] == 0
            })
            .map(|w| String::from_utf8_lossy(&w[..prefix.len() + 1]).into_owned())
            .collect();
        v.sort();
        v.dedup();
        v
    };
    let looked_up = names(b"ncclTunerPlugin_v");
    // What we export: the .so's dynamic symbols, as the dynamic linker sees them.
    let out = Command::new("nm").args(["-D", "--defined-only"]).arg(plugin()).output().unwrap();
    let ours: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter(|s| s.starts_with("ncclTuner"))
        .map(str::to_owned)
        .collect();
    assert_eq!(ours, ["ncclTunerPlugin_v4", "ncclTunerPlugin_v5", "ncclTunerPlugin_v6"]);
    // And the gate the training code calls.
    assert!(String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.ends_with(" T linkpilot_tuner_adopt")));
    for s in &ours {
        assert!(
            looked_up.contains(s),
            "NCCL's binary does not name {s}: it looks up {looked_up:?}"
        );
    }
    // And NCCL knows no newer version than ours.
    assert_eq!(looked_up.last().map(String::as_str), Some("ncclTunerPlugin_v6"), "{looked_up:?}");
}
