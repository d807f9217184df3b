//! Charts as SVG and PNG: latency CDF, latency over time, per-worker utilisation over time,
//! latency against load for a strategy comparison, and hit rate against cache size for the
//! capacity planner.
//!
//! SVG leaves text to the viewer. PNG is drawn into memory by plotters' bitmap backend and
//! encoded with `png`; its text is drawn with a built-in 8×8 bitmap font ([`TextBitmap`]), so
//! no font file is needed anywhere (plotters' own text path would need system fonts).

use std::path::{Path, PathBuf};

use hdrhistogram::Histogram;
use plotters::coord::{CoordTranslate, Shift};
use plotters::prelude::*;

use crate::monitor::Utilisation;
use crate::summary::Window;
use crate::text_bitmap::TextBitmap;

const SIZE: (u32, u32) = (1000, 620);

/// Distinguishable line colours, cycled.
pub const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

pub fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Something drawable on any plotters backend.
pub trait Chart {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String>;
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Writes `<stem>.svg` and `<stem>.png`; returns both paths.
pub fn save<C: Chart>(chart: &C, stem: &Path) -> Result<Vec<PathBuf>, String> {
    let svg = stem.with_extension("svg");
    let png = stem.with_extension("png");
    {
        let root = SVGBackend::new(&svg, SIZE).into_drawing_area();
        chart.draw(&root)?;
        root.present().map_err(err)?;
    }
    let (w, h) = SIZE;
    let mut buf = vec![255u8; (w * h * 3) as usize];
    {
        let root = TextBitmap(BitMapBackend::with_buffer(&mut buf, SIZE)).into_drawing_area();
        chart.draw(&root)?;
        root.present().map_err(err)?;
    }
    write_png(&png, &buf, SIZE).map_err(|e| format!("{}: {e}", png.display()))?;
    Ok(vec![svg, png])
}

fn write_png(path: &Path, rgb: &[u8], (w, h): (u32, u32)) -> Result<(), String> {
    let file = std::fs::File::create(path).map_err(err)?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header().map_err(err)?;
    writer.write_image_data(rgb).map_err(err)?;
    writer.finish().map_err(err)
}

// ---------------------------------------------------------------------------------------------
// Charts

/// The series legend every chart draws: boxed, on a translucent white background.
fn draw_legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    at: SeriesLabelPosition,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(at)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)
}

/// Latency CDF of one or more runs: x = latency (log scale), y = cumulative fraction on a
/// "nines" scale (0, 90%, 99%, 99.9%, 99.99%), so the tail is readable.
pub struct CdfChart<'a> {
    pub title: String,
    pub series: Vec<(String, &'a Histogram<u64>)>,
}

fn nines_label(y: f64) -> String {
    if y <= 0.0 {
        return "0%".into();
    }
    let p = 100.0 * (1.0 - 10f64.powf(-y));
    let digits = (y - 2.0).ceil().max(0.0) as usize;
    format!("{p:.digits$}%")
}

impl Chart for CdfChart<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        root.fill(&WHITE).map_err(err)?;
        let curves: Vec<(String, Vec<(f64, f64)>)> = self
            .series
            .iter()
            .filter(|(_, h)| !h.is_empty())
            .map(|(name, h)| {
                let n = h.len() as f64;
                // Up to the last quantile the sample count supports.
                let top = (n.log10()).min(4.0);
                let pts = (0..=400)
                    .map(|i| top * i as f64 / 400.0)
                    .map(|y| {
                        let q = 1.0 - 10f64.powf(-y);
                        ((h.value_at_quantile(q) as f64 / 1e3).max(0.01), y)
                    })
                    .collect();
                (name.clone(), pts)
            })
            .collect();
        let xmin = curves.iter().flat_map(|c| c.1.iter().map(|p| p.0)).fold(f64::INFINITY, f64::min);
        let xmax = curves.iter().flat_map(|c| c.1.iter().map(|p| p.0)).fold(0.0, f64::max);
        let (xmin, xmax) = if xmin.is_finite() && xmax > xmin { (xmin * 0.8, xmax * 1.25) } else { (1.0, 1000.0) };
        let ymax = curves.iter().flat_map(|c| c.1.iter().map(|p| p.1)).fold(2.0, f64::max).ceil();
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 24))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(76)
            .build_cartesian_2d((xmin..xmax).log_scale(), 0f64..ymax)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("latency (ms)")
            .y_desc("requests answered (cumulative)")
            .y_labels(ymax as usize + 1)
            .y_label_formatter(&|y| nines_label(*y))
            .x_label_formatter(&|x| format_ms(*x))
            .draw()
            .map_err(err)?;
        for (i, (name, pts)) in curves.into_iter().enumerate() {
            let c = color(i);
            chart
                .draw_series(LineSeries::new(pts, c.stroke_width(2)))
                .map_err(err)?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)
    }
}

fn format_ms(x: f64) -> String {
    if x >= 10.0 {
        format!("{x:.0}")
    } else if x >= 1.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// Latency over time: p50, p99 and max per window by send time; windows with errors marked.
pub struct TimelineChart<'a> {
    pub title: String,
    pub windows: &'a [Window],
    pub window_s: f64,
    /// Shaded spans (start_s, end_s, label): faults, bursts.
    pub marks: Vec<(f64, f64, String)>,
}

impl Chart for TimelineChart<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        root.fill(&WHITE).map_err(err)?;
        let tmax = self.windows.last().map_or(1.0, |w| w.t_s + self.window_s);
        let ymax = self.windows.iter().map(|w| w.max_ms).fold(1.0, f64::max) * 1.1;
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 24))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(76)
            .build_cartesian_2d(0f64..tmax, 0f64..ymax)
            .map_err(err)?;
        chart.configure_mesh().x_desc("time (s)").y_desc("latency (ms)").draw().map_err(err)?;
        for (start, end, label) in &self.marks {
            let shade = RGBColor(255, 200, 120).mix(0.35);
            chart
                .draw_series(std::iter::once(Rectangle::new([(*start, 0.0), (*end, ymax)], shade.filled())))
                .map_err(err)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    label.clone(),
                    (*start, ymax * 0.97),
                    ("sans-serif", 14).into_font(),
                )))
                .map_err(err)?;
        }
        let mid = |w: &Window| w.t_s + self.window_s / 2.0;
        let answered: Vec<&Window> = self.windows.iter().filter(|w| w.sent > w.errors).collect();
        for (i, (name, f)) in
            [("p50", (|w: &Window| w.p50_ms) as fn(&Window) -> f64), ("p99", |w| w.p99_ms), ("max", |w| w.max_ms)]
                .into_iter()
                .enumerate()
        {
            let c = color(i);
            chart
                .draw_series(LineSeries::new(answered.iter().map(|w| (mid(w), f(w))), c.stroke_width(2)))
                .map_err(err)?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        }
        let red = RGBColor(214, 39, 40);
        chart
            .draw_series(
                self.windows
                    .iter()
                    .filter(|w| w.errors + w.partial > 0)
                    .map(|w| TriangleMarker::new((mid(w), ymax * 0.02), 6, red.filled())),
            )
            .map_err(err)?
            .label("errors or partial answers")
            .legend(move |(x, y)| TriangleMarker::new((x + 10, y), 6, red.filled()));
        draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)
    }
}

/// Per-worker utilisation over time: a thin line per worker, the mean in black.
pub struct UtilisationChart<'a> {
    pub title: String,
    pub util: &'a Utilisation,
    pub names: Vec<String>,
}

impl Chart for UtilisationChart<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        root.fill(&WHITE).map_err(err)?;
        let u = self.util;
        let tmax = u.t_s.last().copied().unwrap_or(1.0).max(1e-3);
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 24))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(76)
            .build_cartesian_2d(0f64..tmax, 0f64..105f64)
            .map_err(err)?;
        chart.configure_mesh().x_desc("time (s)").y_desc("worker busy (%)").draw().map_err(err)?;
        let many = u.series.len() > 8;
        for (w, s) in u.series.iter().enumerate() {
            let c = color(w);
            let pts: Vec<(f64, f64)> =
                u.t_s.iter().zip(s).filter(|(_, v)| v.is_finite()).map(|(t, v)| (*t, v * 100.0)).collect();
            let series = chart
                .draw_series(LineSeries::new(pts, c.mix(if many { 0.45 } else { 0.9 }).stroke_width(1)))
                .map_err(err)?;
            if !many {
                let name = self.names.get(w).cloned().unwrap_or_else(|| format!("worker {w}"));
                series.label(name).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
            }
        }
        let mean: Vec<(f64, f64)> = u
            .t_s
            .iter()
            .enumerate()
            .filter_map(|(i, t)| {
                let vals: Vec<f64> =
                    u.series.iter().filter_map(|s| s.get(i).copied()).filter(|v| v.is_finite()).collect();
                (!vals.is_empty()).then(|| (*t, 100.0 * vals.iter().sum::<f64>() / vals.len() as f64))
            })
            .collect();
        chart
            .draw_series(LineSeries::new(mean, BLACK.stroke_width(3)))
            .map_err(err)?
            .label(format!("mean of {} workers", u.series.len()))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(3)));
        draw_legend(&mut chart, SeriesLabelPosition::LowerRight)
    }
}

/// A latency figure against offered load, one line per strategy.
pub struct LoadChart {
    pub title: String,
    pub y_desc: String,
    /// (strategy, [(load %, latency ms)]).
    pub series: Vec<(String, Vec<(f64, f64)>)>,
}

impl Chart for LoadChart {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        root.fill(&WHITE).map_err(err)?;
        let all = || self.series.iter().flat_map(|s| s.1.iter());
        let xmin = all().map(|p| p.0).fold(f64::INFINITY, f64::min);
        let xmax = all().map(|p| p.0).fold(0.0, f64::max);
        let (xmin, xmax) = if xmin < xmax { (xmin - 5.0, xmax + 5.0) } else { (0.0, 100.0) };
        let ymin = all().map(|p| p.1).filter(|v| *v > 0.0).fold(f64::INFINITY, f64::min);
        let ymax = all().map(|p| p.1).fold(0.0, f64::max);
        let (ymin, ymax) = if ymin.is_finite() && ymax > ymin { (ymin * 0.7, ymax * 1.4) } else { (1.0, 1000.0) };
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 24))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(76)
            .build_cartesian_2d(xmin..xmax, (ymin..ymax).log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("offered load (% of cluster capacity)")
            .y_desc(self.y_desc.clone())
            .y_label_formatter(&|y| format_ms(*y))
            .draw()
            .map_err(err)?;
        for (i, (name, pts)) in self.series.iter().enumerate() {
            let c = color(i);
            let pts: Vec<(f64, f64)> = pts.iter().copied().filter(|p| p.1 > 0.0).collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
                .map_err(err)?
                .label(name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
            chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 4, c.filled()))).map_err(err)?;
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)
    }
}

/// A fraction (y, 0-100%) against a size (x, log scale), one line per series: the planner's
/// cache hit-rate curves.
pub struct CurveChart {
    pub title: String,
    pub x_desc: String,
    pub y_desc: String,
    /// (series, [(size, fraction in 0..=1)]).
    pub series: Vec<(String, Vec<(f64, f64)>)>,
}

impl Chart for CurveChart {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        root.fill(&WHITE).map_err(err)?;
        let xs = || self.series.iter().flat_map(|s| s.1.iter().map(|p| p.0)).filter(|x| *x > 0.0);
        let xmin = xs().fold(f64::INFINITY, f64::min);
        let xmax = xs().fold(0.0, f64::max);
        let (xmin, xmax) = if xmin.is_finite() && xmax > xmin { (xmin / 1.5, xmax * 1.5) } else { (1.0, 1e6) };
        let ymax = self.series.iter().flat_map(|s| s.1.iter().map(|p| p.1 * 100.0)).fold(0.0, f64::max);
        let ymax = if ymax > 0.0 { (ymax * 1.2).min(100.0) } else { 100.0 };
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, ("sans-serif", 24))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(76)
            .build_cartesian_2d((xmin..xmax).log_scale(), 0.0..ymax)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(self.x_desc.clone())
            .y_desc(self.y_desc.clone())
            .x_label_formatter(&|x| format!("{}", x.round()))
            .y_label_formatter(&|y| format!("{y:.0}%"))
            .draw()
            .map_err(err)?;
        for (i, (name, pts)) in self.series.iter().enumerate() {
            let c = color(i);
            let pts: Vec<(f64, f64)> = pts.iter().filter(|p| p.0 > 0.0).map(|p| (p.0, p.1 * 100.0)).collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
                .map_err(err)?
                .label(name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
            chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 4, c.filled()))).map_err(err)?;
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::new_histogram;

    #[test]
    fn nines_axis_labels() {
        assert_eq!(nines_label(0.0), "0%");
        assert_eq!(nines_label(1.0), "90%");
        assert_eq!(nines_label(2.0), "99%");
        assert_eq!(nines_label(3.0), "99.9%");
        assert_eq!(nines_label(4.0), "99.99%");
    }

    #[test]
    fn charts_render_to_svg_and_png_without_font_files() {
        let dir = std::env::temp_dir().join(format!("sieve-plot-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut h = new_histogram();
        for i in 1..=1000u64 {
            h.record(i * 100).unwrap();
        }
        let files = save(&CdfChart { title: "CDF".into(), series: vec![("a".into(), &h)] }, &dir.join("cdf")).unwrap();
        let svg = std::fs::read_to_string(&files[0]).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("latency (ms)"), "{}", &svg[..200.min(svg.len())]);
        let png = std::fs::read(&files[1]).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        // The PNG has text: decode it and find dark pixels in the caption band.
        let decoder = png::Decoder::new(std::io::Cursor::new(png));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        let row = |y: usize| &buf[y * info.line_size..(y + 1) * info.line_size];
        let dark_in_caption = (10..40).any(|y| row(y).chunks(3).any(|p| p[0] < 100 && p[1] < 100 && p[2] < 100));
        assert!(dark_in_caption, "the caption was drawn");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
