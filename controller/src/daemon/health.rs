//! Failed sensing reads. A tick whose reads fail (a map lookup, the address list) decides
//! nothing and is counted; the next tick tries again. Only a failure that lasts stops the
//! daemon: every tick failing for [`GIVE_UP_AFTER`] and at least [`GIVE_UP_TICKS`] ticks.
//!
//! Why 30 s and 10 ticks: what passes (an interface or address changing under us, a map
//! briefly out of memory) clears within a tick or a few; a daemon blind for longer decides on
//! nothing while its board already reads stale to every reader (two missed heartbeats), and
//! exiting with the reason lets the supervisor (systemd's Restart=on-failure) start a fresh
//! daemon that loads and attaches again. The tick count keeps slow ticks (a 5 s tick) from
//! giving up after a handful of tries.

use std::time::{Duration, Instant};

pub const GIVE_UP_AFTER: Duration = Duration::from_secs(30);
pub const GIVE_UP_TICKS: u32 = 10;

/// Consecutive failed ticks, from the first of them.
#[derive(Clone, Debug)]
struct Streak {
    since: Instant,
    ticks: u32,
}

#[derive(Debug)]
pub struct SensingHealth {
    give_up_after: Duration,
    streak: Option<Streak>,
    /// Failed ticks since the start.
    pub total: u64,
    /// The latest failure, kept after recovery for the status API.
    pub last_error: Option<String>,
}

impl SensingHealth {
    pub fn new(give_up_after: Duration) -> Self {
        Self { give_up_after, streak: None, total: 0, last_error: None }
    }

    /// Consecutive failed ticks now (0: the last tick read everything).
    pub fn failing_ticks(&self) -> u32 {
        self.streak.as_ref().map_or(0, |s| s.ticks)
    }

    /// A tick read everything. Returns the streak it ends (ticks, how long), if any.
    pub fn ok(&mut self, now: Instant) -> Option<(u32, Duration)> {
        self.streak.take().map(|s| (s.ticks, now.saturating_duration_since(s.since)))
    }

    /// A tick failed with `error`: Ok to try again next tick, or the reason to stop.
    pub fn failed(&mut self, error: &anyhow::Error, now: Instant) -> anyhow::Result<()> {
        self.total += 1;
        let why = format!("{error:#}");
        self.last_error = Some(why.clone());
        let s = self.streak.get_or_insert(Streak { since: now, ticks: 0 });
        s.ticks += 1;
        let lasted = now.saturating_duration_since(s.since);
        if s.ticks >= GIVE_UP_TICKS && lasted >= self.give_up_after {
            anyhow::bail!(
                "sensing failed on every tick for {:.1} s ({} ticks), giving up; last error: {why}",
                lasted.as_secs_f64(),
                s.ticks
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_failures_are_counted_and_only_a_lasting_one_stops() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let err = anyhow::anyhow!("reading LP_PEER_STATS: no such entry");
        let mut h = SensingHealth::new(Duration::from_secs(2));
        // Two bad ticks, then a good one: counted, kept, forgiven.
        h.failed(&err, at(0)).unwrap();
        h.failed(&err, at(100)).unwrap();
        assert_eq!(h.failing_ticks(), 2);
        assert_eq!(h.ok(at(200)), Some((2, Duration::from_millis(200))));
        assert_eq!((h.failing_ticks(), h.total), (0, 2));
        assert!(h.last_error.as_deref().unwrap().contains("LP_PEER_STATS"));
        // Many failures in less than the limit: still going.
        for i in 0..19 {
            h.failed(&err, at(1000 + i * 100)).unwrap();
        }
        // Over the limit but by a long tick's count (2 ticks): still going.
        let mut slow = SensingHealth::new(Duration::from_secs(2));
        slow.failed(&err, at(0)).unwrap();
        slow.failed(&err, at(5000)).unwrap();
        // Both: stop, with the reason.
        let e = h.failed(&err, at(3000)).unwrap_err().to_string();
        assert!(e.contains("20 ticks") && e.contains("no such entry"), "{e}");
    }
}
