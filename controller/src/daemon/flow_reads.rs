//! When the daemon reads the flow table: every tick while that is cheap, less often as the
//! table grows; and the connections already open when it starts, written into the table.

use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use linkpilot_common::FlowKey;
use tracing::{info, warn};

use crate::kernel::{probes::Probes, sockets};

/// Writes the connections open before the start into the flow table (`Probes::seed_flows`),
/// then takes out those that closed meanwhile: a close between the listing and the write came
/// before the entry, so nothing else would remove it. Call with the tracepoints attached, so
/// that a connection opening after the listing is theirs. A failure costs only those flows'
/// marks and RTT samples, so it is said, not fatal.
pub(super) fn seed_open_flows(probes: &mut Probes) {
    let listed: Vec<FlowKey> = sockets::established().into_iter().map(|(_, k)| k).collect();
    let seeded = probes.seed_flows(&listed).and_then(|written| {
        let open: HashSet<FlowKey> = sockets::established().into_iter().map(|(_, k)| k).collect();
        let closed: Vec<FlowKey> = written.iter().filter(|k| !open.contains(k)).copied().collect();
        probes.unseed_flows(&closed)?;
        Ok(written.len() - closed.len())
    });
    match seeded {
        Ok(0) => {}
        Ok(n) => info!("connections open before the start, written into the flow table: {n}"),
        Err(e) => warn!(
            "writing the connections open before the start into the flow table: {e}; the marks \
             on those that only receive count as others'"
        ),
    }
}

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
