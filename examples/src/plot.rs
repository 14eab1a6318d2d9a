//! The training curves of a run as a PNG: training loss (with evaluation losses as dots)
//! and learning rate against the optimizer step, read from `log_history` (the entries of
//! `trainer_state.json`). Two panels sharing the step axis, each with its ticks, tick
//! labels, title and legend, drawn on an [`RgbImage`].
//!
//! ```no_run
//! use tchtrain_callbacks::TrainerState;
//! let state = TrainerState::load_from_json("out/trainer_state.json")?;
//! tchtrain_examples::plot_log_history(&state.log_history, "my run", "out/loss_lr.png")?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::Path;

use tchtrain_callbacks::JsonMap;

use crate::error::{Error, Result};
use crate::raster::{Rgb, RgbImage};

/// Size of the plot written by [`plot_log_history`].
pub const PLOT_WIDTH: u32 = 960;
/// Height of the plot written by [`plot_log_history`].
pub const PLOT_HEIGHT: u32 = 720;

const WHITE: Rgb = [255, 255, 255];
const BLACK: Rgb = [20, 20, 20];
const GRID: Rgb = [225, 225, 225];
const BLUE: Rgb = [31, 119, 180];
const ORANGE: Rgb = [230, 110, 10];
const GREEN: Rgb = [44, 160, 44];

/// The (step, value) points of `key` in `log_history`, in log order.
pub fn log_history_series(log_history: &[JsonMap], key: &str) -> Vec<(f64, f64)> {
    log_history
        .iter()
        .filter_map(|e| {
            let step = e.get("step")?.as_f64()?;
            let v = e.get(key)?.as_f64()?;
            v.is_finite().then_some((step, v))
        })
        .collect()
}

/// About five round tick values (1, 2 or 5 times a power of ten apart) covering `lo..=hi`,
/// and their spacing.
fn ticks(lo: f64, hi: f64) -> (Vec<f64>, f64) {
    let span = (hi - lo).max(f64::MIN_POSITIVE);
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| span / s <= 7.0)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    let values = (first..=last).map(|k| k as f64 * step).collect();
    (values, step)
}

/// A tick label: plain decimals with as many digits as the spacing needs, scientific
/// notation (`5E-5`) for small or large values.
fn tick_label(v: f64, step: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    if step >= 1e-3 && v.abs() < 1e6 {
        let decimals = (-step.log10().floor()).max(0.0) as usize;
        format!("{v:.decimals$}")
    } else {
        let s = format!("{v:.1e}");
        s.replace(".0e", "e").to_uppercase()
    }
}

/// One panel: a frame at (`x`, `y`), `w` x `h` pixels, with data ranges.
struct Panel {
    x: i64,
    y: i64,
    w: i64,
    h: i64,
    steps: (f64, f64),
    values: (f64, f64),
}

impl Panel {
    fn px(&self, step: f64) -> i64 {
        let (a, b) = self.steps;
        self.x + ((step - a) / (b - a) * self.w as f64).round() as i64
    }

    fn py(&self, v: f64) -> i64 {
        let (a, b) = self.values;
        self.y + self.h - ((v - a) / (b - a) * self.h as f64).round() as i64
    }

    /// Grid, frame, tick marks and labels, the title above the frame, step labels below
    /// when `step_labels`.
    fn axes(&self, img: &mut RgbImage, title: &str, step_labels: bool) {
        let (yt, ys) = ticks(self.values.0, self.values.1);
        for v in &yt {
            let y = self.py(*v);
            img.line((self.x, y), (self.x + self.w, y), 1, GRID);
            img.line((self.x - 6, y), (self.x, y), 2, BLACK);
            let label = tick_label(*v, ys);
            let tw = RgbImage::text_width(&label, 2);
            img.text(self.x - 12 - tw, y - 7, &label, 2, BLACK);
        }
        let (xt, xs) = ticks(self.steps.0, self.steps.1);
        for s in &xt {
            let x = self.px(*s);
            img.line((x, self.y), (x, self.y + self.h), 1, GRID);
            img.line((x, self.y + self.h), (x, self.y + self.h + 6), 2, BLACK);
            if step_labels {
                let label = tick_label(*s, xs.max(1.0));
                let tw = RgbImage::text_width(&label, 2);
                img.text(x - tw / 2, self.y + self.h + 12, &label, 2, BLACK);
            }
        }
        let (x0, y0, x1, y1) = (self.x, self.y, self.x + self.w, self.y + self.h);
        for (a, b) in [
            ((x0, y0), (x1, y0)),
            ((x1, y0), (x1, y1)),
            ((x1, y1), (x0, y1)),
            ((x0, y1), (x0, y0)),
        ] {
            img.line(a, b, 2, BLACK);
        }
        img.text(self.x, self.y - 24, title, 2, BLACK);
    }

    fn polyline(&self, img: &mut RgbImage, points: &[(f64, f64)], color: Rgb) {
        for w in points.windows(2) {
            let a = (self.px(w[0].0), self.py(w[0].1));
            let b = (self.px(w[1].0), self.py(w[1].1));
            img.line(a, b, 3, color);
        }
        if let [p] = points {
            img.fill_rect(self.px(p.0) - 3, self.py(p.1) - 3, 7, 7, color);
        }
    }

    fn dots(&self, img: &mut RgbImage, points: &[(f64, f64)], color: Rgb) {
        for p in points {
            img.fill_rect(self.px(p.0) - 5, self.py(p.1) - 5, 11, 11, color);
        }
    }

    /// Legend entries, right-aligned above the frame.
    fn legend(&self, img: &mut RgbImage, entries: &[(&str, Rgb)]) {
        let mut right = self.x + self.w;
        for (label, color) in entries.iter().rev() {
            let tw = RgbImage::text_width(label, 2);
            img.text(right - tw, self.y - 24, label, 2, BLACK);
            img.fill_rect(right - tw - 30, self.y - 21, 22, 8, *color);
            right -= tw + 50;
        }
    }
}

/// A value range with a margin, never empty.
fn padded(values: impl Iterator<Item = f64>, from_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
        (a.min(v), b.max(v))
    });
    if from_zero {
        lo = lo.min(0.0);
    }
    if hi - lo <= f64::EPSILON * hi.abs().max(1.0) {
        let d = hi.abs().max(1e-12) * 0.1;
        lo -= d;
        hi += d;
    }
    let m = 0.06 * (hi - lo);
    (if from_zero && lo >= 0.0 { lo } else { lo - m }, hi + m)
}

/// Draws the training loss (line; `eval_loss` entries as dots) and the learning rate (line)
/// of `log_history` against the step, under `title`, as a [`PLOT_WIDTH`] x [`PLOT_HEIGHT`]
/// image. An [`Error::InvalidArgument`] when `log_history` has no `loss` entry.
pub fn render_log_history(log_history: &[JsonMap], title: &str) -> Result<RgbImage> {
    let loss = log_history_series(log_history, "loss");
    let eval_loss = log_history_series(log_history, "eval_loss");
    let lr = log_history_series(log_history, "learning_rate");
    if loss.is_empty() {
        return Err(Error::InvalidArgument {
            field: "log_history",
            detail: "no training `loss` entry to plot; log at least once (`logging_steps`)".into(),
        });
    }
    let all_steps = || loss.iter().chain(&eval_loss).chain(&lr).map(|p| p.0);
    let max_step = all_steps().fold(1.0f64, f64::max);
    let steps = (0.0, max_step);

    let mut img = RgbImage::new(PLOT_WIDTH, PLOT_HEIGHT, WHITE);
    let w = i64::from(PLOT_WIDTH);
    let tw = RgbImage::text_width(title, 3);
    img.text((w - tw) / 2, 16, title, 3, BLACK);

    let (left, right) = (130, 30);
    let top = Panel {
        x: left,
        y: 90,
        w: w - left - right,
        h: 300,
        steps,
        values: padded(loss.iter().chain(&eval_loss).map(|p| p.1), false),
    };
    top.axes(&mut img, "LOSS", false);
    top.polyline(&mut img, &loss, BLUE);
    top.dots(&mut img, &eval_loss, ORANGE);
    let mut entries = vec![("training loss", BLUE)];
    if !eval_loss.is_empty() {
        entries.push(("eval loss", ORANGE));
    }
    top.legend(&mut img, &entries);

    let bottom = Panel {
        x: left,
        y: 450,
        w: w - left - right,
        h: 200,
        steps,
        values: padded(lr.iter().map(|p| p.1), true),
    };
    bottom.axes(&mut img, "LEARNING RATE", true);
    bottom.polyline(&mut img, &lr, GREEN);
    bottom.legend(&mut img, &[("learning rate", GREEN)]);
    let label = "STEP";
    let lw = RgbImage::text_width(label, 2);
    img.text(
        bottom.x + (bottom.w - lw) / 2,
        bottom.y + bottom.h + 36,
        label,
        2,
        BLACK,
    );
    Ok(img)
}

/// Writes [`render_log_history`]'s plot of `log_history` to `path` as PNG.
pub fn plot_log_history(
    log_history: &[JsonMap],
    title: &str,
    path: impl AsRef<Path>,
) -> Result<()> {
    render_log_history(log_history, title)?.write_png(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_ticks_and_labels() {
        let (t, s) = ticks(0.0, 100.0);
        assert_eq!(s, 20.0);
        assert_eq!(t, vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        let (t, s) = ticks(0.41, 0.72);
        assert!((s - 0.05).abs() < 1e-12, "{s}");
        assert_eq!(tick_label(t[0], s), "0.45");
        assert_eq!(tick_label(5e-5, 1e-5), "5E-5");
        assert_eq!(tick_label(2.5e-5, 5e-6), "2.5E-5");
        assert_eq!(tick_label(0.0, 1e-5), "0");
    }
}
