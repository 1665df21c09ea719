//! `linkpilot watch`: per-interface rates once a second, from the probes' counters.

use std::time::Duration;

use linkpilot_common::IfaceStats;
use serde::Serialize;

/// Rates of one interface over one interval.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Rates {
    pub rx_packets_per_s: f64,
    pub rx_bytes_per_s: f64,
    pub tx_packets_per_s: f64,
    pub tx_bytes_per_s: f64,
    pub retrans_segs_per_s: f64,
}

/// Counter totals as printed: the kernel struct minus padding concerns, serialisable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub retrans_segs: u64,
    pub retrans_failed: u64,
}

impl From<IfaceStats> for Totals {
    fn from(s: IfaceStats) -> Self {
        Self {
            rx_packets: s.rx_packets,
            rx_bytes: s.rx_bytes,
            tx_packets: s.tx_packets,
            tx_bytes: s.tx_bytes,
            retrans_segs: s.retrans_segs,
            retrans_failed: s.retrans_failed,
        }
    }
}

/// Rates between two readings `elapsed` apart. Counters are u64 and only reset when the
/// interface is re-added, so a reading below the previous one is a reset: the delta is then the
/// new value (counted since the reset) rather than a huge wrapped number.
pub fn rates(prev: &Totals, now: &Totals, elapsed: Duration) -> Rates {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return Rates::default();
    }
    let d = |a: u64, b: u64| if b >= a { (b - a) as f64 / secs } else { b as f64 / secs };
    Rates {
        rx_packets_per_s: d(prev.rx_packets, now.rx_packets),
        rx_bytes_per_s: d(prev.rx_bytes, now.rx_bytes),
        tx_packets_per_s: d(prev.tx_packets, now.tx_packets),
        tx_bytes_per_s: d(prev.tx_bytes, now.tx_bytes),
        retrans_segs_per_s: d(prev.retrans_segs, now.retrans_segs),
    }
}

/// One line of `watch --json`.
#[derive(Debug, Serialize)]
pub struct Sample<'a> {
    /// Wall-clock time of the reading, milliseconds since the Unix epoch.
    pub unix_ms: u128,
    pub iface: &'a str,
    pub ifindex: u32,
    /// Seconds covered by `rates`.
    pub interval_s: f64,
    pub rates: Rates,
    /// Totals since the interface was attached.
    pub totals: Totals,
    /// True on the last line, printed after detaching.
    pub last: bool,
}

/// The human table's header.
pub fn table_header() -> String {
    format!(
        "{:<16} {:>10} {:>12} {:>10} {:>12} {:>10}",
        "IFACE", "RX pkt/s", "RX bit/s", "TX pkt/s", "TX bit/s", "RETRANS/s"
    )
}

/// One row of the human table.
pub fn table_row(iface: &str, r: &Rates) -> String {
    format!(
        "{:<16} {:>10.0} {:>12} {:>10.0} {:>12} {:>10.0}",
        iface,
        r.rx_packets_per_s,
        human_bits(r.rx_bytes_per_s * 8.0),
        r.tx_packets_per_s,
        human_bits(r.tx_bytes_per_s * 8.0),
        r.retrans_segs_per_s
    )
}

/// `1234567.0` -> `"1.23M"`.
pub fn human_bits(bits_per_s: f64) -> String {
    const UNITS: [(f64, &str); 3] = [(1e9, "G"), (1e6, "M"), (1e3, "k")];
    UNITS
        .iter()
        .find(|(scale, _)| bits_per_s >= *scale)
        .map(|(scale, unit)| format!("{:.2}{unit}", bits_per_s / scale))
        .unwrap_or_else(|| format!("{bits_per_s:.0}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(rx: u64, retrans: u64) -> Totals {
        Totals { rx_packets: rx, rx_bytes: rx * 100, retrans_segs: retrans, ..Default::default() }
    }

    #[test]
    fn rates_over_interval() {
        let r = rates(&totals(100, 1), &totals(300, 5), Duration::from_millis(500));
        assert_eq!(r.rx_packets_per_s, 400.0);
        assert_eq!(r.rx_bytes_per_s, 40_000.0);
        assert_eq!(r.retrans_segs_per_s, 8.0);
    }

    #[test]
    fn reset_counts_from_zero_and_zero_interval_is_safe() {
        let r = rates(&totals(1_000, 0), &totals(10, 0), Duration::from_secs(1));
        assert_eq!(r.rx_packets_per_s, 10.0);
        assert_eq!(rates(&totals(1, 0), &totals(2, 0), Duration::ZERO), Rates::default());
    }

    #[test]
    fn human_units() {
        assert_eq!(human_bits(0.0), "0");
        assert_eq!(human_bits(999.0), "999");
        assert_eq!(human_bits(1_500.0), "1.50k");
        assert_eq!(human_bits(40e9), "40.00G");
    }
}
