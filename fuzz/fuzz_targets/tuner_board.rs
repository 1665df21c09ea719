//! The knob board as the NCCL tuner plugin reads it inside training processes: the bytes are
//! written as the board file, and a communicator goes through the plugin's exported v6 table
//! (init, getCollInfo for every collective at three sizes, getChunkSize, finalize), with a
//! logger that checks every message is one NUL-terminated line. The first input byte makes the
//! board fresh (heartbeat now, sequence even), names a link to follow, or pads it to size.
#![no_main]
#![feature(c_variadic)]

use std::{
    ffi::{c_char, c_int, c_ulong, c_void, CStr},
    path::PathBuf,
    sync::OnceLock,
};

use libfuzzer_sys::fuzz_target;
use linkpilot_common::board::{offsets, Board};
use nccl_tuner_linkpilot::{
    abi::{TunerConstants, NUM_ALGORITHMS, NUM_PROTOCOLS},
    ncclTunerPlugin_v6 as TUNER,
};

/// NCCL's logger: printf-like, called with "%s" and one string.
unsafe extern "C" fn logger(
    _level: c_int,
    _flags: c_ulong,
    _file: *const c_char,
    _line: c_int,
    fmt: *const c_char,
    mut args: ...
) {
    // SAFETY: the plugin passes a NUL-terminated format and, for "%s", one string.
    unsafe {
        assert_eq!(CStr::from_ptr(fmt).to_bytes(), b"%s");
        let line = CStr::from_ptr(args.next_arg::<*const c_char>()).to_bytes();
        assert!(line.len() < 512 && !line.contains(&b'\n'), "{line:?}");
    }
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The board path, in a directory of this process (with the counter files).
fn board_path() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" };
        let dir = PathBuf::from(base).join(format!("fz-tuner-board-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("stats")).expect("a scratch directory");
        // SAFETY: set before any communicator exists, from this one thread.
        unsafe {
            std::env::set_var("LINKPILOT_BOARD", dir.join("knobs"));
            std::env::set_var("LINKPILOT_TUNER_STATS", dir.join("stats"));
        }
        dir.join("knobs")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let path = board_path();
    let mut bytes = rest.to_vec();
    if mode & 8 != 0 && bytes.len() < size_of::<Board>() {
        bytes.resize(size_of::<Board>(), 0);
    }
    if mode & 1 != 0 && bytes.len() >= offsets::HEARTBEAT_NS + 8 {
        let at = offsets::HEARTBEAT_NS;
        bytes[at..at + 8].copy_from_slice(&now_ns().to_ne_bytes());
        bytes[offsets::SEQ] &= !1;
    }
    std::fs::write(path, &bytes).expect("writing the board");
    // SAFETY: set while no communicator exists, from this one thread.
    unsafe {
        match mode & 6 {
            2 => std::env::set_var("LINKPILOT_LINK", "wan"),
            4 => std::env::set_var("LINKPILOT_LINK", "a-link-name-longer-than-a-board-slot-holds"),
            _ => std::env::remove_var("LINKPILOT_LINK"),
        }
    }
    // SAFETY: the plugin's entry points, called as NCCL calls them: a context pointer, zeroed
    // constants, cost tables of NUM_ALGORITHMS x NUM_PROTOCOLS floats (one block, cast
    // to float** as NCCL does), one finalize.
    unsafe {
        let mut ctx: *mut c_void = std::ptr::null_mut();
        let mut constants: TunerConstants = std::mem::zeroed();
        constants.hw_latencies[2][0][0] = 14.0;
        (TUNER.init)(&mut ctx, 1, 16, 2, Some(logger), std::ptr::null_mut(), &mut constants);
        assert!(!ctx.is_null());
        for coll in -1..=5 {
            for n_bytes in [1usize << 10, 1 << 20, 1 << 30] {
                let mut table = [1.0f32; NUM_ALGORITHMS * NUM_PROTOCOLS];
                table[1] = -1.0;
                let mut channels = 0;
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
                );
                assert!(table.iter().any(|&c| c >= 0.0), "no choice left to NCCL");
                for (algo, proto) in [(0, 2), (1, 2), (1, 0)] {
                    let mut chunk = 1usize << 19;
                    (TUNER.get_chunk_size)(ctx, coll, n_bytes, algo, proto, 8, &mut chunk);
                    assert!(chunk > 0 && chunk <= 1 << 19, "chunk {chunk}");
                }
            }
        }
        (TUNER.finalize)(ctx);
    }
});
