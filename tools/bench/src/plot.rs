//! The PNG plot of a run (`--plot`): throughput (pairs/s) and p99 pair latency against the
//! client count, one line per system, for the first scenario measured; in open-loop mode
//! (`--rate`, `--slo`) p99.9 against the offered rate instead.
//!
//! Text is drawn with DejaVu Sans Mono shipped in `fonts/` (Bitstream Vera license, beside it)
//! through plotters' `ab_glyph` backend, so the plot renders the same on a machine without any
//! system font. The bitmap is encoded with `png` directly. Owns drawing only.

use std::path::Path;

use plotters::prelude::*;

use super::report::Row;

static FONT: &[u8] = include_bytes!("fonts/DejaVuSansMono.ttf");
const WIDTH: u32 = 1400;
const HEIGHT: u32 = 560;

/// Draws the plot of `scenario` (rows of other scenarios are ignored) into a PNG at `path`.
pub fn write(path: &Path, scenario: &str, rows: &[Row]) -> Result<(), String> {
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| "the bundled font cannot be read".to_owned())?;
    let rows: Vec<&Row> = rows.iter().filter(|r| r.scenario == scenario).collect();
    let mut clients: Vec<usize> = rows.iter().map(|r| r.clients).collect();
    clients.sort_unstable();
    clients.dedup();
    let mut systems: Vec<&str> = Vec::new();
    for row in &rows {
        if !systems.contains(&row.system.as_str()) {
            systems.push(&row.system);
        }
    }
    let mut buffer = vec![255u8; (WIDTH * HEIGHT * 3) as usize];
    draw(&mut buffer, scenario, &rows, &clients, &systems).map_err(|e| format!("drawing: {e}"))?;
    encode(path, &buffer)
}

fn draw(
    buffer: &mut [u8],
    scenario: &str,
    rows: &[&Row],
    clients: &[usize],
    systems: &[&str],
) -> Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::with_buffer(buffer, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        &format!("topology-claims-bench, scenario {scenario}: BeginUpdate+CommitUpdate pairs"),
        ("sans-serif", 22),
    )?;
    let (left, right) = root.split_horizontally(WIDTH / 2);
    let x_range = -1..clients.len() as i32;
    let x_label = |i: &i32| {
        usize::try_from(*i)
            .ok()
            .and_then(|i| clients.get(i))
            .map(|c| c.to_string())
            .unwrap_or_default()
    };
    let point = |row: &Row, value: f64| {
        let x = clients.iter().position(|c| *c == row.clients).unwrap_or(0) as i32;
        (x, value)
    };
    let series = |system: &str, value: &dyn Fn(&Row) -> f64| -> Vec<(i32, f64)> {
        rows.iter()
            .filter(|r| r.system == system)
            .map(|r| point(r, value(r)))
            .collect()
    };

    let max_rate = rows.iter().map(|r| r.pairs_per_s()).fold(1.0, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&left)
        .margin(16)
        .caption("throughput (pairs/s, higher is better)", ("sans-serif", 18))
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x_range.clone(), 0.0..max_rate)?;
    chart
        .configure_mesh()
        .x_labels(clients.len() + 2)
        .x_label_formatter(&x_label)
        .x_desc("concurrent clients")
        .y_desc("pairs/s")
        .label_style(("sans-serif", 14))
        .draw()?;
    for (i, system) in systems.iter().enumerate() {
        let points = series(system, &|r: &Row| r.pairs_per_s());
        draw_system(&mut chart, i, system, points)?;
    }
    draw_legend(&mut chart)?;

    let p99 = |r: &Row| r.tally.pair.ms(0.99).max(0.01);
    let (lo, hi) = rows
        .iter()
        .map(|r| p99(r))
        .fold((f64::MAX, 0.01f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let lo = if lo == f64::MAX { 0.01 } else { lo };
    let mut chart = ChartBuilder::on(&right)
        .margin(16)
        .caption(
            "p99 of the pair (ms, log scale, lower is better)",
            ("sans-serif", 18),
        )
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x_range, (lo / 1.5..hi * 1.5).log_scale())?;
    chart
        .configure_mesh()
        .x_labels(clients.len() + 2)
        .x_label_formatter(&x_label)
        .x_desc("concurrent clients")
        .y_desc("ms")
        .label_style(("sans-serif", 14))
        .draw()?;
    for (i, system) in systems.iter().enumerate() {
        let points = series(system, &p99);
        draw_system(&mut chart, i, system, points)?;
    }
    draw_legend(&mut chart)?;
    root.present()?;
    Ok(())
}

/// One open-loop segment in the rate plot.
pub struct RatePoint {
    pub system: String,
    pub scenario: String,
    /// Offered pairs/s.
    pub rate: f64,
    /// p99.9 of the slower RPC, ms from the scheduled start.
    pub p999_ms: f64,
}

/// Draws p99.9 (the slower of BeginUpdate and CommitUpdate, from the scheduled start) against
/// the offered rate of `scenario`'s open-loop segments, one line per system, and the objective.
pub fn write_rates(
    path: &Path,
    scenario: &str,
    points: &[RatePoint],
    threshold: Option<f64>,
) -> Result<(), String> {
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| "the bundled font cannot be read".to_owned())?;
    let mut points: Vec<&RatePoint> = points.iter().filter(|p| p.scenario == scenario).collect();
    points.sort_by(|a, b| a.rate.total_cmp(&b.rate));
    let mut systems: Vec<&str> = Vec::new();
    for point in &points {
        if !systems.contains(&point.system.as_str()) {
            systems.push(&point.system);
        }
    }
    let mut buffer = vec![255u8; (WIDTH * HEIGHT * 3) as usize];
    draw_rates(&mut buffer, scenario, &points, &systems, threshold)
        .map_err(|e| format!("drawing: {e}"))?;
    encode(path, &buffer)
}

fn draw_rates(
    buffer: &mut [u8],
    scenario: &str,
    points: &[&RatePoint],
    systems: &[&str],
    threshold: Option<f64>,
) -> Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::with_buffer(buffer, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let (lo_rate, hi_rate) = points.iter().fold((f64::MAX, 1.0f64), |(lo, hi), p| {
        (lo.min(p.rate), hi.max(p.rate))
    });
    let lo_rate = if lo_rate == f64::MAX { 1.0 } else { lo_rate };
    let (lo_ms, hi_ms) = points
        .iter()
        .map(|p| p.p999_ms.max(0.01))
        .chain(threshold)
        .fold((f64::MAX, 0.01f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let lo_ms = if lo_ms == f64::MAX { 0.01 } else { lo_ms };
    let mut chart = ChartBuilder::on(&root)
        .margin(16)
        .caption(
            format!(
                "topology-claims-bench, scenario {scenario}, open loop: p99.9 per RPC (the slower of \
                 begin and commit, from the scheduled start) against offered rate"
            ),
            ("sans-serif", 18),
        )
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (lo_rate / 1.3..hi_rate * 1.3).log_scale(),
            (lo_ms / 1.5..hi_ms * 1.5).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("offered pairs/s (log scale)")
        .y_desc("p99.9 ms (log scale)")
        .label_style(("sans-serif", 14))
        .draw()?;
    if let Some(ms) = threshold {
        chart
            .draw_series(LineSeries::new(
                [(lo_rate / 1.3, ms), (hi_rate * 1.3, ms)],
                BLACK.stroke_width(1),
            ))?
            .label(format!("objective {ms} ms"))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(1)));
    }
    for (i, system) in systems.iter().enumerate() {
        let series: Vec<(f64, f64)> = points
            .iter()
            .filter(|p| p.system == *system)
            .map(|p| (p.rate, p.p999_ms.max(0.01)))
            .collect();
        draw_system(&mut chart, i, system, series)?;
    }
    draw_legend(&mut chart)?;
    root.present()?;
    Ok(())
}

/// One system's line and dots, in its palette colour, named in the legend.
fn draw_system<'a, X, Y>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, Cartesian2d<X, Y>>,
    index: usize,
    system: &str,
    points: Vec<(X::ValueType, Y::ValueType)>,
) -> Result<(), Box<dyn std::error::Error>>
where
    X: Ranged,
    Y: Ranged,
    X::ValueType: Clone + 'static,
    Y::ValueType: Clone + 'static,
{
    let color = Palette99::pick(index).to_rgba();
    chart
        .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
        .label(system)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    chart.draw_series(
        points
            .into_iter()
            .map(|p| Circle::new(p, 4, color.filled())),
    )?;
    Ok(())
}

/// The legend box, top left.
fn draw_legend<'a, X: Ranged, Y: Ranged>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, Cartesian2d<X, Y>>,
) -> Result<(), Box<dyn std::error::Error>> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    Ok(())
}

fn encode(path: &Path, rgb: &[u8]) -> Result<(), String> {
    let file = std::fs::File::create(path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), WIDTH, HEIGHT);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder
        .write_header()
        .and_then(|mut writer| writer.write_image_data(rgb))
        .map_err(|e| format!("writing {}: {e}", path.display()))
}
