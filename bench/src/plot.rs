//! Small dependency-free SVG charts of a replay run.
//!
//! Contract: `replay_plots(report)` returns `(file name, SVG text)` for three charts: latency vs
//! prompt tokens, cache hit % per turn, and cumulative completion time per turn. Axes are
//! linear from 0 to the data maximum; turns without data are left out.

use crate::replay::{ReplayReport, TurnStatus};

const W: f64 = 640.0;
const H: f64 = 400.0;
const PAD: f64 = 60.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Points,
    Line,
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// One chart of `(x, y)` points.
pub fn chart(title: &str, x_label: &str, y_label: &str, pts: &[(f64, f64)], kind: Kind) -> String {
    let max = |f: fn(&(f64, f64)) -> f64| pts.iter().map(f).filter(|v| v.is_finite()).fold(0.0, f64::max);
    let (xmax, ymax) = (max(|p| p.0).max(1e-9), max(|p| p.1).max(1e-9));
    let sx = |x: f64| PAD + x / xmax * (W - 2.0 * PAD);
    let sy = |y: f64| H - PAD - y / ymax * (H - 2.0 * PAD);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">{}</text>\n\
         <line x1=\"{PAD}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n\
         <line x1=\"{PAD}\" y1=\"{PAD}\" x2=\"{PAD}\" y2=\"{}\" stroke=\"black\"/>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n\
         <text x=\"15\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 15 {})\">{}</text>\n",
        W / 2.0,
        escape(title),
        H - PAD,
        W - PAD,
        H - PAD,
        H - PAD,
        W / 2.0,
        H - 15.0,
        escape(x_label),
        H / 2.0,
        H / 2.0,
        escape(y_label),
    );
    for i in 0..=4 {
        let f = f64::from(i) / 4.0;
        s.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{:.4}</text>\n<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{:.4}</text>\n",
            sx(f * xmax),
            H - PAD + 15.0,
            trim(f * xmax),
            PAD - 5.0,
            sy(f * ymax) + 4.0,
            trim(f * ymax),
        ));
    }
    match kind {
        Kind::Points => {
            for (x, y) in pts {
                s.push_str(&format!(
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"steelblue\"/>\n",
                    sx(*x),
                    sy(*y)
                ));
            }
        }
        Kind::Line => {
            let path: Vec<String> = pts.iter().map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y))).collect();
            s.push_str(&format!(
                "<polyline fill=\"none\" stroke=\"steelblue\" stroke-width=\"2\" points=\"{}\"/>\n",
                path.join(" ")
            ));
        }
    }
    s.push_str("</svg>\n");
    s
}

/// Tick labels: whole numbers when large, else 2 decimals (formatted by `{:.4}` above).
fn trim(v: f64) -> f64 {
    if v >= 100.0 { v.round() } else { (v * 100.0).round() / 100.0 }
}

/// One chart's data and labels, shared by the SVG writer here and the PNG writer in
/// [`crate::png`].
#[derive(Debug, Clone)]
pub struct Series {
    /// File stem, e.g. `latency-vs-prompt`.
    pub name: &'static str,
    pub title: &'static str,
    pub x_label: &'static str,
    pub y_label: &'static str,
    pub kind: Kind,
    pub pts: Vec<(f64, f64)>,
}

/// The three replay charts: latency vs prompt tokens, cache hit % per turn, cumulative time.
pub fn replay_series(r: &ReplayReport) -> Vec<Series> {
    let ok: Vec<_> = r.turns.iter().filter(|t| t.status == TurnStatus::Ok).collect();
    let prompt = |t: &crate::replay::TurnRecord| t.reply.as_ref()?.usage.as_ref()?.prompt_tokens;
    let lat: Vec<(f64, f64)> = ok
        .iter()
        .filter_map(|t| Some((prompt(t).unwrap_or(t.est_prompt_tokens as u64) as f64, t.latency_ms?)))
        .collect();
    let hit: Vec<(f64, f64)> = ok
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let u = t.reply.as_ref()?.usage.as_ref()?;
            let p = u.prompt_tokens.filter(|p| *p > 0)?;
            Some(((i + 1) as f64, 100.0 * u.cached_tokens.unwrap_or(0) as f64 / p as f64))
        })
        .collect();
    let cum: Vec<(f64, f64)> =
        ok.iter().enumerate().filter_map(|(i, t)| Some(((i + 1) as f64, t.times?.done_s))).collect();
    vec![
        Series {
            name: "latency-vs-prompt",
            title: "Latency vs prompt length",
            x_label: "prompt tokens",
            y_label: "latency (ms)",
            kind: Kind::Points,
            pts: lat,
        },
        Series {
            name: "cache-hit",
            title: "Prompt tokens from cache per turn",
            x_label: "turn",
            y_label: "cache hit %",
            kind: Kind::Line,
            pts: hit,
        },
        Series {
            name: "cumulative-time",
            title: "Cumulative time",
            x_label: "turn",
            y_label: "seconds since start",
            kind: Kind::Line,
            pts: cum,
        },
    ]
}

/// `(file name, SVG text)` for each chart of [`replay_series`].
pub fn replay_plots(r: &ReplayReport) -> Vec<(String, String)> {
    replay_series(r)
        .into_iter()
        .map(|s| (format!("{}.svg", s.name), chart(s.title, s.x_label, s.y_label, &s.pts, s.kind)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_scales_points_into_the_frame() {
        let svg = chart("t <x>", "x", "y", &[(0.0, 0.0), (10.0, 5.0)], Kind::Points);
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("t &lt;x&gt;"));
        // (0,0) at the bottom-left corner, (10,5) at the top-right.
        assert!(svg.contains(&format!("cx=\"{PAD:.1}\" cy=\"{:.1}\"", H - PAD)));
        assert!(svg.contains(&format!("cx=\"{:.1}\" cy=\"{PAD:.1}\"", W - PAD)));
        let line = chart("l", "x", "y", &[(1.0, 1.0), (2.0, 2.0)], Kind::Line);
        assert!(line.contains("<polyline"));
        assert!(chart("empty", "x", "y", &[], Kind::Line).contains("</svg>"));
    }
}
