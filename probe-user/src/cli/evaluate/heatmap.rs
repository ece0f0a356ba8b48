//! The evaluation's heatmap (LatencyPrism Figure 6): one row per trial, one column per decode
//! iteration around the injection start, coloured by the moving mean of the prediction
//! error; the injection start is the vertical line, trials are grouped by scenario.

use std::path::Path;

use anomaly_suite::score::{self, Iteration};
use anyhow::{Context, Result};
use plotters::prelude::*;

/// Pixels per cell.
const CELL_W: u32 = 6;
const CELL_H: u32 = 6;
/// Room for the scenario names.
const LEFT: u32 = 170;
const TOP: u32 = 40;
/// A font for the labels, if the host has one (the picture is drawn without labels if not).
const FONTS: [&str; 2] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// Rows of moving-mean values.
pub struct Heatmap {
    rows: Vec<(String, Vec<Option<f64>>)>,
    before: usize,
}

impl Heatmap {
    /// For each (scenario, injection start µs): the moving mean of E over `window` at the
    /// `before` iterations before and `after` iterations from the first iteration starting
    /// at or after the injection.
    pub fn from_trials<'a>(
        stream: &[Iteration],
        trials: impl Iterator<Item = (&'a str, f64)>,
        before: usize,
        after: usize,
        window: usize,
    ) -> Heatmap {
        let mean = score::moving_mean(stream, window);
        let rows = trials
            .map(|(name, at)| {
                let first = stream.partition_point(|it| it.start_us < at);
                let cells = (0..before + after)
                    .map(|k| {
                        (first + k)
                            .checked_sub(before)
                            .and_then(|i| mean.get(i).copied())
                    })
                    .collect();
                (name.to_string(), cells)
            })
            .collect();
        Heatmap { rows, before }
    }

    /// Writes the PNG; values are coloured from 0 (white) through the UCL (yellow) to twice
    /// the UCL and more (dark red).
    pub fn write_png(&self, path: &Path, ucl: f64) -> Result<()> {
        let cols = self.rows.first().map_or(0, |r| r.1.len()) as u32;
        let (w, h) = (
            LEFT + cols * CELL_W + 20,
            TOP + self.rows.len() as u32 * CELL_H + 20,
        );
        let labels = FONTS
            .iter()
            .find_map(|f| std::fs::read(f).ok())
            .is_some_and(|bytes| {
                plotters::style::register_font(
                    "sans-serif",
                    plotters::style::FontStyle::Normal,
                    Box::leak(bytes.into_boxed_slice()),
                )
                .is_ok()
            });
        let root = BitMapBackend::new(path, (w, h)).into_drawing_area();
        let draw = || -> std::result::Result<(), Box<dyn std::error::Error>> {
            root.fill(&WHITE)?;
            for (r, (name, cells)) in self.rows.iter().enumerate() {
                let y = TOP + r as u32 * CELL_H;
                for (c, v) in cells.iter().enumerate() {
                    let x = LEFT + c as u32 * CELL_W;
                    let colour = v.map_or(RGBColor(230, 230, 230), |v| shade(v, ucl));
                    root.draw(&Rectangle::new(
                        [
                            (x as i32, y as i32),
                            ((x + CELL_W) as i32, (y + CELL_H) as i32),
                        ],
                        colour.filled(),
                    ))?;
                }
                let first_of_group = r == 0 || self.rows[r - 1].0 != *name;
                if first_of_group {
                    root.draw(&PathElement::new(
                        vec![(LEFT as i32 - 5, y as i32), ((w - 20) as i32, y as i32)],
                        BLACK,
                    ))?;
                    if labels {
                        root.draw(&Text::new(
                            name.clone(),
                            (8, y as i32 + 2),
                            ("sans-serif", 13).into_font(),
                        ))?;
                    }
                }
            }
            let x0 = (LEFT + self.before as u32 * CELL_W) as i32;
            root.draw(&PathElement::new(
                vec![(x0, TOP as i32 - 6), (x0, (h - 20) as i32)],
                BLUE.stroke_width(2),
            ))?;
            if labels {
                root.draw(&Text::new(
                    format!(
                        "moving mean of E per decode iteration; injection starts at the blue line; yellow = UCL {ucl:.3}, dark red >= 2 x UCL; {} iterations before, {} from the start",
                        self.before,
                        self.rows.first().map_or(0, |r| r.1.len()) - self.before
                    ),
                    (8, 12),
                    ("sans-serif", 13).into_font(),
                ))?;
            }
            root.present()?;
            Ok(())
        };
        draw()
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("drawing {}", path.display()))
    }
}

/// White → yellow at the UCL → dark red at twice the UCL.
fn shade(v: f64, ucl: f64) -> RGBColor {
    let t = (v / (2.0 * ucl.max(1e-6))).clamp(0.0, 1.0);
    let lerp = |a: f64, b: f64, x: f64| (a + (b - a) * x) as u8;
    if t < 0.5 {
        let x = t * 2.0;
        RGBColor(255, 255, lerp(255.0, 60.0, x))
    } else {
        let x = (t - 0.5) * 2.0;
        RGBColor(
            lerp(255.0, 140.0, x),
            lerp(255.0, 0.0, x),
            lerp(60.0, 0.0, x),
        )
    }
}
