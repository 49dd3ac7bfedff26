//! The PNG: throughput against threads (threading) and latency against load (batching).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use plotters::style::FontStyle;

use super::report::Record;

/// Environment variable naming a TrueType font for the plot's text.
pub const FONT_ENV: &str = "STREAMPOOL_FONT";

/// Where a sans-serif TrueType font is commonly found.
const FONT_PATHS: [&str; 6] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/usr/lib/python3/dist-packages/matplotlib/mpl-data/fonts/ttf/DejaVuSans.ttf",
];

/// Registers the first font found (once per process); false when there is none, and the
/// plot is then drawn without text.
fn font_available() -> bool {
    static FOUND: OnceLock<bool> = OnceLock::new();
    *FOUND.get_or_init(|| {
        let candidates = std::env::var_os(FONT_ENV)
            .map(PathBuf::from)
            .into_iter()
            .chain(FONT_PATHS.iter().map(PathBuf::from));
        for path in candidates {
            if let Ok(bytes) = std::fs::read(&path) {
                // plotters keeps fonts for the whole process, hence the 'static leak (once).
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// One line of a panel: a label and its (x, y) points.
type Series = (String, Vec<(f64, f64)>);

/// Draws the two panels into `path` (PNG). Returns whether text could be drawn.
pub fn draw(
    path: &Path,
    title: &str,
    results: &[Record],
    batching_config: (usize, f64),
) -> Result<bool> {
    let text = font_available();
    let mut workloads: Vec<String> = Vec::new();
    for r in results {
        if !workloads.contains(&r.series()) {
            workloads.push(r.series());
        }
    }
    let mut left: Vec<Series> = Vec::new();
    let mut right: Vec<Series> = Vec::new();
    for w in &workloads {
        let pts: Vec<(f64, f64)> = results
            .iter()
            .filter(|r| &r.series() == w && r.scenario == "threading")
            .filter_map(|r| Some((r.threads? as f64, r.throughput_per_s)))
            .collect();
        if !pts.is_empty() {
            left.push((w.clone(), pts));
        }
        let sweep: Vec<&Record> = results
            .iter()
            .filter(|r| &r.series() == w && r.scenario == "batching")
            .filter(|r| r.batch == batching_config.0 && r.max_wait_ms == Some(batching_config.1))
            .collect();
        for (name, pick) in [("p50", 0), ("p99", 1)] {
            let pts: Vec<(f64, f64)> = sweep
                .iter()
                .filter_map(|r| {
                    let y = if pick == 0 {
                        r.latency_ms.p50
                    } else {
                        r.latency_ms.p99
                    };
                    Some((r.callers? as f64, y))
                })
                .collect();
            if !pts.is_empty() {
                right.push((format!("{w} {name}"), pts));
            }
        }
    }
    let root = BitMapBackend::new(path, (1400, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("plot: {e}"))?;
    let root = if text {
        root.titled(title, ("sans-serif", 20))
            .map_err(|e| anyhow!("plot: {e}"))?
    } else {
        root
    };
    let panels = root.split_evenly((1, 2));
    panel(
        &panels[0],
        text,
        "threading: throughput vs threads (batch 1)",
        "threads",
        "rows/s",
        &left,
    )?;
    let caption = format!(
        "batching: latency vs callers (max_batch {}, max_wait {} ms)",
        batching_config.0, batching_config.1
    );
    panel(
        &panels[1],
        text,
        &caption,
        "concurrent callers",
        "latency ms",
        &right,
    )?;
    root.present().map_err(|e| anyhow!("plot: {e}"))?;
    Ok(text)
}

fn panel(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    text: bool,
    caption: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
) -> Result<()> {
    // Both axes are logarithmic; plot in log space on linear axes (log2 of the thread count,
    // log10 of the value) so that ticks fall on 1, 2, 4, ... threads and label cleanly.
    let series: Vec<Series> = series
        .iter()
        .map(|(l, pts)| {
            let pts = pts
                .iter()
                .filter(|p| p.0 > 0.0 && p.1 > 0.0)
                .map(|&(x, y)| (x.log2(), y.log10()))
                .collect();
            (l.clone(), pts)
        })
        .collect();
    let (mut x_max, mut y_min, mut y_max) = (1.0f64, f64::MAX, f64::MIN);
    for &(x, y) in series.iter().flat_map(|s| s.1.iter()) {
        x_max = x_max.max(x);
        y_min = y_min.min(y);
        y_max = y_max.max(y);
    }
    if y_min > y_max {
        (y_min, y_max) = (0.0, 1.0);
    }
    let pad = ((y_max - y_min) * 0.1).max(0.1);
    let mut builder = ChartBuilder::on(area);
    builder.margin(16);
    if text {
        builder
            .caption(caption, ("sans-serif", 16))
            .x_label_area_size(40)
            .y_label_area_size(70);
    }
    let mut chart = builder
        .build_cartesian_2d(-0.2f64..x_max + 0.2, y_min - pad..y_max + pad)
        .map_err(|e| anyhow!("plot: {e}"))?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc(x_desc)
            .y_desc(y_desc)
            .label_style(("sans-serif", 13))
            .x_labels(x_max.ceil() as usize + 1)
            .x_label_formatter(&|x| format!("{:.0}", 2f64.powf(*x)))
            .y_label_formatter(&|y| {
                let v = 10f64.powf(*y);
                if v >= 10.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v:.2}")
                }
            });
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw().map_err(|e| anyhow!("plot: {e}"))?;
    for (i, (label, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let line = chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(|e| anyhow!("plot: {e}"))?;
        if text {
            line.label(label.clone()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        }
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(|e| anyhow!("plot: {e}"))?;
    }
    if text && !series.is_empty() {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(|e| anyhow!("plot: {e}"))?;
    }
    Ok(())
}
