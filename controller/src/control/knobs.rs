//! What a decision sets: the knob values and the compression scheme.

use std::{fmt, str::FromStr};

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

/// Gradient compression, from none to the most aggressive.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Compression {
    None,
    Fp16,
    Bf16,
    Int8,
    Int4,
    /// Top-k sparsification keeping this fraction of the values.
    TopK(f64),
}

impl Compression {
    /// Every mode's name, weakest first (top-k without its ratio).
    pub const MODES: &'static [&'static str] = &["none", "fp16", "bf16", "int8", "int4", "topk"];

    /// The mode's name without a top-k ratio.
    pub fn mode(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Fp16 => "fp16",
            Compression::Bf16 => "bf16",
            Compression::Int8 => "int8",
            Compression::Int4 => "int4",
            Compression::TopK(_) => "topk",
        }
    }

    /// Top-k keeping `ratio` of the values: above 0 and below 0.5 (above that it sends more
    /// than fp16).
    pub fn topk(ratio: f64) -> Result<Self, String> {
        if ratio > 0.0 && ratio < 0.5 {
            Ok(Compression::TopK(ratio))
        } else {
            Err("must be above 0% and below 50% (above that it sends more than fp16)".into())
        }
    }

    /// Bytes sent per byte of fp32 gradient (top-k sends an index with each value).
    pub fn ratio(self) -> f64 {
        match self {
            Compression::None => 1.0,
            Compression::Fp16 | Compression::Bf16 => 0.5,
            Compression::Int8 => 0.25,
            Compression::Int4 => 0.125,
            Compression::TopK(k) => 2.0 * k,
        }
    }
}

impl FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "none" => Compression::None,
            "fp16" => Compression::Fp16,
            "bf16" => Compression::Bf16,
            "int8" => Compression::Int8,
            "int4" => Compression::Int4,
            _ => {
                let bad = || {
                    format!(
                        "invalid compression {s:?}: expected none, fp16, bf16, int8, int4 or \
                         topk:RATIO (e.g. \"topk:1%\")"
                    )
                };
                let ratio = s.strip_prefix("topk:").ok_or_else(bad)?;
                let f: linkpilot_common::units::Fraction = ratio.parse().map_err(|_| bad())?;
                Compression::topk(f.0).map_err(|e| format!("top-k ratio {ratio}: {e}"))?
            }
        })
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compression::None => f.write_str("none"),
            Compression::Fp16 => f.write_str("fp16"),
            Compression::Bf16 => f.write_str("bf16"),
            Compression::Int8 => f.write_str("int8"),
            Compression::Int4 => f.write_str("int4"),
            Compression::TopK(k) => write!(f, "topk:{}%", k * 100.0),
        }
    }
}

impl<'de> Deserialize<'de> for Compression {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(de::Error::custom)
    }
}

impl Serialize for Compression {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Every knob of one link, as a decision sets them.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Knobs {
    pub compression: Compression,
    /// Bytes per pipelined chunk (NCCL_BUFFSIZE, DDP bucket).
    pub chunk_bytes: u64,
    /// NCCL_IB_TIMEOUT exponent: the QP retransmission timeout is 4.096 us * 2^t.
    pub nccl_ib_timeout: u8,
    pub nccl_ib_retry_cnt: u8,
    /// The training framework's collective watchdog, seconds.
    pub watchdog_s: u32,
    /// DSCP of the link's egress traffic (0..=63); None: left as it is ("keep").
    pub dscp: Option<u8>,
    /// RoCE traffic class byte (NCCL_IB_TC): DSCP << 2 | ECN; None: left as it is ("keep").
    pub roce_traffic_class: Option<u8>,
    /// tcp_rmem/tcp_wmem maximum (and rmem_max/wmem_max), bytes.
    pub tcp_buffer_bytes: u64,
    /// How the training side synchronizes across sites.
    #[serde(default)]
    pub sync: SyncKnobs,
    /// What the link's peers' TCP connections get (sock_ops); None: left alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<super::transport::Transport>,
}

/// How the training side synchronizes across sites (`linkpilot.outer`): every `sync_every`
/// inner steps (1: every step, the per-step exchange; 0: "auto", which the training side derives
/// within the policy's bounds from the link's rate and RTT on the board and its own compute
/// time), pseudo-gradients sent with `outer_compression` in `fragments` parts, each applied
/// `overlap` steps after it is sent.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SyncKnobs {
    pub sync_every: u32,
    /// With `outer_codec_auto`, the strongest codec the training side may choose.
    pub outer_compression: Compression,
    /// `outer_codec = "auto"`: the training side chooses the codec with H, within the policy's
    /// `[bounds] compression`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub outer_codec_auto: bool,
    pub fragments: u16,
    pub overlap: u16,
}

impl Default for SyncKnobs {
    fn default() -> Self {
        Self {
            sync_every: 1,
            outer_compression: Compression::Int8,
            outer_codec_auto: false,
            fragments: 1,
            overlap: 0,
        }
    }
}

impl SyncKnobs {
    /// "auto (at most int4)", or the codec.
    pub fn outer_codec(&self) -> String {
        if self.outer_codec_auto {
            format!("auto (at most {})", self.outer_compression)
        } else {
            self.outer_compression.to_string()
        }
    }

    /// "auto", or the inner steps per round.
    pub fn every(&self) -> String {
        if self.sync_every == 0 {
            "auto".into()
        } else {
            self.sync_every.to_string()
        }
    }
}

impl Knobs {
    /// The reference case's hand-tuned values (int8, 8 MiB chunks, NCCL_IB_TIMEOUT 22, class
    /// 106, DSCP 26, 128 MiB buffers): a fixture the tests vary from.
    #[cfg(test)]
    pub fn recipe() -> Self {
        Knobs {
            compression: Compression::Int8,
            chunk_bytes: 8 << 20,
            nccl_ib_timeout: 22,
            nccl_ib_retry_cnt: 7,
            watchdog_s: 1800,
            dscp: Some(26),
            roce_traffic_class: Some(106),
            tcp_buffer_bytes: 128 << 20,
            sync: SyncKnobs::default(),
            transport: None,
        }
    }

    /// `name: old -> new` for every knob that differs.
    pub fn changes(&self, new: &Knobs) -> Vec<String> {
        let mut v = Vec::new();
        let mut diff = |name: &str, a: String, b: String| {
            if a != b {
                v.push(format!("{name} {a} -> {b}"));
            }
        };
        diff("compression", self.compression.to_string(), new.compression.to_string());
        diff("chunk", bytes(self.chunk_bytes), bytes(new.chunk_bytes));
        diff("nccl_ib_timeout", self.nccl_ib_timeout.to_string(), new.nccl_ib_timeout.to_string());
        diff(
            "nccl_ib_retry_cnt",
            self.nccl_ib_retry_cnt.to_string(),
            new.nccl_ib_retry_cnt.to_string(),
        );
        diff("watchdog", format!("{}s", self.watchdog_s), format!("{}s", new.watchdog_s));
        diff("dscp", kept(self.dscp), kept(new.dscp));
        diff("roce_traffic_class", kept(self.roce_traffic_class), kept(new.roce_traffic_class));
        let (a, b) = (&self.sync, &new.sync);
        diff("sync_every", a.every(), b.every());
        diff("outer_codec", a.outer_codec(), b.outer_codec());
        diff("fragments", a.fragments.to_string(), b.fragments.to_string());
        diff("overlap", a.overlap.to_string(), b.overlap.to_string());
        diff("tcp_buffers", bytes(self.tcp_buffer_bytes), bytes(new.tcp_buffer_bytes));
        let describe = super::transport::describe;
        diff("transport", describe(self.transport), describe(new.transport));
        v
    }
}

/// A knob a policy may leave alone, as reasons and tables show it.
pub fn kept(v: Option<u8>) -> String {
    v.map_or_else(|| "keep".to_owned(), |v| v.to_string())
}

/// "8MiB", "1.5GiB"-style sizes for reasons and tables.
pub fn bytes(b: u64) -> String {
    linkpilot_common::units::Bytes(b).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_names_and_ratios() {
        for name in ["none", "fp16", "bf16", "int8", "int4", "topk:1%"] {
            let c: Compression = name.parse().unwrap();
            assert_eq!(c.to_string(), name);
        }
        assert_eq!("topk:1%".parse::<Compression>().unwrap().ratio(), 0.02);
        assert!("int3".parse::<Compression>().unwrap_err().contains("int4"));
        assert!("topk:60%".parse::<Compression>().unwrap_err().contains("below 50%"));
    }
}
