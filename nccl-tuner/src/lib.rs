//! linkpilot's NCCL tuner plugin (`libnccl-tuner-linkpilot.so`): while a job runs, NCCL's
//! algorithm and protocol choice, channel count and chunk size per collective follow the knob
//! board the daemon publishes, read lock-free on every call.
//!
//! One library exports tuner v6 (NCCL 2.30.3+, with getChunkSize), v5 (2.28+) and v4 (2.24+);
//! NCCL takes the newest it knows. Per communicator: init (which also gives NCCL's cost model the
//! link's measured latency), getCollInfo, getChunkSize, finalize. Every entry point returns
//! success once init ran, and init itself always succeeds: an unusable board, bad arguments or
//! a bug (a caught panic) mean NCCL's own choice for that call, never a failed collective.
//!
//! Environment, read when a communicator starts: `LINKPILOT_BOARD` (default
//! `/run/linkpilot/knobs`), `LINKPILOT_LINK` (the board link to follow; default or absent from
//! the board: the link in the worst state), `NCCL_BUFFSIZE` (what NCCL's chunks are made of),
//! `LINKPILOT_TUNER_STATS` (the counter directory, default `/run/linkpilot/tuner`).

use std::{
    ffi::{c_char, c_int, c_void, CString},
    panic::{catch_unwind, AssertUnwindSafe},
    sync::{atomic::Ordering, Mutex},
};

use linkpilot_common::{
    board::{nccl, BoardLink, BOARD_NAME_LEN},
    tuner::{board_state, choice, size_class},
};

pub mod abi;
mod board;
pub mod decide;
mod log;
mod stats;

use abi::{
    Finalize, GetChunkSize, GetCollInfo, InitV4, InitV5, Logger, NcclResult, NvlDomainInfo,
    TunerConstants, TunerV4, TunerV5, TunerV6, DEFAULT_BUFFSIZE, HW_NET, NUM_ALGORITHMS,
    NUM_PROTOCOLS, SUCCESS,
};
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
    /// The board link to follow, NUL-padded; all zero: the worst.
    link: [u8; BOARD_NAME_LEN],
    /// NCCL_BUFFSIZE as NCCL reads it.
    buffsize: u64,
    board_path: CString,
}

/// Live communicators of this process: the first sets up the board and counter file, the last
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

fn start(comm_id: u64, n_ranks: usize, n_nodes: usize, logger: Option<Logger>) -> Box<Comm> {
    let path = env("LINKPILOT_BOARD").unwrap_or_else(|| "/run/linkpilot/knobs".into());
    let mut link = [0u8; BOARD_NAME_LEN];
    if let Some(name) = env("LINKPILOT_LINK") {
        let n = name.len().min(BOARD_NAME_LEN - 1);
        link[..n].copy_from_slice(&name.as_bytes()[..n]);
    }
    let comm = Box::new(Comm {
        id: comm_id,
        logger,
        link,
        buffsize: buffsize(),
        board_path: CString::new(path).unwrap_or_default(),
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
    board::reopen(&comm.board_path, logger);
    say!(
        logger,
        "tuner for communicator {:#x} ({n_ranks} ranks, {n_nodes} nodes): board {}, link {}, \
         NCCL_BUFFSIZE {}",
        comm.id,
        comm.board_path.to_string_lossy(),
        if link[0] == 0 { "in the worst state" } else { board::text(&link) },
        Bytes(comm.buffsize)
    );
    comm
}

/// Adds half the link's RTT baseline to NCCL's network latency (every algorithm/protocol NCCL
/// has a network latency for), so its cost model knows the WAN before the first decision.
fn tell_latency(comm: &Comm, n_nodes: usize, constants: *mut TunerConstants) {
    // SAFETY: NCCL passes its communicator's constants, or null.
    let Some(c) = (unsafe { constants.as_mut() }) else { return };
    let link = match board::read(&comm.link, board::monotonic_ns()) {
        board::Read::Link(l) => l,
        _ => return say!(comm.logger, "no measured link latency: NCCL's latency model as is"),
    };
    if link.rtt_us == 0 || n_nodes < 2 {
        let why = if link.rtt_us == 0 { "no RTT measured yet" } else { "a single node" };
        return say!(comm.logger, "NCCL's network latency as is ({why})");
    }
    let one_way = f64::from(link.rtt_us) / 2.0;
    for lat in c.hw_latencies[HW_NET].iter_mut().flatten().filter(|l| **l > 0.0) {
        *lat += one_way;
    }
    say!(
        comm.logger,
        "NCCL network latency + {one_way:.0} us: half the RTT baseline of link {} (decision {})",
        board::text(&link.name),
        link.decision_id
    );
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
            board::teardown();
        }
        drop(comm);
    })
}

/// What a call follows.
enum Follow {
    Link(BoardLink),
    /// NCCL's own choice: no fresh board (or no link on it).
    Own,
    /// The daemon was writing through every try: NCCL's own choice for this call only,
    /// recorded nowhere (it says nothing about the board).
    Busy,
}

/// The board slot to follow now, after the once-per-change logging of the board's state.
fn follow(comm: &Comm) -> Follow {
    let now = board::monotonic_ns();
    let mut r = board::read(&comm.link, now);
    if matches!(r, board::Read::Unusable(_)) && board::reopen_due(now) {
        board::reopen(&comm.board_path, comm.logger);
        r = board::read(&comm.link, now);
    }
    let h = &stats::area().header;
    let state = match &r {
        board::Read::Link(_) | board::Read::NoLink => board_state::FRESH,
        board::Read::Unusable(s) => *s,
        board::Read::Busy => return Follow::Busy,
    };
    // Read first: a swap on every call would be a locked instruction on a shared line.
    if h.board.load(Ordering::Relaxed) != state && h.board.swap(state, Ordering::Relaxed) != state {
        match &r {
            board::Read::Link(l) => say!(
                comm.logger,
                "knob board {}: following link {} ({}, decision {})",
                comm.board_path.to_string_lossy(),
                board::text(&l.name),
                board::text(&l.state),
                l.decision_id
            ),
            board::Read::NoLink => say!(comm.logger, "knob board: no links; NCCL's own choices"),
            _ if state == board_state::STALE => say!(
                comm.logger,
                "knob board {}: stale (the daemon missed two heartbeats); NCCL's own choices \
                 until it beats again",
                comm.board_path.to_string_lossy()
            ),
            // Missing, foreign, unreadable: board::reopen logged why.
            _ => {}
        }
    }
    match r {
        board::Read::Link(l) => {
            if h.decision_id.load(Ordering::Relaxed) < l.decision_id {
                h.decision_id.fetch_max(l.decision_id, Ordering::Relaxed);
            }
            Follow::Link(l)
        }
        _ => Follow::Own,
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
    // SAFETY: `ctx` is null or what init stored, alive until finalize.
    let Some(comm) = (unsafe { ctx.cast::<Comm>().as_ref() }) else { return SUCCESS };
    guarded(comm.logger, || {
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
        let link = match follow(comm) {
            Follow::Link(l) => Some(l),
            Follow::Own => None,
            Follow::Busy => return,
        };
        let word = match &link {
            Some(l) => decide::coll_info(l, coll_type, n_bytes as u64, table, np, channels),
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
        let id = link.as_ref().map_or(0, |l| l.decision_id);
        // Once per change and decision (the first choice of an entry included).
        if old != word && (e.decision_id.swap(id, Ordering::Relaxed) != id || old == 0) {
            log_choice(comm, coll_type, n_bytes as u64, word, link.as_ref());
        }
    })
}

fn log_choice(comm: &Comm, coll: i32, n_bytes: u64, word: u32, link: Option<&BoardLink>) {
    let class = Class(coll, n_bytes);
    let Some(l) = link else {
        return say!(comm.logger, "{class}: NCCL's own choice (no fresh knob board)");
    };
    let (name, state, id) = (board::text(&l.name), board::text(&l.state), l.decision_id);
    let (a, p, ch) = (choice::algo(word), choice::proto(word), choice::channels(word));
    if word & choice::SMALL != 0 {
        return say!(
            comm.logger,
            "{class}: NCCL's own choice below {} (link {name} {state}, decision {id})",
            Bytes(l.nccl_min_bytes)
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
    say!(comm.logger, "{class}: {what}{channels} (link {name} {state}, decision {id})");
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
    // SAFETY: `ctx` is null or what init stored, alive until finalize.
    let Some(comm) = (unsafe { ctx.cast::<Comm>().as_ref() }) else { return SUCCESS };
    guarded(comm.logger, || {
        // SAFETY: NCCL passes its chunk size to read and change, or null.
        let Some(chunk) = (unsafe { chunk_size.as_mut() }) else { return };
        let area = stats::area();
        let link = match follow(comm) {
            Follow::Link(l) => Some(l),
            Follow::Own => {
                area.header.own_chunk_calls.fetch_add(1, Ordering::Relaxed);
                None
            }
            Follow::Busy => return,
        };
        let want = link.as_ref().and_then(|l| {
            decide::chunk(l, coll_type, n_bytes as u64, algo, proto, *chunk, comm.buffsize)
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
        let id = link.as_ref().map_or(0, |l| l.decision_id);
        if old != new && (e.chunk_decision_id.swap(id, Ordering::Relaxed) != id || old == 0) {
            let class = Class(coll_type, n_bytes as u64);
            let how = format!(
                "{}/{}",
                algo_name(u8::try_from(algo).unwrap_or(255)),
                proto_name(u8::try_from(proto).unwrap_or(255))
            );
            match (want, &link) {
                (Some(w), Some(l)) => say!(
                    comm.logger,
                    "{class} {how}: chunk {} (board chunk {}{}; link {} {}, decision {})",
                    Bytes(w as u64),
                    Bytes(l.chunk_bytes),
                    if l.chunk_bytes > comm.buffsize {
                        format!(" is above NCCL_BUFFSIZE {}: NCCL's largest", Bytes(comm.buffsize))
                    } else {
                        format!(", NCCL_BUFFSIZE {}", Bytes(comm.buffsize))
                    },
                    board::text(&l.name),
                    board::text(&l.state),
                    l.decision_id
                ),
                _ => say!(comm.logger, "{class} {how}: NCCL's own chunk size"),
            }
        }
    })
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
