//! ns per getCollInfo and getChunkSize call, through the exported v6 struct as NCCL calls it,
//! with nothing adopted (NCCL's own choices) and with a decision adopted through the gate.
//!
//!     cargo run --release -p linkpilot-nccl-tuner --example bench [-- CALLS]

use std::{ffi::c_void, hint::black_box, time::Instant};

use linkpilot_common::board::nccl;
use nccl_tuner_linkpilot::{
    adopt::{linkpilot_tuner_adopt, Decision},
    ncclTunerPlugin_v6 as V6,
};

const TABLE: [f32; 21] = [
    30., 25., 20., 5., 15., 10., -1., -1., -1., -1., -1., -1., -1., -1., -1., -1., -1., -1., -1.,
    -1., -1.,
];

/// Median ns per call of `f` over 5 rounds of `n` calls each.
fn ns_per_call(n: u64, mut f: impl FnMut()) -> f64 {
    let mut rounds: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                f();
            }
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[2]
}

fn main() {
    let calls: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(2_000_000);
    let dir = std::env::temp_dir().join(format!("lp-tuner-bench-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("stats")).unwrap();
    // Before any other thread exists.
    std::env::set_var("LINKPILOT_TUNER_STATS", dir.join("stats"));
    std::env::set_var("NCCL_BUFFSIZE", "8388608");
    let mut ctx: *mut c_void = std::ptr::null_mut();
    // SAFETY: the plugin's init as NCCL calls it (no logger, no constants).
    let rc =
        unsafe { (V6.init)(&mut ctx, 1, 16, 2, None, std::ptr::null_mut(), std::ptr::null_mut()) };
    assert_eq!(rc, 0);
    let ctx_addr = ctx as usize;
    let coll = move || {
        let mut table = black_box(TABLE);
        let mut n = 0;
        // SAFETY: a live context, a 7x3 table, a channel count.
        let rc = unsafe {
            (V6.get_coll_info)(
                ctx_addr as *mut c_void,
                4,
                64 << 20,
                1,
                table.as_mut_ptr().cast(),
                7,
                3,
                0,
                &mut n,
            )
        };
        black_box((rc, table, n));
    };
    let chunk = move || {
        let mut c = black_box(4usize << 20);
        // SAFETY: a live context and a chunk size.
        let rc =
            unsafe { (V6.get_chunk_size)(ctx_addr as *mut c_void, 4, 64 << 20, 1, 2, 8, &mut c) };
        black_box((rc, c));
    };
    let copy_only = || {
        black_box(black_box(TABLE));
    };
    println!("linkpilot NCCL tuner plugin, {calls} calls per round, median of 5 rounds");
    println!("  table copy alone              {:6.1} ns", ns_per_call(calls, copy_only));
    println!("  getCollInfo, none adopted     {:6.1} ns", ns_per_call(calls, coll));
    // What the training code adopts for a congested link: Tree/Simple, 4 channels, 2 MiB.
    let congested = Decision {
        size: std::mem::size_of::<Decision>() as u32,
        algo: nccl::ALGO_TREE,
        proto: nccl::PROTO_SIMPLE,
        max_channels: 4,
        state_index: 1,
        min_bytes: 1 << 20,
        chunk_bytes: 2 << 20,
        step: 1,
    };
    // SAFETY: a valid decision.
    assert_eq!(unsafe { linkpilot_tuner_adopt(&congested) }, 0);
    println!("  getCollInfo, adopted          {:6.1} ns", ns_per_call(calls, coll));
    println!("  getChunkSize, adopted         {:6.1} ns", ns_per_call(calls, chunk));
    // Two threads on one communicator (the counters' cache lines are shared).
    let both: Vec<f64> = std::thread::scope(|s| {
        let a = s.spawn(|| ns_per_call(calls, coll));
        let b = s.spawn(|| ns_per_call(calls, coll));
        vec![a.join().unwrap(), b.join().unwrap()]
    });
    println!("  getCollInfo, 2 threads        {:6.1} ns (each)", both.iter().sum::<f64>() / 2.0);
    // SAFETY: the context init made, finalized once.
    unsafe { (V6.finalize)(ctx) };
    let _ = std::fs::remove_dir_all(&dir);
}
