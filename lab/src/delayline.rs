//! The delay line: one thread per direction reads packets from its TUN device, applies the link
//! model of the scenario's current phase, holds them until their delivery time and writes them
//! back, which injects them into the router namespace as if received from the far site.

use std::{
    collections::VecDeque,
    fs::File,
    io::{ErrorKind, Read, Write},
    os::fd::AsFd,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
        Arc,
    },
    thread::JoinHandle,
    time::Instant,
};

use hdrhistogram::Histogram;
use nix::{
    poll::{ppoll, PollFd, PollFlags},
    sys::time::TimeSpec,
};
use rand::{rngs::SmallRng, SeedableRng};
use serde::Serialize;

use crate::{
    ip,
    model::{DropCause, EcnCodepoint, Link, Params, Verdict},
    scenario::{Direction, Scenario},
    units::Nanos,
};

/// Ground truth of one direction, updated by its thread, read by anyone.
#[derive(Debug, Default)]
pub struct DirectionStats {
    pub packets_in: AtomicU64,
    pub bytes_in: AtomicU64,
    pub packets_out: AtomicU64,
    pub bytes_out: AtomicU64,
    pub drops_outage: AtomicU64,
    pub drops_loss: AtomicU64,
    pub drops_queue: AtomicU64,
    pub drops_aqm: AtomicU64,
    pub drops_write: AtomicU64,
    pub ce_marked: AtomicU64,
    /// Bytes waiting at the bottleneck, at the last packet.
    pub queue_bytes: AtomicU64,
    /// Queueing delay seen by the last packet, nanoseconds.
    pub queue_delay_ns: AtomicU64,
    /// Packets held by the delay line (queued or propagating).
    pub in_flight: AtomicU64,
    /// Index of the current scenario phase.
    pub phase: AtomicU64,
}

/// A plain copy of [`DirectionStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StatsSnapshot {
    pub packets_in: u64,
    pub bytes_in: u64,
    pub packets_out: u64,
    pub bytes_out: u64,
    pub drops_outage: u64,
    pub drops_loss: u64,
    pub drops_queue: u64,
    pub drops_aqm: u64,
    pub drops_write: u64,
    pub ce_marked: u64,
    pub queue_bytes: u64,
    pub queue_delay_ns: u64,
    pub in_flight: u64,
    pub phase: u64,
}

impl DirectionStats {
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            packets_in: self.packets_in.load(Relaxed),
            bytes_in: self.bytes_in.load(Relaxed),
            packets_out: self.packets_out.load(Relaxed),
            bytes_out: self.bytes_out.load(Relaxed),
            drops_outage: self.drops_outage.load(Relaxed),
            drops_loss: self.drops_loss.load(Relaxed),
            drops_queue: self.drops_queue.load(Relaxed),
            drops_aqm: self.drops_aqm.load(Relaxed),
            drops_write: self.drops_write.load(Relaxed),
            ce_marked: self.ce_marked.load(Relaxed),
            queue_bytes: self.queue_bytes.load(Relaxed),
            queue_delay_ns: self.queue_delay_ns.load(Relaxed),
            in_flight: self.in_flight.load(Relaxed),
            phase: self.phase.load(Relaxed),
        }
    }
}

/// What a direction's thread returns when stopped.
#[derive(Debug)]
pub struct Report {
    /// Actual write time minus scheduled delivery time, nanoseconds.
    pub sched_error: Histogram<u64>,
}

/// Upper bound on bytes held per direction, whatever the scenario says, so a misconfigured
/// scenario cannot exhaust memory (256 MiB is over 2 s at 1 Gbit/s).
const MAX_HELD_BYTES: u64 = 256 << 20;
/// Packets read per wake-up before delivering again, so reading cannot starve delivery.
const READ_BATCH: usize = 64;
/// Longest sleep, so phase changes and the stop flag are seen promptly.
const MAX_SLEEP_NS: u64 = 20_000_000;

struct Held {
    at: u64,
    data: Vec<u8>,
}

/// Starts the thread of `dir`. `origin` is time zero of the scenario.
pub fn spawn(
    dir: Direction,
    tun: File,
    scenario: Arc<Scenario>,
    origin: Instant,
    stats: Arc<DirectionStats>,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> std::io::Result<JoinHandle<Report>> {
    std::thread::Builder::new()
        .name(format!("delay-{}", dir.name()))
        .spawn(move || run(dir, tun, &scenario, origin, &stats, &stop, seed))
}

fn run(
    dir: Direction,
    mut tun: File,
    scenario: &Scenario,
    origin: Instant,
    stats: &DirectionStats,
    stop: &AtomicBool,
    seed: u64,
) -> Report {
    // Timer slack defaults to 50 us; delivery times want better.
    // SAFETY: prctl(PR_SET_TIMERSLACK) takes an integer and touches no memory.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    // A real-time priority keeps the traffic generators sharing this machine from delaying
    // deliveries. The thread blocks in ppoll between packets, and the kernel's RT throttling
    // bounds it anyway; without the privilege it stays a normal thread.
    let param = libc::sched_param { sched_priority: 10 };
    // SAFETY: sched_setscheduler reads one sched_param for the calling thread (pid 0).
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        tracing::debug!("delay line runs without real-time priority");
    }
    let mut sched_error =
        Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds");
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut link = Link::new();
    let mut held: VecDeque<Held> = VecDeque::new();
    let mut held_bytes = 0u64;
    let mut buf = vec![0u8; 65_536];
    let now_ns = || origin.elapsed().as_nanos() as u64;

    while !stop.load(Relaxed) {
        // Deliver what is due.
        let now = now_ns();
        while held.front().is_some_and(|h| h.at <= now) {
            let h = held.pop_front().expect("front exists");
            held_bytes -= h.data.len() as u64;
            // The error is taken as the packet is handed to the kernel, before the write runs
            // the receiving side's stack on this thread.
            let _ = sched_error.record(now_ns().saturating_sub(h.at).max(1));
            // A TUN write takes the whole packet or fails: there are no partial writes.
            match tun.write(&h.data) {
                Ok(n) if n == h.data.len() => {
                    stats.packets_out.fetch_add(1, Relaxed);
                    stats.bytes_out.fetch_add(n as u64, Relaxed);
                }
                _ => {
                    stats.drops_write.fetch_add(1, Relaxed);
                }
            }
        }

        // Read what arrived, under the parameters of this instant.
        let (index, phase, progress) = scenario.phase_at(Nanos(now));
        stats.phase.store(index as u64, Relaxed);
        let params = Params::of(phase.link(dir), progress, in_phase_offset(scenario, index, now));
        for _ in 0..READ_BATCH {
            let n = match tun.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            let arrival = now_ns();
            let pkt = &mut buf[..n];
            stats.packets_in.fetch_add(1, Relaxed);
            stats.bytes_in.fetch_add(n as u64, Relaxed);
            let codepoint = ip::ecn(pkt).unwrap_or(EcnCodepoint::NotEct);
            let verdict = if held_bytes + n as u64 > MAX_HELD_BYTES {
                Verdict::Drop(DropCause::QueueFull)
            } else {
                link.on_packet(&params, arrival, n, codepoint, &mut rng)
            };
            match verdict {
                Verdict::Drop(cause) => {
                    let counter = match cause {
                        DropCause::Outage => &stats.drops_outage,
                        DropCause::Loss => &stats.drops_loss,
                        DropCause::QueueFull => &stats.drops_queue,
                        DropCause::Aqm => &stats.drops_aqm,
                    };
                    counter.fetch_add(1, Relaxed);
                }
                Verdict::Deliver { at, mark_ce, queue_delay } => {
                    if mark_ce && ip::set_ce(pkt) {
                        stats.ce_marked.fetch_add(1, Relaxed);
                    }
                    stats.queue_delay_ns.store(queue_delay, Relaxed);
                    held_bytes += n as u64;
                    held.push_back(Held { at, data: pkt.to_vec() });
                }
            }
        }
        let now = now_ns();
        stats.queue_bytes.store(link.queued_bytes(now, params.rate_bps), Relaxed);
        stats.in_flight.store(held.len() as u64, Relaxed);

        // Sleep until the next delivery, a packet, or the longest sleep.
        let wait_ns =
            held.front().map_or(MAX_SLEEP_NS, |h| h.at.saturating_sub(now).min(MAX_SLEEP_NS));
        if wait_ns > 0 {
            wait_readable(&tun, wait_ns);
        }
    }
    Report { sched_error }
}

/// How far into phase `index` the instant `now` is (scenario repeats taken into account).
fn in_phase_offset(scenario: &Scenario, index: usize, now: u64) -> Nanos {
    let total = scenario.duration().0.max(1);
    let t = if scenario.repeat { now % total } else { now };
    Nanos(t.saturating_sub(scenario.phase_start(index).0))
}

/// Waits until `tun` is readable or `ns` nanoseconds have passed (ppoll: nanosecond timeout, so
/// packets are stamped as they arrive and deliveries are not rounded to milliseconds).
fn wait_readable(tun: &File, ns: u64) {
    let mut fds = [PollFd::new(tun.as_fd(), PollFlags::POLLIN)];
    let timeout = TimeSpec::from_duration(std::time::Duration::from_nanos(ns));
    let _ = ppoll(&mut fds, Some(timeout), None);
}
