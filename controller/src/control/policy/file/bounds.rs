//! `[bounds]` as written: the limits every knob "auto" derives stays within, one table per knob
//! family, each with its defaults. Apart from the rest of the schema because these tables only
//! ever hold numbers and change together with the knobs' derivations (`control::auto`).

use linkpilot_common::units::{Bytes, Nanos, Percent};
use toml::Spanned;

use super::unspanned;
use crate::control::knobs::Compression;

section! {
    RawBounds {
        chunk: Spanned<RawChunkBounds> = unspanned(RawChunkBounds::default()),
        tcp_buffers: Spanned<RawBufferBounds> = unspanned(RawBufferBounds::default()),
        nccl_ib_timeout: Spanned<RawIbTimeout> = unspanned(RawIbTimeout::default()),
        watchdog: Spanned<RawWatchdog> = unspanned(RawWatchdog::default()),
        sync_every: Spanned<RawSyncBounds> = unspanned(RawSyncBounds::default()),
        compression: Spanned<RawCodecBounds> = unspanned(RawCodecBounds::default()),
    }
}

section! {
    /// `[bounds] chunk`.
    RawChunkBounds {
        min: Bytes = Bytes(1 << 20),
        max: Bytes = Bytes(64 << 20),
        /// Value until the first RTT measurement.
        initial: Bytes = Bytes(4 << 20),
        /// Chunks in flight across the link (channels x pipeline steps): chunk = BDP / in_flight.
        in_flight: u32 = 64,
        /// Largest factor between two consecutive values.
        max_step: f64 = 2.0,
    }
}

section! {
    /// `[bounds] tcp_buffers`.
    RawBufferBounds {
        min: Bytes = Bytes(4 << 20),
        max: Bytes = Bytes(1 << 30),
        /// Buffer = bdp_factor x capacity x RTT p99.
        bdp_factor: f64 = 2.0,
        max_step: f64 = 4.0,
    }
}

section! {
    /// `[bounds] nccl_ib_timeout`.
    RawIbTimeout {
        /// NCCL_IB_TIMEOUT: smallest t with 4.096 us x 2^t >= k x RTT p99.
        k: f64 = 4.0,
        min: u8 = 14,
        max: u8 = 24,
    }
}

section! {
    /// `[bounds] watchdog`.
    RawWatchdog {
        min: Nanos = Nanos(600_000_000_000),
        max: Nanos = Nanos(3_600_000_000_000),
        /// Watchdog = rtt_multiple x peak RTT p99 (a collective waits on many round trips).
        rtt_multiple: f64 = 3000.0,
        /// Largest factor of one decrease (increases are immediate: a spike must not kill a job).
        max_step: f64 = 2.0,
    }
}

section! {
    /// `[bounds] sync_every`: what "auto" may choose, how much of an exchange's time it keeps to
    /// spare, and how far a site may run ahead without a sync (an outage) before it waits.
    RawSyncBounds {
        min: u32 = 1,
        max: u32 = 500,
        margin: Percent = Percent(0.2),
        max_drift: u32 = 2000,
    }
}

section! {
    /// `[bounds] compression`: the codecs `compression = "auto"` chooses among, the share of the
    /// compute time an exchange keeps to spare, and the round trips an exchange waits besides
    /// its bytes.
    RawCodecBounds {
        weakest: Compression = Compression::None,
        strongest: Compression = Compression::Int4,
        margin: Percent = Percent(0.25),
        latency_rtts: f64 = 1.0,
    }
}
