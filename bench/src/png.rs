//! PNG rendering of the replay charts with `plotters` (bitmap backend, no system font lookup).
//!
//! Contract: `write_png(path, series)` draws one [`Series`] as an 800x500 PNG with linear axes
//! from 0 to the data maximum. Text (title, axis names, tick labels) needs a TrueType font:
//! `$EDGE_BENCH_FONT`, else the first of a few common system paths; with none found the chart
//! is drawn without text and the Markdown summary carries the legend. Errors are returned,
//! never panicked.

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;

use crate::plot::{Kind, Series};

const FONT: &str = "sans-serif";
const FONT_PATHS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

#[derive(Debug, thiserror::Error)]
pub enum PngError {
    #[error("drawing {path}: {msg}")]
    Draw { path: String, msg: String },
}

/// Registers a font once per process; false when none could be loaded (draw without text).
pub fn font_available() -> bool {
    static LOADED: OnceLock<bool> = OnceLock::new();
    *LOADED.get_or_init(|| {
        let env = std::env::var("EDGE_BENCH_FONT").ok();
        for p in env.iter().map(String::as_str).chain(FONT_PATHS) {
            let Ok(bytes) = std::fs::read(p) else { continue };
            // plotters keeps the font for the whole process, so it must be 'static.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font(FONT, FontStyle::Normal, bytes).is_ok() {
                tracing::debug!(font = p, "PNG charts use this font");
                return true;
            }
        }
        tracing::warn!("no TrueType font found (set EDGE_BENCH_FONT); PNG charts are drawn without text");
        false
    })
}

/// Tick labels: whole numbers for whole or large values (turn numbers, ms), else 1 decimal.
fn tick(v: &f64) -> String {
    if v.fract() == 0.0 || v.abs() >= 10.0 { format!("{v:.0}") } else { format!("{v:.1}") }
}

/// Draws `s` into a PNG file at `path`.
pub fn write_png(path: &Path, s: &Series) -> Result<(), PngError> {
    let err = |e: &dyn std::fmt::Display| PngError::Draw { path: path.display().to_string(), msg: e.to_string() };
    let text = font_available();
    let max = |f: fn(&(f64, f64)) -> f64| s.pts.iter().map(f).filter(|v| v.is_finite()).fold(0.0, f64::max);
    // A little headroom so the top point is not drawn on the frame.
    let (xmax, ymax) = (max(|p| p.0).max(1e-9) * 1.05, max(|p| p.1).max(1e-9) * 1.05);

    let root = BitMapBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(20).x_label_area_size(45).y_label_area_size(70);
    if text {
        builder.caption(s.title, (FONT, 22));
    }
    let mut chart = builder.build_cartesian_2d(0f64..xmax, 0f64..ymax).map_err(|e| err(&e))?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc(s.x_label)
            .y_desc(s.y_label)
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 16))
            .x_label_formatter(&tick)
            .y_label_formatter(&tick);
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw().map_err(|e| err(&e))?;
    let color = RGBColor(70, 130, 180);
    match s.kind {
        Kind::Points => {
            chart.draw_series(s.pts.iter().map(|p| Circle::new(*p, 4, color.filled()))).map_err(|e| err(&e))?;
        }
        Kind::Line => {
            chart.draw_series(LineSeries::new(s.pts.iter().copied(), color.stroke_width(2))).map_err(|e| err(&e))?;
            chart.draw_series(s.pts.iter().map(|p| Circle::new(*p, 3, color.filled()))).map_err(|e| err(&e))?;
        }
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(kind: Kind, pts: Vec<(f64, f64)>) -> Series {
        Series { name: "t", title: "Test", x_label: "x", y_label: "y", kind, pts }
    }

    #[test]
    fn writes_a_png_for_points_lines_and_empty_data() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (i, s) in [
            series(Kind::Points, vec![(100.0, 5.0), (2000.0, 40.0)]),
            series(Kind::Line, vec![(1.0, 0.0), (2.0, 90.0), (3.0, 95.0)]),
            series(Kind::Line, vec![]),
        ]
        .iter()
        .enumerate()
        {
            let p = dir.path().join(format!("{i}.png"));
            write_png(&p, s).expect("png");
            let bytes = std::fs::read(&p).expect("read");
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
            assert!(bytes.len() > 1000, "a real image, not an empty file");
        }
    }

    #[test]
    fn tick_labels() {
        assert_eq!(tick(&3.0), "3");
        assert_eq!(tick(&1500.4), "1500");
        assert_eq!(tick(&2.26), "2.3");
    }

    #[test]
    fn unwritable_path_is_an_error_not_a_panic() {
        let s = series(Kind::Points, vec![(1.0, 1.0)]);
        assert!(write_png(Path::new("/nonexistent-dir/x/y.png"), &s).is_err());
    }
}
