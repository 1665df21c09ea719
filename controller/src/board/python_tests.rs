//! The Python package's board reader (`python/linkpilot/board.py`) against this writer: every
//! field a slot carries, read back by a separate process. Its own file because it runs
//! `python3` and checks the layout's other implementation, not the seqlock.

use std::{fs, time::Duration};

use linkpilot_common::board::nccl;

use super::*;
use crate::control::{plan::SyncBounds, policy::NcclRule, Compression, Knobs, SyncKnobs};

/// Reads the board at argv[1] with the Python package's reader, as JSON. Only the standard
/// library may be needed: the reader is for processes without torch too.
const READ: &str = r#"
import dataclasses, json, sys
from linkpilot.board import KnobBoard
with KnobBoard(sys.argv[1]) as board:
    snap = board.read()
assert "torch" not in sys.modules, "linkpilot.board imported torch"
out = dataclasses.asdict(snap)
out["codecs"] = [k.codec for k in snap.links]
print(json.dumps(out))
"#;

#[test]
fn the_python_package_reader_agrees() {
    let dir = std::env::temp_dir().join(format!("lp-board-py-{}", std::process::id()));
    let path = dir.join("knobs");
    let now = crate::kernel::probes::monotonic_ns();
    let mut w = BoardWriter::create(&path, Duration::from_secs(60), now).unwrap();
    let k = Knobs {
        compression: Compression::TopK(0.01),
        sync: SyncKnobs {
            sync_every: 0,
            outer_compression: Compression::TopK(0.02),
            outer_codec_auto: true,
            fragments: 4,
            overlap: 3,
        },
        ..Knobs::recipe()
    };
    let k2 = Knobs { compression: Compression::Int4, sync: SyncKnobs::default(), ..k };
    let mut hk = board_link("hk-us", "severe", 3, &k, 42);
    let rule =
        NcclRule { algo: Some(nccl::ALGO_TREE), proto: Some(nccl::PROTO_SIMPLE), max_channels: 4 };
    set_nccl(&mut hk, rule, 1 << 20, Some(180.25));
    let policy = crate::control::Policy::parse(
        "[bounds]\nsync_every = { min = 8, max = 400, margin = \"25%\", max_drift = 1600 }\n\
         compression = { weakest = \"fp16\", strongest = \"topk:2%\" }\n\
         [[link]]\nname = \"hk-us\"\ninterfaces = [\"eth0\"]\ncapacity = \"40Gbit/s\"\n\
         [[state]]\nname = \"healthy\"\n[state.knobs]\ncompression = \"none\"\ndscp = 26\n\
         roce_traffic_class = 106\n",
        "test",
    )
    .unwrap();
    set_sync_facts(&mut hk, &SyncBounds::of(&policy.bounds), 2.5e8, 4e10);
    w.set_pending(linkpilot_common::board::pending::SYSCTL);
    w.publish(&[hk, board_link("eu", "x", 1, &k2, 9)], now);
    let python = concat!(env!("CARGO_MANIFEST_DIR"), "/../python");
    let out = std::process::Command::new("python3")
        .env("PYTHONPATH", python)
        .args(["-c", READ])
        .arg(&path)
        .output()
        .unwrap();
    let _ = fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["stale"].as_bool(), v["pid"].as_u64()),
        (Some(false), Some(std::process::id().into())),
        "{v}"
    );
    assert_eq!((v["decision_id"].as_u64(), v["heartbeat_ns"].as_u64()), (Some(42), Some(now)));
    assert_eq!(v["heartbeat_interval_ms"].as_u64(), Some(60_000));
    assert_eq!(v["pending"], serde_json::json!(["sysctl"]));
    assert_eq!(v["codecs"], serde_json::json!(["topk:0.01", "int4"]));
    let l = &v["links"][0];
    assert_eq!((l["name"].as_str(), l["state"].as_str()), (Some("hk-us"), Some("severe")));
    assert_eq!((l["state_index"].as_u64(), l["compression"].as_str()), (Some(3), Some("topk")));
    assert_eq!(l["topk_ratio"].as_f64(), Some(0.01));
    assert_eq!(
        (l["chunk_bytes"].as_u64(), l["tcp_buffer_bytes"].as_u64()),
        (Some(8 << 20), Some(128 << 20))
    );
    assert_eq!(
        (l["watchdog_s"].as_u64(), l["nccl_ib_timeout"].as_u64(), l["nccl_ib_retry_cnt"].as_u64()),
        (Some(1800), Some(22), Some(7))
    );
    assert_eq!((l["dscp"].as_u64(), l["roce_traffic_class"].as_u64()), (Some(26), Some(106)));
    assert_eq!(l["decision_id"].as_u64(), Some(42));
    assert_eq!(
        (l["nccl_algo"].as_str(), l["nccl_proto"].as_str(), l["nccl_max_channels"].as_u64()),
        (Some("tree"), Some("simple"), Some(4))
    );
    assert_eq!(
        (l["nccl_min_bytes"].as_u64(), l["rtt_us"].as_u64()),
        (Some(1 << 20), Some(180_250))
    );
    assert_eq!(
        (l["sync_every"].as_u64(), l["sync_min"].as_u64(), l["sync_max"].as_u64()),
        (Some(0), Some(8), Some(400))
    );
    assert_eq!(
        (l["sync_margin"].as_f64(), l["max_drift"].as_u64(), l["outer_codec"].as_str()),
        (Some(0.25), Some(1600), Some("topk:0.02"))
    );
    assert_eq!((l["fragments"].as_u64(), l["overlap"].as_u64()), (Some(4), Some(3)));
    // outer_codec = "auto": the training side chooses from fp16 to top-k 2%.
    assert_eq!(
        (l["outer_codec_auto"].as_bool(), l["outer_weakest"].as_str()),
        (Some(true), Some("fp16"))
    );
    assert_eq!(
        (l["delivery_bps"].as_u64(), l["capacity_bps"].as_u64()),
        (Some(250_000_000), Some(40_000_000_000))
    );
    let e = &v["links"][1];
    assert_eq!(
        (e["name"].as_str(), e["state_index"].as_u64(), e["decision_id"].as_u64()),
        (Some("eu"), Some(1), Some(9))
    );
    assert_eq!(
        (e["sync_every"].as_u64(), e["fragments"].as_u64(), e["outer_codec"].as_str()),
        (Some(1), Some(1), Some("int8"))
    );
    assert_eq!(e["outer_codec_auto"].as_bool(), Some(false));
    // No [nccl] rule: NCCL's own choices.
    assert_eq!((e["nccl_algo"].as_str(), e["nccl_proto"].as_str()), (Some("auto"), Some("auto")));
}
