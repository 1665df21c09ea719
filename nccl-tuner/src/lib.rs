//! linkpilot's NCCL tuner plugin (`libnccl-tuner-linkpilot.so`): while a job runs, NCCL's
//! algorithm and protocol choice, channel count and chunk size per collective follow the
//! decision the job's ranks adopted together, the same on every rank.
//!
//! One library exports tuner v6 (NCCL 2.30.3+, with getChunkSize), v5 (2.28+) and v4 (2.24+);
//! NCCL takes the newest it knows. Per communicator: init, getCollInfo, getChunkSize, finalize.
//! Every entry point returns success once init ran, and init itself always succeeds: bad
//! arguments or a bug (a caught panic) mean NCCL's own choice for that call, never a failed
//! collective.
//!
//! NCCL asks every rank separately and never compares the answers, so nothing per host may
//! decide them: no knob board is read here. The decision comes through the gate
//! ([`adopt::linkpilot_tuner_adopt`]), which the linkpilot training code calls on every rank at
//! the same step boundary with the decision its ranks agreed on; until then, and after a
//! withdrawal, NCCL makes its own choices (ARCHITECTURE.md, "The same answer on every rank").
//!
//! Environment, read when a communicator starts: `NCCL_BUFFSIZE` (what NCCL's chunks are made
//! of), `LINKPILOT_TUNER_STATS` (the counter directory, default `/run/linkpilot/tuner`), and
//! `LINKPILOT_NCCL_NET_LATENCY_US` (microseconds added to NCCL's network latency; set for the
//! whole job, the same on every rank: never from a host's own measurement).

use std::{
    ffi::{c_char, c_int, c_void},
    panic::{catch_unwind, AssertUnwindSafe},
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    },
};

use linkpilot_common::{
    board::nccl,
    tuner::{adoption, choice, size_class},
};

pub mod abi;
pub mod adopt;
pub mod decide;
mod log;
mod stats;

use abi::{
    Finalize, GetChunkSize, GetCollInfo, InitV4, InitV5, Logger, NcclResult, NvlDomainInfo,
    TunerConstants, TunerV4, TunerV5, TunerV6, DEFAULT_BUFFSIZE, HW_NET, NUM_ALGORITHMS,
    NUM_PROTOCOLS, SUCCESS,
};
use adopt::Current;
use decide::Rule;
use log::{say, Bytes};

/// The name NCCL logs ("TUNER/Plugin: Using linkpilot (v6)").
const NAME: *const c_char = c"linkpilot".as_ptr();

#[no_mangle]
pub static ncclTunerPlugin_v6: TunerV6 = TunerV6 {
    name: NAME,
    init: init_v5 as InitV5,
    get_coll_info: get_coll_info as GetCollInfo,
    finalize: finalize as Finalize,
    get_chunk_size: get_chunk_size as GetChunkSize,
};

#[no_mangle]
pub static ncclTunerPlugin_v5: TunerV5 = TunerV5 {
    name: NAME,
    init: init_v5 as InitV5,
    get_coll_info: get_coll_info as GetCollInfo,
    finalize: finalize as Finalize,
};

#[no_mangle]
pub static ncclTunerPlugin_v4: TunerV4 = TunerV4 {
    name: NAME,
    init: init_v4 as InitV4,
    get_coll_info: get_coll_info as GetCollInfo,
    destroy: finalize as Finalize,
};

/// One communicator's context (what NCCL calls `ctx`).
struct Comm {
    id: u64,
    logger: Option<Logger>,
    /// NCCL_BUFFSIZE as NCCL reads it.
    buffsize: u64,
    /// The gate's generation this communicator last logged.
    seen: AtomicU64,
}

/// Live communicators of this process: the first sets up the counter file, the last
/// tears them down (NCCL unloads the library after it).
static COMMS: Mutex<u32> = Mutex::new(0);

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// An integer as NCCL's parameter parser reads it (strtoll, base 0: decimal, 0x hex, 0 octal).
fn parse_c_int(s: &str) -> Option<i64> {
    let s = s.trim();
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        i64::from_str_radix(h, 16).ok()
    } else if s.len() > 1 && s.starts_with('0') {
        i64::from_str_radix(&s[1..], 8).ok()
    } else {
        s.parse().ok()
    }
}

fn buffsize() -> u64 {
    env("NCCL_BUFFSIZE")
        .and_then(|v| parse_c_int(&v))
        .and_then(|v| u64::try_from(v).ok())
        .filter(|&v| v > 0)
        .unwrap_or(DEFAULT_BUFFSIZE)
}

/// Most microseconds `LINKPILOT_NCCL_NET_LATENCY_US` may add (10 s: beyond any path).
const MAX_NET_LATENCY_US: f64 = 1e7;

fn start(comm_id: u64, n_ranks: usize, n_nodes: usize, logger: Option<Logger>) -> Box<Comm> {
    let comm = Box::new(Comm {
        id: comm_id,
        logger,
        buffsize: buffsize(),
        seen: AtomicU64::new(adopt::generation()),
    });
    let mut comms = COMMS.lock().unwrap_or_else(|e| e.into_inner());
    if *comms == 0 {
        let dir = env("LINKPILOT_TUNER_STATS").unwrap_or_else(|| stats::DEFAULT_DIR.into());
        stats::open(&dir, logger);
    }
    *comms += 1;
    drop(comms);
    let area = stats::area();
    area.header.communicators.fetch_add(1, Ordering::Relaxed);
    area.header
        .buffsize_kib
        .store((comm.buffsize >> 10).min(u32::MAX.into()) as u32, Ordering::Relaxed);
    let now = match adopt::current() {
        Current::Adopted { step, .. } => format!("follows the decision adopted at step {step}"),
        _ => "NCCL's own choices until the training code adopts a decision (the linkpilot hook \
              does at every step; a host's own knob board is never followed: ranks would \
              disagree)"
            .to_owned(),
    };
    say!(
        logger,
        "tuner for communicator {:#x} ({n_ranks} ranks, {n_nodes} nodes), NCCL_BUFFSIZE {}: {now}",
        comm.id,
        Bytes(comm.buffsize)
    );
    comm
}

/// Adds `LINKPILOT_NCCL_NET_LATENCY_US` to NCCL's network latency (every algorithm/protocol NCCL
/// has a network latency for), so its cost model knows the WAN: a value the job sets for every
/// rank alike. Without it NCCL's constants are left as they are.
fn tell_latency(comm: &Comm, n_nodes: usize, constants: *mut TunerConstants) {
    // SAFETY: NCCL passes its communicator's constants, or null.
    let Some(c) = (unsafe { constants.as_mut() }) else { return };
    let Some(raw) = env("LINKPILOT_NCCL_NET_LATENCY_US") else { return };
    let us = match raw.trim().parse::<f64>() {
        Ok(v) if (0.0..=MAX_NET_LATENCY_US).contains(&v) => v,
        _ => {
            return say!(
                comm.logger,
                "LINKPILOT_NCCL_NET_LATENCY_US={raw:?} is not a number of microseconds from 0 to \
                 {MAX_NET_LATENCY_US}: NCCL's network latency left as it is"
            )
        }
    };
    if n_nodes < 2 {
        return say!(comm.logger, "NCCL's network latency as is (a single node)");
    }
    for lat in c.hw_latencies[HW_NET].iter_mut().flatten().filter(|l| **l > 0.0) {
        *lat += us;
    }
    say!(comm.logger, "NCCL network latency + {us:.0} us (LINKPILOT_NCCL_NET_LATENCY_US)");
}

/// Runs `f`, [`guarded`], on the communicator `ctx` names; nothing for a null `ctx`.
///
/// # Safety
/// `ctx` is null or what init stored, alive until finalize.
unsafe fn on_comm(ctx: *mut c_void, f: impl FnOnce(&Comm)) -> NcclResult {
    // SAFETY: as the caller promises.
    let Some(comm) = (unsafe { ctx.cast::<Comm>().as_ref() }) else { return SUCCESS };
    guarded(comm.logger, || f(comm))
}

/// Runs `f`, turning a panic into "NCCL's own choice" (logged) instead of an abort.
fn guarded(logger: Option<Logger>, f: impl FnOnce()) -> NcclResult {
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        say!(logger, "internal error (a bug): this call keeps NCCL's own choice");
    }
    SUCCESS
}

unsafe extern "C" fn init_v5(
    ctx: *mut *mut c_void,
    comm_id: u64,
    n_ranks: usize,
    n_nodes: usize,
    logger: Option<Logger>,
    _nvl_domain_info: *mut NvlDomainInfo,
    constants: *mut TunerConstants,
) -> NcclResult {
    guarded(logger, || {
        if ctx.is_null() {
            return;
        }
        // SAFETY: NCCL passes where to store the context; null until the comm is set up.
        unsafe { *ctx = std::ptr::null_mut() };
        let comm = start(comm_id, n_ranks, n_nodes, logger);
        tell_latency(&comm, n_nodes, constants);
        // SAFETY: as above.
        unsafe { *ctx = Box::into_raw(comm).cast() };
    })
}

unsafe extern "C" fn init_v4(
    n_ranks: usize,
    n_nodes: usize,
    logger: Option<Logger>,
    ctx: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: the same contract without the constants.
    unsafe { init_v5(ctx, 0, n_ranks, n_nodes, logger, std::ptr::null_mut(), std::ptr::null_mut()) }
}

unsafe extern "C" fn finalize(ctx: *mut c_void) -> NcclResult {
    if ctx.is_null() {
        return SUCCESS;
    }
    // SAFETY: `ctx` is what init stored: a boxed Comm, finalized once.
    let comm = unsafe { Box::from_raw(ctx.cast::<Comm>()) };
    let logger = comm.logger;
    guarded(logger, move || {
        stats::area().header.communicators.fetch_sub(1, Ordering::Relaxed);
        let mut comms = COMMS.lock().unwrap_or_else(|e| e.into_inner());
        *comms = comms.saturating_sub(1);
        if *comms == 0 {
            stats::teardown();
        }
        drop(comm);
    })
}

/// The rule a call follows (`None`: NCCL's own choice), after logging, once per communicator, a
/// change the gate made.
fn follow(comm: &Comm) -> Option<(Rule, u64)> {
    let now = adopt::current();
    let g = adopt::generation();
    if comm.seen.load(Ordering::Relaxed) != g && comm.seen.swap(g, Ordering::Relaxed) != g {
        match now {
            Current::Adopted { rule, step, state_index } => say!(
                comm.logger,
                "adopted at step {step} (link state {state_index}): {} from {}{}{}",
                match (rule.algo, rule.proto) {
                    (nccl::ANY, nccl::ANY) => "NCCL's algorithm and protocol".to_owned(),
                    (a, p) => format!("{}/{}", algo_name(a), proto_name(p)),
                },
                Bytes(rule.min_bytes),
                if rule.max_channels > 0 {
                    format!(", at most {} channels", rule.max_channels)
                } else {
                    String::new()
                },
                if rule.chunk_bytes > 0 {
                    format!(", chunks as if NCCL_BUFFSIZE were {}", Bytes(rule.chunk_bytes))
                } else {
                    String::new()
                }
            ),
            Current::Own { .. } => say!(
                comm.logger,
                "decision withdrawn (the ranks' knob boards were not all fresh): NCCL's own \
                 choices"
            ),
        }
    }
    let h = &stats::area().header;
    let (state, step) = match now {
        Current::Adopted { step, .. } => (adoption::ADOPTED, step),
        Current::Own { withdrawn: true } => (adoption::WITHDRAWN, 0),
        Current::Own { withdrawn: false } => (adoption::NONE_YET, 0),
    };
    // Read first: a store on every call would be a write to a shared line.
    if h.adoption.load(Ordering::Relaxed) != state {
        h.adoption.store(state, Ordering::Relaxed);
    }
    if h.adopted_step.load(Ordering::Relaxed) != step {
        h.adopted_step.store(step, Ordering::Relaxed);
    }
    if h.adoptions.load(Ordering::Relaxed) != g {
        h.adoptions.store(g, Ordering::Relaxed);
    }
    match now {
        Current::Adopted { rule, step, .. } => Some((rule, step)),
        Current::Own { .. } => None,
    }
}

fn algo_name(a: u8) -> &'static str {
    nccl::ALGOS.get(usize::from(a)).copied().unwrap_or("?")
}

fn proto_name(p: u8) -> &'static str {
    nccl::PROTOS.get(usize::from(p)).copied().unwrap_or("?")
}

/// "allreduce 8MiB-16MiB": a collective and its size class, for messages.
struct Class(i32, u64);

impl std::fmt::Display for Class {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = usize::try_from(self.0)
            .ok()
            .filter(|&c| c < linkpilot_common::tuner::COLL_OTHER)
            .map_or("collective", |c| linkpilot_common::tuner::COLLS[c]);
        let c = size_class(self.1) as u32;
        if c as usize == linkpilot_common::tuner::SIZE_CLASSES - 1 {
            return write!(f, "{name} {} and more", Bytes(1 << c));
        }
        // Powers of two: from the first bound up to, not including, the second.
        write!(f, "{name} {}-{}", Bytes(1 << c), Bytes(1 << (c + 1)))
    }
}

unsafe extern "C" fn get_coll_info(
    ctx: *mut c_void,
    coll_type: c_int,
    n_bytes: usize,
    _num_pipe_ops: c_int,
    cost_table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    _reg_buff: c_int,
    n_channels: *mut c_int,
) -> NcclResult {
    let call = |comm: &Comm| {
        let (Ok(na), Ok(np)) = (usize::try_from(num_algo), usize::try_from(num_proto)) else {
            return;
        };
        // NCCL 2.30 passes 7 x 3; a later NCCL with more algorithms or protocols keeps its
        // numbering for the known ones. Anything implausible is left alone.
        if cost_table.is_null()
            || na == 0
            || na > 4 * NUM_ALGORITHMS
            || np == 0
            || np > 4 * NUM_PROTOCOLS
        {
            return;
        }
        // SAFETY: NCCL's table is one float[num_algo][num_proto] block behind the float**
        // (its 2-D array cast), valid for this call.
        let table = unsafe { std::slice::from_raw_parts_mut(cost_table.cast::<f32>(), na * np) };
        // SAFETY: NCCL passes its channel count (0: its own) or null.
        let channels = unsafe { n_channels.as_mut() };
        let area = stats::area();
        let adopted = follow(comm);
        let word = match &adopted {
            Some((rule, _)) => {
                decide::coll_info(rule, coll_type, n_bytes as u64, table, np, channels)
            }
            None => {
                area.header.own_calls.fetch_add(1, Ordering::Relaxed);
                choice::pack(nccl::ANY, nccl::ANY, 0, choice::SEEN)
            }
        };
        let e = area.entry(coll_type, n_bytes as u64);
        e.calls.fetch_add(1, Ordering::Relaxed);
        let mut old = e.choice.load(Ordering::Relaxed);
        if old != word {
            old = e.choice.swap(word, Ordering::Relaxed);
        }
        let step = adopted.as_ref().map_or(0, |a| a.1);
        // Once per change and adoption (the first choice of an entry included).
        if old != word && (e.step.swap(step, Ordering::Relaxed) != step || old == 0) {
            log_choice(comm, coll_type, n_bytes as u64, word, adopted.as_ref());
        }
    };
    // SAFETY: `ctx` is null or what init stored, alive until finalize.
    unsafe { on_comm(ctx, call) }
}

fn log_choice(comm: &Comm, coll: i32, n_bytes: u64, word: u32, adopted: Option<&(Rule, u64)>) {
    let class = Class(coll, n_bytes);
    let Some((rule, step)) = adopted else {
        return say!(comm.logger, "{class}: NCCL's own choice (no decision adopted)");
    };
    let (a, p, ch) = (choice::algo(word), choice::proto(word), choice::channels(word));
    if word & choice::SMALL != 0 {
        return say!(
            comm.logger,
            "{class}: NCCL's own choice below {} (adopted at step {step})",
            Bytes(rule.min_bytes)
        );
    }
    let what = match (a, p) {
        (nccl::ANY, nccl::ANY) if word & choice::NOT_ALLOWED != 0 => {
            "preference not allowed by NCCL here: NCCL's own algorithm and protocol".to_owned()
        }
        (nccl::ANY, nccl::ANY) => "NCCL's own algorithm and protocol".to_owned(),
        _ => format!("{}/{}", algo_name(a), proto_name(p)),
    };
    let channels = if ch > 0 { format!(", at most {ch} channels") } else { String::new() };
    say!(comm.logger, "{class}: {what}{channels} (adopted at step {step})");
}

unsafe extern "C" fn get_chunk_size(
    ctx: *mut c_void,
    coll_type: c_int,
    n_bytes: usize,
    algo: c_int,
    proto: c_int,
    _n_channels: c_int,
    chunk_size: *mut usize,
) -> NcclResult {
    let call = |comm: &Comm| {
        // SAFETY: NCCL passes its chunk size to read and change, or null.
        let Some(chunk) = (unsafe { chunk_size.as_mut() }) else { return };
        let area = stats::area();
        let adopted = follow(comm);
        if adopted.is_none() {
            area.header.own_chunk_calls.fetch_add(1, Ordering::Relaxed);
        }
        let want = adopted.as_ref().and_then(|(rule, _)| {
            decide::chunk(rule, coll_type, n_bytes as u64, algo, proto, *chunk, comm.buffsize)
        });
        if let Some(w) = want {
            *chunk = w;
        }
        let e = area.entry(coll_type, n_bytes as u64);
        e.chunk_calls.fetch_add(1, Ordering::Relaxed);
        let new = want.unwrap_or(0) as u64;
        let mut old = e.chunk.load(Ordering::Relaxed);
        if old != new {
            old = e.chunk.swap(new, Ordering::Relaxed);
        }
        let step = adopted.as_ref().map_or(0, |a| a.1);
        if old != new && (e.chunk_step.swap(step, Ordering::Relaxed) != step || old == 0) {
            let class = Class(coll_type, n_bytes as u64);
            let how = format!(
                "{}/{}",
                algo_name(u8::try_from(algo).unwrap_or(255)),
                proto_name(u8::try_from(proto).unwrap_or(255))
            );
            match (want, &adopted) {
                (Some(w), Some((rule, step))) => say!(
                    comm.logger,
                    "{class} {how}: chunk {} (decided chunk {}{}; adopted at step {step})",
                    Bytes(w as u64),
                    Bytes(rule.chunk_bytes),
                    if rule.chunk_bytes > comm.buffsize {
                        format!(" is above NCCL_BUFFSIZE {}: NCCL's largest", Bytes(comm.buffsize))
                    } else {
                        format!(", NCCL_BUFFSIZE {}", Bytes(comm.buffsize))
                    },
                ),
                _ => say!(comm.logger, "{class} {how}: NCCL's own chunk size"),
            }
        }
    };
    // SAFETY: `ctx` is null or what init stored, alive until finalize.
    unsafe { on_comm(ctx, call) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccls_integer_spellings() {
        for (s, v) in [("8388608", 8388608), ("0x800000", 8388608), ("040", 32), ("0", 0)] {
            assert_eq!(parse_c_int(s), Some(v), "{s}");
        }
        assert_eq!(parse_c_int("8MiB"), None);
    }

    #[test]
    fn size_classes_read_as_ranges() {
        assert_eq!(Class(4, 5 << 20).to_string(), "allreduce 4MiB-8MiB");
        assert_eq!(Class(9, 0).to_string(), "collective 1B-2B");
        assert_eq!(Class(2, u64::MAX).to_string(), "allgather 512GiB and more");
    }
}
