//! The NCCL tuner plugin's gate and entry points as a training process drives them: decisions
//! of any bytes (a size field that lies, codes out of range) adopted through
//! `linkpilot_tuner_adopt`, withdrawn, and a communicator going through the exported v6 table
//! (init with a job-wide latency of any text, getCollInfo for every collective at three sizes,
//! getChunkSize, finalize), with the logger given (the fuzz target's checks every message is one
//! NUL-terminated line; stable Rust cannot define a C-variadic function, so the seeds' test runs
//! without one). Every call must succeed, leave NCCL a choice, and keep a chunk within NCCL's
//! buffer.
//!
//! Input: one byte of latency-text length L, L bytes of `LINKPILOT_NCCL_NET_LATENCY_US`, then
//! 33-byte records: a mode byte (bit 0: withdraw instead) and the 32 bytes of a decision.

use std::{
    ffi::{c_int, c_void},
    sync::Once,
};

use nccl_tuner_linkpilot::{
    abi::{Logger, TunerConstants, NUM_ALGORITHMS, NUM_PROTOCOLS},
    adopt::{linkpilot_tuner_adopt, Decision, ADOPTED, INVALID, WRONG_SIZE},
    ncclTunerPlugin_v6 as TUNER,
};

fn scratch() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" };
        let dir = std::path::PathBuf::from(base).join(format!("fz-tuner-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        // SAFETY: set before any communicator exists, from this one thread.
        unsafe { std::env::set_var("LINKPILOT_TUNER_STATS", dir) };
    });
}

/// Every collective at three sizes through getCollInfo and getChunkSize.
///
/// # Safety
/// `ctx` is a live communicator of the plugin.
unsafe fn calls(ctx: *mut c_void) {
    for coll in -1..=5 {
        for n_bytes in [1usize << 10, 1 << 20, 1 << 30] {
            let mut table = [1.0f32; NUM_ALGORITHMS * NUM_PROTOCOLS];
            table[1] = -1.0;
            let mut channels = 0;
            // SAFETY: a cost table of NUM_ALGORITHMS x NUM_PROTOCOLS floats (one block, cast to
            // float** as NCCL does) and a channel count.
            let rc = unsafe {
                (TUNER.get_coll_info)(
                    ctx,
                    coll,
                    n_bytes,
                    1,
                    table.as_mut_ptr().cast(),
                    NUM_ALGORITHMS as c_int,
                    NUM_PROTOCOLS as c_int,
                    0,
                    &mut channels,
                )
            };
            assert_eq!(rc, 0);
            assert!(table.iter().any(|&c| c >= 0.0), "no choice left to NCCL");
            assert!(table[1] == -1.0, "an entry NCCL ruled out was changed");
            for (algo, proto) in [(0, 2), (1, 2), (1, 0)] {
                let mut chunk = 1usize << 19;
                // SAFETY: as above, a chunk to read and change.
                let rc = unsafe {
                    (TUNER.get_chunk_size)(ctx, coll, n_bytes, algo, proto, 8, &mut chunk)
                };
                assert_eq!(rc, 0);
                assert!(chunk > 0 && chunk <= 1 << 19, "chunk {chunk}");
            }
        }
    }
}

pub fn check(data: &[u8], logger: Option<Logger>) {
    scratch();
    let Some((&n, rest)) = data.split_first() else { return };
    let n = usize::from(n).min(rest.len());
    let (latency, records) = rest.split_at(n);
    // SAFETY: set while no communicator exists, from this one thread.
    unsafe {
        match std::str::from_utf8(latency) {
            Ok(s) if !s.contains('\0') => std::env::set_var("LINKPILOT_NCCL_NET_LATENCY_US", s),
            _ => std::env::remove_var("LINKPILOT_NCCL_NET_LATENCY_US"),
        }
    }
    // SAFETY: the plugin's entry points, called as NCCL calls them: a context pointer, zeroed
    // constants but one NET latency, one finalize.
    unsafe {
        let mut ctx: *mut c_void = std::ptr::null_mut();
        let mut constants: TunerConstants = std::mem::zeroed();
        constants.hw_latencies[2][0][0] = 14.0;
        assert_eq!(
            (TUNER.init)(&mut ctx, 1, 16, 2, logger, std::ptr::null_mut(), &mut constants),
            0
        );
        assert!(!ctx.is_null());
        let net = constants.hw_latencies[2][0][0];
        assert!(net.is_finite() && net >= 14.0, "NET latency {net}");
        calls(ctx);
        for r in records.chunks_exact(33) {
            let rc = if r[0] & 1 == 1 {
                linkpilot_tuner_adopt(std::ptr::null())
            } else {
                let d: Decision = std::ptr::read_unaligned(r[1..].as_ptr().cast());
                linkpilot_tuner_adopt(&d)
            };
            assert!([ADOPTED, WRONG_SIZE, INVALID].contains(&rc), "rc {rc}");
            calls(ctx);
        }
        assert_eq!((TUNER.finalize)(ctx), 0);
    }
}
