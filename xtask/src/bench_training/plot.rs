//! SVG plots of each configuration's first repeat: step time over scenario time with the lab's
//! phases shaded, and eval loss (the checkpoints', as measured) against seconds of training.

use std::{ops::Range, path::Path};

use anyhow::Context as _;
use plotters::{coord::types::RangedCoordf64, prelude::*};
use serde_json::Value;

use super::runs::Run;

const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(23, 190, 207),
    RGBColor(188, 189, 34),
];

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(f64::NAN)
}

/// The first repeat of each configuration.
fn firsts(runs: &[Run]) -> Vec<&Run> {
    let mut out: Vec<&Run> = Vec::new();
    for r in runs {
        match out.iter().position(|o| o.config == r.config) {
            Some(i) if out[i].repeat > r.repeat => out[i] = r,
            Some(_) => {}
            None => out.push(r),
        }
    }
    out
}

/// (start, end, name) of each phase in scenario seconds.
fn phase_spans(r: &Run) -> Vec<(f64, f64, String)> {
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

pub fn step_times(runs: &[Run], path: &Path) -> anyhow::Result<()> {
    let shown = firsts(runs);
    let series: Vec<Series> = shown
        .iter()
        .map(|r| {
            let origin = r.pass_end - r.pass_s;
            let pts = r.steps().map(|s| (f(s, "t_end") - origin, f(s, "t_end") - f(s, "t_start")));
            (r.config.clone(), pts.filter(|p| p.0.is_finite() && p.1.is_finite()).collect())
        })
        .collect();
    let x_max = series.iter().flat_map(|s| &s.1).map(|p| p.0).fold(1.0, f64::max);
    let y_max = series.iter().flat_map(|s| &s.1).map(|p| p.1).fold(0.1, f64::max) * 1.05;
    let caption = "Step time over the scenario (first repeat; phases shaded)";
    let axes = ("scenario time (s)", "step time (s)");
    plot(path, caption, (0.0..x_max, 0.0..y_max), axes, |chart| {
        if let Some(first) = shown.first() {
            for (i, (a, b, name)) in phase_spans(first).iter().enumerate() {
                let shade =
                    if i % 2 == 0 { RGBColor(235, 235, 235) } else { RGBColor(250, 250, 250) };
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
        draw_lines(chart, &series)
    })
}

pub fn loss(runs: &[Run], path: &Path) -> anyhow::Result<()> {
    let series: Vec<Series> = firsts(runs)
        .iter()
        .map(|r| {
            let pts = r.evals.iter().map(|e| (e.1, e.2));
            (r.config.clone(), pts.filter(|p| p.0.is_finite() && p.1.is_finite()).collect())
        })
        .collect();
    let all = || series.iter().flat_map(|s| &s.1);
    let x_max = all().map(|p| p.0).fold(1.0, f64::max);
    let y_min = all().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let y_max = all().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let (y_min, y_max) =
        if y_min < y_max { (y_min * 0.98, y_max.min(y_min * 1.6)) } else { (0.0, 1.0) };
    let caption = "Eval loss against seconds of training (first repeat)";
    let axes = ("seconds of training", "eval loss (nats/byte)");
    plot(path, caption, (0.0..x_max, y_min..y_max), axes, |chart| draw_lines(chart, &series))
}

type Chart<'a> = ChartContext<'a, SVGBackend<'a>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Both plots' frame: a 1200x600 SVG at `path` with `caption` and the axes `(x, y)` labelled
/// `(x_desc, y_desc)`; `draw` adds what is plotted.
fn plot(
    path: &Path,
    caption: &str,
    (x, y): (Range<f64>, Range<f64>),
    (x_desc, y_desc): (&str, &str),
    draw: impl FnOnce(&mut Chart<'_>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1200, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(x, y)?;
    chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).draw()?;
    draw(&mut chart)?;
    root.present().with_context(|| format!("writing {}", path.display()))
}

type Series = (String, Vec<(f64, f64)>);

/// One coloured line per configuration, with the legend.
fn draw_lines(chart: &mut Chart<'_>, series: &[Series]) -> anyhow::Result<()> {
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
