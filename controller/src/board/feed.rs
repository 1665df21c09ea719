//! `linkpilot board feed`: a knob board written from JSON lines on stdin instead of by a daemon's
//! decisions, so training code can be tested against chosen knobs without `linkpilot run`. It
//! writes through the daemon's own [`BoardWriter`] and [`board_link`], so readers in other
//! languages (the Python package's tests) check themselves against the daemon's bytes.

use std::{
    io::{BufRead, Write},
    path::Path,
    sync::mpsc::{self, RecvTimeoutError},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use linkpilot_common::board::{nccl, BoardLink, BOARD_MAX_LINKS, BOARD_NAME_LEN};
use serde::Deserialize;

use crate::{
    board::{board_link, BoardWriter},
    control::{Compression, Knobs, SyncKnobs},
    kernel::probes::monotonic_ns,
};

/// One input line: `{"links": [...]}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    links: Vec<FeedLink>,
}

/// One link slot; `name` is required. Omitted knobs take the reference case's starting values
/// (what `linkpilot env --policy policies/hk-us.toml` prints, and the reference policy's [nccl]:
/// Tree and Simple from 1 MiB on), so a line may name only what a test varies.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct FeedLink {
    name: String,
    state: String,
    state_index: u32,
    compression: String,
    topk_ratio: Option<f64>,
    chunk_bytes: u64,
    tcp_buffer_bytes: u64,
    watchdog_s: u32,
    nccl_ib_timeout: u8,
    nccl_ib_retry_cnt: u8,
    dscp: u8,
    roce_traffic_class: u8,
    decision_id: Option<u64>,
    nccl_algo: String,
    nccl_proto: String,
    nccl_max_channels: u8,
    nccl_min_bytes: u64,
    rtt_us: u32,
    sync_every: u32,
    sync_min: u32,
    sync_max: u32,
    max_drift: u32,
    outer_compression: String,
    outer_topk_ratio: Option<f64>,
    fragments: u16,
    overlap: u16,
    delivery_bps: u64,
    capacity_bps: u64,
    sync_margin_bp: u16,
    /// The training side chooses the outer codec, from `outer_weakest` to `outer_compression`.
    outer_codec_auto: bool,
    outer_weakest: String,
}

impl Default for FeedLink {
    fn default() -> Self {
        Self {
            name: String::new(),
            state: "healthy".into(),
            state_index: 0,
            compression: "none".into(),
            topk_ratio: None,
            chunk_bytes: 8 << 20,
            tcp_buffer_bytes: 128 << 20,
            watchdog_s: 600,
            nccl_ib_timeout: 22,
            nccl_ib_retry_cnt: 7,
            dscp: 26,
            roce_traffic_class: 106,
            decision_id: None,
            nccl_algo: "tree".into(),
            nccl_proto: "simple".into(),
            nccl_max_channels: 0,
            nccl_min_bytes: 1 << 20,
            rtt_us: 0,
            sync_every: 1,
            sync_min: 1,
            sync_max: 500,
            max_drift: 2000,
            outer_compression: "int8".into(),
            outer_topk_ratio: None,
            fragments: 1,
            overlap: 0,
            delivery_bps: 0,
            capacity_bps: 0,
            sync_margin_bp: 2000,
            outer_codec_auto: false,
            outer_weakest: "none".into(),
        }
    }
}

/// An NCCL algorithm or protocol name as its board code ("auto": NCCL's own choice).
fn nccl_code(kind: &str, name: &str, names: &[&str]) -> Result<u8, String> {
    if name == "auto" {
        return Ok(nccl::ANY);
    }
    names
        .iter()
        .position(|n| *n == name)
        .map(|i| i as u8)
        .ok_or_else(|| format!("{kind} {name:?} is not one of auto, {}", names.join(", ")))
}

/// The control core's names ("int8", "topk:1%"), plus a plain top-k fraction ("topk:0.01") and
/// "topk" with the ratio in `topk_ratio`.
fn compression(name: &str, topk_ratio: Option<f64>) -> Result<Compression, String> {
    let c = match (name, name.strip_prefix("topk:")) {
        ("topk", _) => {
            let r = topk_ratio.ok_or("compression \"topk\" needs topk_ratio")?;
            return Compression::topk(r).map_err(|e| format!("topk_ratio {r}: {e}"));
        }
        (_, Some(r)) if !r.ends_with('%') => {
            let f: f64 = r.parse().map_err(|_| format!("invalid top-k ratio {r:?}"))?;
            Compression::topk(f).map_err(|e| format!("top-k ratio {r}: {e}"))?
        }
        _ => name.parse()?,
    };
    match (c, topk_ratio) {
        (_, None) => Ok(c),
        (Compression::TopK(r), Some(t)) if r == t => Ok(c),
        (Compression::TopK(r), Some(t)) => {
            Err(format!("compression {name:?} keeps {r}, topk_ratio says {t}"))
        }
        (_, Some(_)) => Err(format!("topk_ratio is only for top-k, not {name:?}")),
    }
}

/// The board slots of one input line; `default_id` is the decision id of links that give none.
pub fn parse_line(text: &str, default_id: u64) -> Result<Vec<BoardLink>, String> {
    let line: Line = serde_json::from_str(text).map_err(|e| {
        // serde's "at line 1 column N" would read as the wrong line of the input.
        let msg = e.to_string();
        let msg = msg.rsplit_once(" at line ").map_or(msg.as_str(), |(m, _)| m).to_owned();
        format!("{msg} at column {}", e.column())
    })?;
    if line.links.len() > BOARD_MAX_LINKS {
        return Err(format!(
            "{} links, the board has room for {BOARD_MAX_LINKS}",
            line.links.len()
        ));
    }
    line.links
        .iter()
        .map(|l| {
            if l.name.is_empty() {
                return Err("a link without a \"name\"".to_owned());
            }
            // The writer cuts longer names; a test would then read a name it did not feed.
            for (what, s) in [("name", &l.name), ("state", &l.state)] {
                if s.len() >= BOARD_NAME_LEN || s.contains('\0') {
                    return Err(format!(
                        "{what} {s:?}: at most {} bytes, no NUL",
                        BOARD_NAME_LEN - 1
                    ));
                }
            }
            let k = Knobs {
                compression: compression(&l.compression, l.topk_ratio)
                    .map_err(|e| format!("link {:?}: {e}", l.name))?,
                chunk_bytes: l.chunk_bytes,
                nccl_ib_timeout: l.nccl_ib_timeout,
                nccl_ib_retry_cnt: l.nccl_ib_retry_cnt,
                watchdog_s: l.watchdog_s,
                // The board's KEEP (255) is a feed's way to say "keep".
                dscp: Some(l.dscp).filter(|d| *d != linkpilot_common::board::KEEP),
                roce_traffic_class: Some(l.roce_traffic_class)
                    .filter(|c| *c != linkpilot_common::board::KEEP),
                tcp_buffer_bytes: l.tcp_buffer_bytes,
                transport: None,
                sync: SyncKnobs {
                    sync_every: l.sync_every,
                    outer_compression: compression(&l.outer_compression, l.outer_topk_ratio)
                        .map_err(|e| format!("link {:?}: outer_compression: {e}", l.name))?,
                    outer_codec_auto: l.outer_codec_auto,
                    fragments: l.fragments,
                    overlap: l.overlap,
                },
            };
            let id = l.decision_id.unwrap_or(default_id);
            let mut slot = board_link(&l.name, &l.state, l.state_index, &k, id);
            let bad = |e| format!("link {:?}: {e}", l.name);
            slot.nccl_algo = nccl_code("nccl_algo", &l.nccl_algo, &nccl::ALGOS).map_err(bad)?;
            slot.nccl_proto = nccl_code("nccl_proto", &l.nccl_proto, &nccl::PROTOS).map_err(bad)?;
            slot.nccl_max_channels = l.nccl_max_channels;
            slot.nccl_min_bytes = l.nccl_min_bytes;
            slot.rtt_us = l.rtt_us;
            slot.sync_min = l.sync_min;
            slot.sync_max = l.sync_max;
            slot.max_drift = l.max_drift;
            slot.delivery_bps = l.delivery_bps;
            slot.capacity_bps = l.capacity_bps;
            slot.sync_margin_bp = l.sync_margin_bp;
            let weakest = compression(&l.outer_weakest, None)
                .map_err(|e| format!("link {:?}: outer_weakest: {e}", l.name))?;
            slot.outer_weakest = super::compression_code(weakest).0 as u8;
            Ok(slot)
        })
        .collect()
}

/// Creates the board at `path`, then publishes each line of `input` and beats every `heartbeat`
/// until `input` ends. Writes `published <id>` to `out` after each publish (the line's highest
/// decision id, 0 for no links). Blank lines are skipped. A bad line is an error naming its
/// number, with nothing of it published. At the end of input the board is left as it is: it
/// goes stale like a dead daemon's.
pub fn run<R, W>(path: &Path, heartbeat: Duration, input: R, out: &mut W) -> anyhow::Result<()>
where
    R: BufRead + Send + 'static,
    W: Write,
{
    let mut board = BoardWriter::create(path, heartbeat, monotonic_ns())
        .with_context(|| format!("creating the knob board {}", path.display()))?;
    // Reading on a thread lets the heartbeat go on while stdin is quiet.
    let (tx, rx) = mpsc::sync_channel(16);
    std::thread::spawn(move || {
        for line in input.lines() {
            let stop = line.is_err();
            if tx.send(line).is_err() || stop {
                return;
            }
        }
    });
    let mut next_beat = Instant::now() + heartbeat;
    let mut number = 0u64;
    loop {
        let line = match rx.recv_timeout(next_beat.saturating_duration_since(Instant::now())) {
            Ok(line) => line.context("reading stdin")?,
            Err(RecvTimeoutError::Timeout) => {
                board.heartbeat(monotonic_ns());
                next_beat += heartbeat;
                // After a stall (a suspended process), beat on from now rather than catch up.
                next_beat = next_beat.max(Instant::now());
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return Ok(()),
        };
        number += 1;
        if line.trim().is_empty() {
            continue;
        }
        let links = match parse_line(&line, number) {
            Ok(links) => links,
            Err(e) => bail!("line {number}: {e}"),
        };
        board.publish(&links, monotonic_ns());
        next_beat = Instant::now() + heartbeat;
        let id = links.iter().map(|l| l.decision_id).max().unwrap_or(0);
        writeln!(out, "published {id}")?;
        out.flush()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::board::{name, BoardReader};
    use linkpilot_common::board::compression as code;

    #[test]
    fn omitted_knobs_take_the_reference_defaults() {
        let l = parse_line(r#"{"links":[{"name":"wan"}]}"#, 5).unwrap();
        let l = l[0];
        assert_eq!(
            (name(&l.name), name(&l.state), l.state_index),
            ("wan".into(), "healthy".into(), 0)
        );
        assert_eq!(
            (l.compression, l.chunk_bytes, l.tcp_buffer_bytes),
            (code::NONE, 8 << 20, 128 << 20)
        );
        assert_eq!((l.watchdog_s, l.nccl_ib_timeout, l.nccl_ib_retry_cnt), (600, 22, 7));
        assert_eq!((l.dscp, l.roce_traffic_class, l.decision_id), (26, 106, 5));
        assert_eq!(
            (l.nccl_algo, l.nccl_proto, l.nccl_max_channels, l.nccl_min_bytes, l.rtt_us),
            (nccl::ALGO_TREE, nccl::PROTO_SIMPLE, 0, 1 << 20, 0)
        );
        let text = r#"{"links":[{"name":"wan","nccl_algo":"auto","nccl_proto":"ll128",
            "nccl_max_channels":4,"nccl_min_bytes":0,"rtt_us":180000}]}"#;
        let l = parse_line(&text.replace('\n', ""), 1).unwrap()[0];
        assert_eq!(
            (l.nccl_algo, l.nccl_proto, l.nccl_max_channels, l.nccl_min_bytes, l.rtt_us),
            (nccl::ANY, nccl::PROTO_LL128, 4, 0, 180_000)
        );
        let e = parse_line(r#"{"links":[{"name":"wan","nccl_algo":"Tree"}]}"#, 1).unwrap_err();
        assert!(e.contains("nccl_algo \"Tree\" is not one of auto, tree, ring"), "{e}");
    }

    #[test]
    fn every_codec_spelling() {
        let codec = |c: &str, extra: &str| {
            let text = format!(r#"{{"links":[{{"name":"a","compression":"{c}"{extra}}}]}}"#);
            parse_line(&text, 1).map(|l| (l[0].compression, l[0].topk_ratio))
        };
        for (c, want) in [("none", 0), ("fp16", 1), ("bf16", 2), ("int8", 3), ("int4", 4)] {
            assert_eq!(codec(c, ""), Ok((want, 0.0)), "{c}");
        }
        assert_eq!(codec("topk:0.01", ""), Ok((code::TOPK, 0.01)));
        assert_eq!(codec("topk:1%", ""), Ok((code::TOPK, 0.01)));
        assert_eq!(codec("topk", r#","topk_ratio":0.07"#), Ok((code::TOPK, 0.07)));
        assert_eq!(codec("topk:0.07", r#","topk_ratio":0.07"#), Ok((code::TOPK, 0.07)));
        for (c, extra, why) in [
            ("int3", "", "int4"),
            ("topk:0.6", "", "below 50%"),
            ("topk:x", "", "invalid top-k ratio"),
            ("topk", "", "needs topk_ratio"),
            ("topk:0.01", r#","topk_ratio":0.02"#, "topk_ratio says"),
            ("int8", r#","topk_ratio":0.02"#, "only for top-k"),
        ] {
            let e = codec(c, extra).unwrap_err();
            assert!(e.contains(why), "{c}{extra}: {e}");
        }
    }

    #[test]
    fn bad_lines_say_what_is_wrong() {
        for (text, why) in [
            ("{", "EOF while parsing an object at column 1"),
            (r#"{"links":[{"nam":"a"}]}"#, "unknown field"),
            (r#"{"links":[{"state":"congested"}]}"#, "a link without a \"name\""),
            (r#"{"links":[{"name":"a","dscp":300}]}"#, "invalid value"),
            (r#"{"links":[{"name":"0123456789012345678901234567890123"}]}"#, "at most 31"),
        ] {
            let e = parse_line(text, 1).unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
        }
        let nine = format!(r#"{{"links":[{}]}}"#, [r#"{"name":"a"}"#; 9].join(","));
        assert!(parse_line(&nine, 1).unwrap_err().contains("room for 8"));
    }

    #[test]
    fn publishes_each_line_and_stops_at_a_bad_one() {
        let dir = std::env::temp_dir().join(format!("lp-feed-{}", std::process::id()));
        let path = dir.join("knobs");
        let input = "{\"links\":[{\"name\":\"wan\",\"decision_id\":7}]}\n\n{\"links\":[]}\n{bad\n";
        let mut out = Vec::new();
        let err = run(&path, Duration::from_secs(60), std::io::Cursor::new(input), &mut out)
            .unwrap_err()
            .to_string();
        let b = BoardReader::open(&path).unwrap().read().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(err.starts_with("line 4: "), "{err}");
        assert_eq!(String::from_utf8(out).unwrap(), "published 7\npublished 0\n");
        // The second line emptied the board; the header keeps the newest decision.
        assert_eq!((b.header.n_links, b.header.decision_id), (0, 7));
    }
}
