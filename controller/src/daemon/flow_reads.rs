//! When the daemon reads the flow table: every tick while that is cheap, less often as the
//! table grows.

use std::time::{Duration, Instant};

/// Reading the flow table costs ~0.5 us per flow: a big table is read less often than the
/// counters, keeping that cost near 1% of a core, but at least every 2 s (or every tick, if
/// ticks are longer) so RTT stays fresh.
fn interval(cost: Duration, tick: Duration) -> Duration {
    (cost * 100).min(Duration::from_secs(2)).max(tick)
}

/// Reads come on ticks, so the interval counts in whole ticks (rounded up: the reads stay
/// within their share of a core), and half a tick early counts as due: ticks are not exactly a
/// tick apart, and a small table read 99.8 ms after the last one at 100 ms ticks was skipped
/// (about one tick in ten here), so that tick's RTT samples and job marks waited for the next.
pub(super) fn due(last: Option<(Instant, Duration)>, tick: Duration) -> bool {
    last.is_none_or(|(at, cost)| elapsed_due(at.elapsed(), cost, tick))
}

fn elapsed_due(elapsed: Duration, cost: Duration, tick: Duration) -> bool {
    let ticks = interval(cost, tick).as_nanos().div_ceil(tick.as_nanos().max(1));
    elapsed + tick / 2 >= tick * u32::try_from(ticks).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_flow_tables_are_read_less_often_but_at_least_every_two_seconds_or_tick() {
        let ms = Duration::from_millis;
        assert_eq!(interval(ms(0), ms(100)), ms(100), "small tables every tick");
        assert_eq!(interval(ms(5), ms(100)), ms(500), "1% of a core");
        assert_eq!(interval(ms(60), ms(100)), ms(2000), "at least every 2 s");
        assert_eq!(interval(ms(60), ms(5000)), ms(5000), "never more than once a tick");
        assert!(elapsed_due(ms(99), ms(0), ms(100)), "a tick a little early");
        assert!(!elapsed_due(ms(99), ms(5), ms(100)), "a big table waits");
        assert!(elapsed_due(ms(460), ms(5), ms(100)));
        // 1.5 ms a read: every second tick, not every tick (1.5% of a core).
        let cost = Duration::from_micros(1500);
        assert!(!elapsed_due(ms(101), cost, ms(100)), "within the share of a core");
        assert!(elapsed_due(ms(199), cost, ms(100)));
    }
}
