//! `replay --plot out.svg`: signals, states and knobs over time, one panel each (plotters).

use std::path::Path;

use anyhow::{anyhow, Context};
use plotters::prelude::*;

use crate::control::{policy::Policy, replay::Replay};

type Series = Vec<(f64, f64)>;

fn draw_panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    title: &str,
    x_max: f64,
    y_label: &str,
    series: &[(&str, Series, RGBColor)],
) -> anyhow::Result<()> {
    let values = || series.iter().flat_map(|(_, s, _)| s.iter().map(|p| p.1));
    let y_max = values().fold(0.0f64, f64::max).max(1e-9) * 1.1;
    // A signal that stays far from zero (RTT) gets an axis around its own range.
    let y_min = values().fold(f64::INFINITY, f64::min);
    let y_min = if y_min.is_finite() && y_min > y_max * 0.5 { y_min * 0.98 } else { 0.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..x_max.max(1.0), y_min..y_max)
        .map_err(|e| anyhow!("plot: {e}"))?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc(y_label)
        .draw()
        .map_err(|e| anyhow!("plot: {e}"))?;
    for (name, s, color) in series {
        let color = *color;
        chart
            .draw_series(LineSeries::new(s.iter().copied(), color))
            .map_err(|e| anyhow!("plot: {e}"))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| anyhow!("plot: {e}"))?;
    Ok(())
}

/// Draws the first link of the replay into an SVG file.
pub fn plot(replay: &Replay, policy: &Policy, path: &Path) -> anyhow::Result<()> {
    let link = policy.links.first().map(|l| l.name.clone()).unwrap_or_default();
    let sig: Vec<_> = replay.signals.iter().filter(|(l, _)| *l == link).map(|(_, s)| s).collect();
    let tl: Vec<_> = replay.timeline.iter().filter(|(_, l, _, _)| *l == link).collect();
    let x_max = sig.last().map_or(1.0, |s| s.at_ms as f64 / 1e3);
    let t = |ms: u64| ms as f64 / 1e3;
    let rtt: Series = sig.iter().filter_map(|s| Some((t(s.at_ms), s.rtt_ms?))).collect();
    let p99: Series = sig.iter().filter_map(|s| Some((t(s.at_ms), s.rtt_p99_ms?))).collect();
    let base: Series = sig.iter().filter_map(|s| Some((t(s.at_ms), s.baseline_ms?))).collect();
    let ce: Series = sig.iter().map(|s| (t(s.at_ms), s.ce_fraction * 100.0)).collect();
    let re: Series = sig.iter().map(|s| (t(s.at_ms), s.retrans * 100.0)).collect();
    let state: Series = tl.iter().map(|(at, _, i, _)| (t(*at), *i as f64)).collect();
    let compression: Series =
        tl.iter().map(|(at, _, _, k)| (t(*at), 1.0 / k.compression.ratio())).collect();
    let chunk: Series =
        tl.iter().map(|(at, _, _, k)| (t(*at), k.chunk_bytes as f64 / 1048576.0)).collect();
    let ib: Series =
        tl.iter().map(|(at, _, _, k)| (t(*at), f64::from(k.nccl_ib_timeout))).collect();
    let watchdog: Series =
        tl.iter().map(|(at, _, _, k)| (t(*at), f64::from(k.watchdog_s) / 60.0)).collect();

    let root = SVGBackend::new(path, (1100, 1000)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("plot: {e}"))?;
    let panels = root.split_evenly((4, 1));
    let names: Vec<&str> = policy.states.iter().map(|s| s.name.as_str()).collect();
    draw_panel(
        &panels[0],
        &format!("link {link}: RTT"),
        x_max,
        "ms",
        &[("RTT (EWMA)", rtt, BLUE), ("RTT p99", p99, RED), ("baseline", base, GREEN)],
    )?;
    draw_panel(
        &panels[1],
        "congestion signals",
        x_max,
        "%",
        &[("CE (or echoed ECE) fraction", ce, MAGENTA), ("retransmitted", re, BLACK)],
    )?;
    draw_panel(
        &panels[2],
        &format!("state (0..{}: {})", names.len() - 1, names.join(", ")),
        x_max,
        "level / factor",
        &[("state", state, RED), ("compression factor", compression, BLUE)],
    )?;
    draw_panel(
        &panels[3],
        "knobs",
        x_max,
        "value",
        &[
            ("chunk (MiB)", chunk, BLUE),
            ("NCCL_IB_TIMEOUT", ib, RED),
            ("watchdog (min)", watchdog, GREEN),
        ],
    )?;
    root.present().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
