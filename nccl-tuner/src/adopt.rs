//! The gate: the one way a live decision reaches NCCL's calls.
//!
//! NCCL asks every rank's plugin separately and never compares the answers, so a collective's
//! algorithm, protocol, channels and chunk agree across ranks only if every rank answers from
//! the same inputs. A knob board is per host and changes at any moment; the ranks' training
//! code, though, already agrees on what to do each step (the linkpilot DDP hook: every rank's
//! board proposal rides in the step's collectives, and every rank computes the same agreement
//! from them). So the training code calls [`linkpilot_tuner_adopt`] with the agreed decision at
//! the start of a step, before that step's first collective, on every rank; from then on every
//! call in this process answers from it. Until the first adoption (or after a withdrawal) the
//! plugin keeps NCCL's own choices.
//!
//! The decision is kept in a seqlock of a few words: one writer at a time (a mutex, at most
//! once a step), lock-free readers on NCCL's call path.

use std::{
    ffi::c_int,
    sync::{
        atomic::{fence, AtomicU64, Ordering},
        Mutex,
    },
};

use linkpilot_common::board::nccl;

use crate::decide::Rule;

/// The decision as C hands it over (`struct linkpilot_tuner_decision` in README's snippet and
/// the Python package's `tuner.py`): 32 bytes, `size` first so that a caller built against
/// another layout is refused rather than misread.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// `sizeof(struct linkpilot_tuner_decision)`: 32.
    pub size: u32,
    /// NCCL algorithm (TREE 0 .. PAT 6) or 255: NCCL's own.
    pub algo: u8,
    /// NCCL protocol (LL 0, LL128 1, SIMPLE 2) or 255: NCCL's own.
    pub proto: u8,
    /// At most this many channels for Ring and Tree; 0: NCCL's count.
    pub max_channels: u8,
    /// The link state's position in the policy's ladder, for logs and status.
    pub state_index: u8,
    /// Collectives of fewer bytes keep NCCL's own choices.
    pub min_bytes: u64,
    /// Bytes per pipelined chunk; 0: NCCL's own chunks.
    pub chunk_bytes: u64,
    /// The training step from which every rank adopts it (0 is a valid step).
    pub step: u64,
}

const _: () = assert!(std::mem::size_of::<Decision>() == 32);

/// `linkpilot_tuner_adopt`'s answers.
pub const ADOPTED: c_int = 0;
/// The struct's size is not this plugin's: nothing changed.
pub const WRONG_SIZE: c_int = -1;
/// A field out of range (an algorithm or protocol NCCL does not have): nothing changed.
pub const INVALID: c_int = -2;

/// The current decision: a sequence number (odd while written) and the words.
static SEQ: AtomicU64 = AtomicU64::new(0);
/// valid (bit 32) | state_index (24..31) | max_channels (16..23) | proto (8..15) | algo (0..7)
static HEAD: AtomicU64 = AtomicU64::new(0);
static MIN_BYTES: AtomicU64 = AtomicU64::new(0);
static CHUNK: AtomicU64 = AtomicU64::new(0);
static STEP: AtomicU64 = AtomicU64::new(0);
/// Adoptions and withdrawals so far; a communicator logs when it sees this move.
static GENERATION: AtomicU64 = AtomicU64::new(0);
static WRITER: Mutex<()> = Mutex::new(());
const VALID: u64 = 1 << 32;
/// Lock-free copies tried before a call waits for the writer's mutex (held for the few stores of
/// an adoption): only an adoption running on another thread at that instant, preempted, gets
/// there. A call never answers from anything but a whole decision.
const TRIES: u32 = 64;

/// What a call follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Current {
    /// The adopted decision: its rule, step and state index.
    Adopted { rule: Rule, step: u64, state_index: u8 },
    /// None adopted yet, or withdrawn: NCCL's own choices.
    Own { withdrawn: bool },
}

/// Adopts `d` (null: withdraws, NCCL's own choices from the next call on) for every
/// communicator of this process. The training code calls it on every rank with the same
/// decision, at a step boundary, before the step's first collective.
///
/// # Safety
/// `d` is null or points to a readable `struct linkpilot_tuner_decision` whose first field
/// holds its size.
#[no_mangle]
pub unsafe extern "C" fn linkpilot_tuner_adopt(d: *const Decision) -> c_int {
    // SAFETY: the caller's contract: null or a readable struct; its size is read first, the
    // rest only once the size says it is all there.
    let d = match unsafe { d.cast::<u32>().as_ref() } {
        None => None,
        Some(&size) if size as usize != std::mem::size_of::<Decision>() => return WRONG_SIZE,
        // SAFETY: as above; the size matched.
        Some(_) => Some(unsafe { *d }),
    };
    if let Some(d) = d {
        let algo_ok = usize::from(d.algo) < nccl::ALGOS.len() || d.algo == nccl::ANY;
        let proto_ok = usize::from(d.proto) < nccl::PROTOS.len() || d.proto == nccl::ANY;
        if !algo_ok || !proto_ok {
            return INVALID;
        }
    }
    store(d);
    ADOPTED
}

fn store(d: Option<Decision>) {
    let _one = WRITER.lock().unwrap_or_else(|e| e.into_inner());
    let s = SEQ.load(Ordering::Relaxed);
    SEQ.store(s + 1, Ordering::Relaxed);
    fence(Ordering::Release);
    match d {
        Some(d) => {
            let head = VALID
                | u64::from(d.state_index) << 24
                | u64::from(d.max_channels) << 16
                | u64::from(d.proto) << 8
                | u64::from(d.algo);
            HEAD.store(head, Ordering::Relaxed);
            MIN_BYTES.store(d.min_bytes, Ordering::Relaxed);
            CHUNK.store(d.chunk_bytes, Ordering::Relaxed);
            STEP.store(d.step, Ordering::Relaxed);
        }
        None => HEAD.store(0, Ordering::Relaxed),
    }
    SEQ.store(s + 2, Ordering::Release);
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// The decision a call follows now.
pub fn current() -> Current {
    if let Some(c) = copy() {
        return c;
    }
    let _writer_done = WRITER.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if let Some(c) = copy() {
            return c;
        }
    }
}

/// One seqlock copy, in at most [`TRIES`] tries.
fn copy() -> Option<Current> {
    for _ in 0..TRIES {
        let s1 = SEQ.load(Ordering::Acquire);
        if s1 & 1 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let head = HEAD.load(Ordering::Relaxed);
        let (min_bytes, chunk, step) = (
            MIN_BYTES.load(Ordering::Relaxed),
            CHUNK.load(Ordering::Relaxed),
            STEP.load(Ordering::Relaxed),
        );
        fence(Ordering::Acquire);
        if SEQ.load(Ordering::Relaxed) != s1 {
            continue;
        }
        if head & VALID == 0 {
            return Some(Current::Own { withdrawn: s1 > 0 });
        }
        let rule = Rule {
            min_bytes,
            algo: head as u8,
            proto: (head >> 8) as u8,
            max_channels: (head >> 16) as u8,
            chunk_bytes: chunk,
        };
        return Some(Current::Adopted { rule, step, state_index: (head >> 24) as u8 });
    }
    None
}

/// Adoptions and withdrawals so far.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(algo: u8, step: u64) -> Decision {
        Decision {
            size: 32,
            algo,
            proto: nccl::PROTO_SIMPLE,
            max_channels: 4,
            state_index: 1,
            min_bytes: 1 << 20,
            chunk_bytes: 2 << 20,
            step,
        }
    }

    // One test: the gate is process-wide state.
    #[test]
    fn adopt_withdraw_and_refuse() {
        assert_eq!(current(), Current::Own { withdrawn: false });
        let g = generation();
        // SAFETY: a valid decision, then null.
        assert_eq!(unsafe { linkpilot_tuner_adopt(&decision(nccl::ALGO_TREE, 7)) }, ADOPTED);
        let want = Rule {
            min_bytes: 1 << 20,
            algo: nccl::ALGO_TREE,
            proto: nccl::PROTO_SIMPLE,
            max_channels: 4,
            chunk_bytes: 2 << 20,
        };
        assert_eq!(current(), Current::Adopted { rule: want, step: 7, state_index: 1 });
        assert_eq!(generation(), g + 1);
        // Refused: nothing changes.
        let mut wrong = decision(nccl::ALGO_RING, 8);
        wrong.size = 40;
        // SAFETY: a readable struct (its size field lies, which is what is tested).
        assert_eq!(unsafe { linkpilot_tuner_adopt(&wrong) }, WRONG_SIZE);
        // SAFETY: as above.
        assert_eq!(unsafe { linkpilot_tuner_adopt(&decision(9, 8)) }, INVALID);
        assert_eq!(current(), Current::Adopted { rule: want, step: 7, state_index: 1 });
        // SAFETY: null withdraws.
        assert_eq!(unsafe { linkpilot_tuner_adopt(std::ptr::null()) }, ADOPTED);
        assert_eq!(current(), Current::Own { withdrawn: true });
        // Any algorithm/protocol: NCCL's own, still an adopted rule (channels, chunk).
        // SAFETY: a valid decision.
        assert_eq!(unsafe { linkpilot_tuner_adopt(&decision(nccl::ANY, 9)) }, ADOPTED);
        assert!(matches!(current(), Current::Adopted { step: 9, .. }));
    }
}
