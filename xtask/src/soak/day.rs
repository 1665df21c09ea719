//! The compressed day: the daemon at its 10 Hz tick for an hour (the long form) against
//! `hk-us-day`, which loops (a pass is about 5.5 minutes of calm, congestion, jitter, loss and an
//! outage, so an hour is eleven of those days), with iperf3 across the lab all along. RSS and CPU
//! are sampled from /proc every minute (every 5 s in the short form) into `samples.csv`.
//!
//! The judgement, after a warm-up minute (windows filling, the allocator's first arenas):
//! - long form: the least-squares RSS slope is at most 256 KiB/h. A leak of the smallest heap
//!   allocation (a 32-byte glibc chunk) once per 100 ms tick grows RSS by 1125 KiB/h, over four
//!   times the bound; below the bound a real day adds under 6 MiB.
//! - short form: a slope over two minutes cannot tell a small leak from page-sized noise, so it
//!   judges growth from the first sample after the warm-up to the last against 1 MiB: a leak of
//!   one retained record per tick (1 KiB, a snapshot of a few flows) over two minutes is 1.2 MiB.
//! - both: the mean CPU after the warm-up is under 2% of a core, and the daemon ticked at
//!   9 Hz or more (a stalled or slowed tick would also use less CPU).

use std::{
    fmt::Write as _,
    fs,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use anyhow::bail;

use super::{start_daemon, traffic, wait_up};
use crate::{
    lab::Lab,
    proc_usage::{usage, Usage},
    run::workspace_root,
};

const SCENARIO: &str = "hk-us-day";
const WARM_UP: f64 = 60.0;
const SLOPE_BOUND_KIB_H: f64 = 256.0;
const SHORT_GROWTH_BOUND_KIB: f64 = 1024.0;
const CPU_BOUND_PCT: f64 = 2.0;
const MIN_TICK_HZ: f64 = 9.0;

struct Sample {
    t: f64,
    cpu_s: f64,
    rss_kib: u64,
    ticks: u64,
}

pub fn run(
    dir: &Path,
    bin: &Path,
    minutes: u64,
    every: Duration,
    quick: bool,
) -> anyhow::Result<()> {
    let total = Duration::from_secs(minutes * 60);
    println!(
        "soak day: the daemon at 10 Hz for {minutes} min on {SCENARIO} (looping) with iperf3, \
         sampled every {} s; results in {}",
        every.as_secs(),
        dir.display()
    );
    let running = Lab::start(
        &crate::lab::bin("linkpilot-lab"),
        dir,
        SCENARIO,
        if quick { "kldayq" } else { "klday" },
        1,
        total.as_secs() + 120,
    )?;
    let hk = running.host("Hk", 0).clone();
    let policy = workspace_root().join("policies/hk-us.toml");
    let mut daemon = start_daemon(bin, &hk.netns, dir, &policy, &[])?;
    wait_up(&mut daemon, dir, Duration::from_secs(30))?;
    let start = Instant::now();
    let deadline = start + total;
    let traffic = traffic(&running, dir, deadline + Duration::from_secs(5), true)?;
    let pid = daemon.0.id();
    let socket = dir.join("status.sock");
    let mut samples: Vec<Sample> = Vec::new();
    let mut csv = String::from("t_s,rss_kib,cpu_s,cpu_pct_of_core,ticks\n");
    let mut n = 0u32;
    loop {
        let at = start + every * n;
        if at > deadline {
            break;
        }
        if let Some(wait) = at.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        if let Ok(Some(st)) = daemon.0.try_wait() {
            bail!(
                "the daemon exited ({st}) after {:.0} s; see {}",
                start.elapsed().as_secs_f64(),
                dir.join("daemon.log").display()
            );
        }
        let Usage { cpu_s, rss_kib, .. } = usage(pid)?;
        let ticks = crate::demo::query(&socket).and_then(|s| s["ticks"].as_u64()).unwrap_or(0);
        let t = start.elapsed().as_secs_f64();
        let pct = samples.last().map_or(0.0, |p| (cpu_s - p.cpu_s) / (t - p.t) * 100.0);
        writeln!(csv, "{t:.1},{rss_kib},{cpu_s:.2},{pct:.3},{ticks}")?;
        fs::write(dir.join("samples.csv"), &csv)?;
        println!("  {t:>6.0} s  RSS {rss_kib} KiB  CPU {pct:.2}% of a core  ticks {ticks}");
        samples.push(Sample { t, cpu_s, rss_kib, ticks });
        n += 1;
    }
    drop(daemon);
    drop(traffic);
    drop(running);
    judge(&samples, !quick)
}

/// Least-squares slope of (t, y), per unit of t.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (mt, my) = points.iter().fold((0.0, 0.0), |(a, b), (t, y)| (a + t / n, b + y / n));
    let (num, den) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (t, y)| (a + (t - mt) * (y - my), b + (t - mt) * (t - mt)));
    if den == 0.0 {
        0.0
    } else {
        num / den
    }
}

fn judge(samples: &[Sample], long: bool) -> anyhow::Result<()> {
    let warm: Vec<&Sample> = samples.iter().filter(|s| s.t >= WARM_UP).collect();
    let (Some(first), Some(last)) = (warm.first(), warm.last()) else {
        bail!("too few samples after the {WARM_UP} s warm-up");
    };
    if warm.len() < 3 {
        bail!("too few samples after the {WARM_UP} s warm-up: {}", warm.len());
    }
    let wall = last.t - first.t;
    let kib_h = slope(&warm.iter().map(|s| (s.t / 3600.0, s.rss_kib as f64)).collect::<Vec<_>>());
    let growth = last.rss_kib as f64 - first.rss_kib as f64;
    let cpu_mean = (last.cpu_s - first.cpu_s) / wall * 100.0;
    let cpu_max = warm
        .windows(2)
        .map(|w| (w[1].cpu_s - w[0].cpu_s) / (w[1].t - w[0].t) * 100.0)
        .fold(0.0, f64::max);
    let hz = last.ticks.saturating_sub(first.ticks) as f64 / wall;
    let rss: Vec<u64> = warm.iter().map(|s| s.rss_kib).collect();
    println!(
        "soak day: {} samples over {:.0} s after a {WARM_UP} s warm-up: RSS {}..{} KiB, slope \
         {kib_h:+.1} KiB/h, growth {growth:+.0} KiB; CPU mean {cpu_mean:.2}% max {cpu_max:.2}% \
         of a core; {hz:.2} ticks/s",
        warm.len(),
        wall,
        rss.iter().min().unwrap_or(&0),
        rss.iter().max().unwrap_or(&0),
    );
    let mut missed = Vec::new();
    if long && kib_h > SLOPE_BOUND_KIB_H {
        missed.push(format!("RSS slope {kib_h:+.1} KiB/h > {SLOPE_BOUND_KIB_H} KiB/h"));
    }
    if !long && growth > SHORT_GROWTH_BOUND_KIB {
        missed.push(format!("RSS grew {growth:+.0} KiB > {SHORT_GROWTH_BOUND_KIB} KiB"));
    }
    if cpu_mean >= CPU_BOUND_PCT {
        missed.push(format!("mean CPU {cpu_mean:.2}% >= {CPU_BOUND_PCT}% of a core"));
    }
    if hz < MIN_TICK_HZ {
        missed.push(format!("{hz:.2} ticks/s < {MIN_TICK_HZ}"));
    }
    if !missed.is_empty() {
        bail!("the compressed day missed its goal: {}", missed.join("; "));
    }
    println!("soak day: OK");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{judge, Sample};

    /// The short form's samples, every 5 s for 3 minutes at 10 Hz, with `kib_per_tick` of RSS
    /// growth and `cpu` seconds of CPU per second.
    fn run(kib_per_tick: f64, cpu: f64) -> Vec<Sample> {
        (0..=36)
            .map(|i| {
                let t = f64::from(i) * 5.0;
                Sample {
                    t,
                    cpu_s: t * cpu,
                    rss_kib: 57_000 + (t * 10.0 * kib_per_tick) as u64,
                    ticks: (t * 10.0) as u64,
                }
            })
            .collect()
    }

    #[test]
    fn slope_of_a_line_and_of_a_flat_series() {
        let line: Vec<(f64, f64)> =
            (0..10).map(|i| (f64::from(i), 3.0 * f64::from(i) + 7.0)).collect();
        assert!((super::slope(&line) - 3.0).abs() < 1e-9);
        let flat: Vec<(f64, f64)> = (0..10).map(|i| (f64::from(i), 5.0)).collect();
        assert_eq!(super::slope(&flat), 0.0);
    }

    #[test]
    fn a_flat_run_under_the_cpu_bound_passes() {
        judge(&run(0.0, 0.012), false).unwrap();
        judge(&run(0.0, 0.012), true).unwrap();
    }

    #[test]
    fn a_kib_leaked_per_tick_fails_the_short_form_and_a_32_byte_one_the_long_form() {
        let e = judge(&run(1.0, 0.012), false).unwrap_err().to_string();
        assert!(e.contains("RSS grew"), "{e}");
        let e = judge(&run(32.0 / 1024.0, 0.012), true).unwrap_err().to_string();
        assert!(e.contains("RSS slope"), "{e}");
    }

    #[test]
    fn two_percent_of_a_core_fails() {
        let e = judge(&run(0.0, 0.02), false).unwrap_err().to_string();
        assert!(e.contains("mean CPU"), "{e}");
    }
}
