//! SVG plots: step time over scenario time with the lab's phases shaded, and eval loss against
//! wall-clock time, one line per configuration.

use std::path::Path;

use anyhow::Context as _;
use plotters::{coord::types::RangedCoordf64, prelude::*};
use serde_json::Value;

use super::RunResult;

const COLORS: [RGBColor; 9] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(23, 190, 207),
];

/// Unix seconds at which the run's scenario started (its first lab line, less its elapsed time).
fn origin(r: &RunResult) -> f64 {
    r.timeline
        .first()
        .map(|v| {
            v["unix_ms"].as_f64().unwrap_or(0.0) / 1e3 - v["elapsed_s"].as_f64().unwrap_or(0.0)
        })
        .unwrap_or(0.0)
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(f64::NAN)
}

/// (start, end, name) of each phase in scenario seconds.
fn phase_spans(r: &RunResult) -> Vec<(f64, f64, String)> {
    let mut out: Vec<(f64, f64, String)> = Vec::new();
    for v in r.timeline.iter().step_by(2) {
        let (t, name) = (f(v, "elapsed_s"), v["phase"].as_str().unwrap_or("?").to_owned());
        match out.last_mut() {
            Some(last) if last.2 == name => last.1 = t,
            _ => {
                if let Some(last) = out.last_mut() {
                    last.1 = t;
                }
                out.push((t, t, name));
            }
        }
    }
    out
}

pub fn step_times(results: &[RunResult], path: &Path) -> anyhow::Result<()> {
    let series: Vec<Series> = results
        .iter()
        .map(|r| {
            let o = origin(r);
            let pts = r.steps.iter().map(|s| (f(s, "t_end") - o, f(s, "t_end") - f(s, "t_start")));
            (r.config.name.clone(), pts.filter(|p| p.0.is_finite() && p.1.is_finite()).collect())
        })
        .collect();
    let x_max = series.iter().flat_map(|s| &s.1).map(|p| p.0).fold(1.0, f64::max);
    let y_max = series.iter().flat_map(|s| &s.1).map(|p| p.1).fold(0.1, f64::max) * 1.05;
    let root = SVGBackend::new(path, (1200, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Step time over the scenario (phases shaded)", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    chart.configure_mesh().x_desc("scenario time (s)").y_desc("step time (s)").draw()?;
    if let Some(first) = results.first() {
        for (i, (a, b, name)) in phase_spans(first).iter().enumerate() {
            let shade = if i % 2 == 0 { RGBColor(235, 235, 235) } else { RGBColor(250, 250, 250) };
            chart.draw_series(std::iter::once(Rectangle::new(
                [(*a, 0.0), (*b, y_max)],
                shade.filled(),
            )))?;
            chart.draw_series(std::iter::once(Text::new(
                name.clone(),
                (*a + 1.0, y_max * 0.97),
                ("sans-serif", 12),
            )))?;
        }
    }
    draw_lines(&mut chart, &series)?;
    root.present().with_context(|| format!("writing {}", path.display()))
}

pub fn loss(results: &[RunResult], path: &Path) -> anyhow::Result<()> {
    let series: Vec<Series> = results
        .iter()
        .map(|r| {
            let start = r.steps.first().map_or(0.0, |s| f(s, "t_start"));
            let pts = r
                .steps
                .iter()
                .filter_map(|s| s["eval_loss"].as_f64().map(|l| (f(s, "t_end") - start, l)));
            (r.config.name.clone(), pts.filter(|p| p.0.is_finite() && p.1.is_finite()).collect())
        })
        .collect();
    let all = || series.iter().flat_map(|s| &s.1);
    let x_max = all().map(|p| p.0).fold(1.0, f64::max);
    let y_min = all().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let y_max = all().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let (y_min, y_max) = if y_min < y_max { (y_min * 0.98, y_max * 1.02) } else { (0.0, 1.0) };
    let root = SVGBackend::new(path, (1200, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Eval loss against wall-clock time", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..x_max, y_min..y_max)?;
    chart.configure_mesh().x_desc("seconds of training").y_desc("eval loss (nats/char)").draw()?;
    draw_lines(&mut chart, &series)?;
    root.present().with_context(|| format!("writing {}", path.display()))
}

type Series = (String, Vec<(f64, f64)>);

/// One coloured line per configuration, with the legend.
fn draw_lines<'a>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    series: &[Series],
) -> anyhow::Result<()> {
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    Ok(())
}
