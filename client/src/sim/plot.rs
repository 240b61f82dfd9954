//! SVG line charts with plotters (SVG backend only, no system fonts needed), rendered to a
//! string so the output is byte-for-byte reproducible and can be compared with the committed file.

use plotters::prelude::*;

use crate::Error;

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// (x, y) points, in x order.
    pub points: Vec<(f64, f64)>,
}

/// A chart to draw.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// Title above the plot.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// Plot log10(y) (for series spanning orders of magnitude); ticks still show y.
    pub log_y: bool,
    /// The lines.
    pub series: Vec<Series>,
}

const PALETTE: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x33, 0x33, 0x33),
];

/// Renders `chart` as an SVG document.
pub fn render(chart: &Chart) -> Result<String, Error> {
    let err = |e: &dyn std::fmt::Display| Error::Plot {
        what: chart.title.clone(),
        message: e.to_string(),
    };
    let ty = |y: f64| if chart.log_y { y.max(1e-9).log10() } else { y };
    let xs = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0));
    let ys = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| ty(p.1)));
    let (x0, x1) = bounds(xs);
    let (mut y0, y1) = bounds(ys);
    if !chart.log_y {
        y0 = y0.min(0.0);
    }
    let pad = (y1 - y0).abs().max(1e-9) * 0.05;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (820, 500)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut ctx = ChartBuilder::on(&root)
            .caption(&chart.title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(
                x0..x1,
                (y0 - if chart.log_y { pad } else { 0.0 })..(y1 + pad),
            )
            .map_err(|e| err(&e))?;
        let log_y = chart.log_y;
        ctx.configure_mesh()
            .x_desc(chart.x_label.as_str())
            .y_desc(chart.y_label.as_str())
            .y_label_formatter(&move |v: &f64| {
                if log_y {
                    short(10f64.powf(*v))
                } else {
                    format!("{v:.0}")
                }
            })
            .x_label_formatter(&|v: &f64| format!("{v:.0}"))
            .draw()
            .map_err(|e| err(&e))?;
        for (i, s) in chart.series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let points: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (x, ty(y))).collect();
            ctx.draw_series(LineSeries::new(points, color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(s.label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        ctx.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    svg.push('\n');
    Ok(svg)
}

/// Two significant digits, with a k suffix from 1000: tick labels of a log axis.
fn short(v: f64) -> String {
    if v >= 1000.0 {
        let k = v / 1000.0;
        if k >= 10.0 {
            format!("{k:.0}k")
        } else {
            format!("{k:.1}k")
        }
    } else if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if lo.is_finite() && hi.is_finite() && hi > lo {
        (lo, hi)
    } else if lo.is_finite() {
        (lo - 1.0, lo + 1.0)
    } else {
        (0.0, 1.0)
    }
}
