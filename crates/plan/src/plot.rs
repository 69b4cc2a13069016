//! The frontier as a PNG: the settings on it in cost order along the bottom; their p99 (left
//! axis) and their hit ratio beside Belady's (right axis); the targets as dashed lines; the
//! cheapest setting that meets them ringed.
//!
//! plotters draws the lines and points into an RGB buffer. Its text needs a font backend whose
//! `ttf` feature links the system's fontconfig and freetype, which the first command must not
//! need, so the text is drawn with `ab_glyph` from a font compiled in (DejaVu Sans Mono,
//! `assets/`, under the Bitstream Vera licence), and `png` encodes the buffer.

use ab_glyph::{Font, FontRef, PxScale, ScaleFont};
use plotters::prelude::*;

use crate::search::{Search, Targets};

const FONT: &[u8] = include_bytes!("../assets/DejaVuSansMono.ttf");
const W: u32 = 1000;
const H: u32 = 560;
/// The plot area's edges in pixels: left, right, top, bottom.
const AREA: (i32, i32, i32, i32) = (80, 920, 70, 470);

const P99: RGBColor = RGBColor(31, 119, 180);
const HITS: RGBColor = RGBColor(44, 160, 44);
const BELADY: RGBColor = RGBColor(150, 150, 150);
const TARGET: RGBColor = RGBColor(214, 39, 40);
const INK: RGBColor = RGBColor(40, 40, 40);

/// Why the plot could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// Drawing failed.
    #[error("drawing the plot: {0}")]
    Draw(String),
    /// Encoding or writing the PNG failed.
    #[error("writing the PNG: {0}")]
    Write(String),
}

/// The frontier of `search` as PNG bytes.
pub fn frontier_png(search: &Search, targets: &Targets) -> Result<Vec<u8>, PlotError> {
    let mut rgb = vec![255u8; (W * H * 3) as usize];
    let points: Vec<&crate::Report> = search
        .frontier
        .iter()
        .map(|&i| &search.reports[i])
        .collect();
    let p99_top = points
        .iter()
        .map(|r| r.end_to_end_ms.p99)
        .chain(targets.p99_ms)
        .fold(1.0f64, f64::max)
        * 1.1;
    let (left, right, top, bottom) = AREA;
    let x = |i: usize| x_of(i, points.len());
    let y_ms = |ms: f64| bottom - ((ms / p99_top) * f64::from(bottom - top)) as i32;
    let y_ratio = |r: f64| bottom - (r.clamp(0.0, 1.0) * f64::from(bottom - top)) as i32;
    {
        let area = BitMapBackend::with_buffer(&mut rgb, (W, H)).into_drawing_area();
        let draw =
            |e: Result<(), DrawingAreaErrorKind<_>>| e.map_err(|e| PlotError::Draw(e.to_string()));
        draw(area.draw(&Rectangle::new(
            [(left, top), (right, bottom)],
            INK.stroke_width(1),
        )))?;
        for k in 1..5 {
            let y = top + k * (bottom - top) / 5;
            draw(area.draw(&PathElement::new(
                vec![(left, y), (right, y)],
                RGBColor(230, 230, 230),
            )))?;
        }
        if let Some(t) = targets.p99_ms {
            draw(dashed(&area, y_ms(t), TARGET))?;
        }
        if let Some(t) = targets.min_hit_ratio {
            draw(dashed(&area, y_ratio(t), HITS))?;
        }
        for (series, color, y) in [
            (
                0,
                P99,
                &(|r: &crate::Report| y_ms(r.end_to_end_ms.p99)) as &dyn Fn(&crate::Report) -> i32,
            ),
            (1, HITS, &|r: &crate::Report| y_ratio(r.hit_ratio)),
            (2, BELADY, &|r: &crate::Report| y_ratio(r.belady_hit_ratio)),
        ] {
            let line: Vec<(i32, i32)> = points
                .iter()
                .enumerate()
                .map(|(i, r)| (x(i), y(r)))
                .collect();
            draw(area.draw(&PathElement::new(line.clone(), color.stroke_width(2))))?;
            for (px, py) in line {
                let size = if series == 2 { 3 } else { 4 };
                draw(area.draw(&Circle::new((px, py), size, color.filled())))?;
            }
        }
        if let Some(c) = search.cheapest
            && let Some(i) = search.frontier.iter().position(|&f| f == c)
        {
            let r = &search.reports[c];
            draw(area.draw(&Circle::new(
                (x(i), y_ms(r.end_to_end_ms.p99)),
                9,
                TARGET.stroke_width(2),
            )))?;
        }
        area.present().map_err(|e| PlotError::Draw(e.to_string()))?;
    }
    labels(&mut rgb, search, &points, p99_top)?;
    encode(&rgb)
}

/// Where setting `i` of `n` sits along the bottom, in pixels.
fn x_of(i: usize, n: usize) -> i32 {
    let (left, right, _, _) = AREA;
    if n <= 1 {
        (left + right) / 2
    } else {
        left + 20 + (i as i32) * (right - left - 40) / (n as i32 - 1)
    }
}

/// The title, legend, axes' numbers and each setting's name.
fn labels(
    rgb: &mut [u8],
    search: &Search,
    points: &[&crate::Report],
    p99_top: f64,
) -> Result<(), PlotError> {
    let (left, right, top, bottom) = AREA;
    let x = |i: usize| x_of(i, points.len());
    let mut text = Text::new(rgb)?;
    text.put(
        left,
        30,
        18.0,
        INK,
        "modelmux plan: the frontier, cheapest setting first",
    );
    text.put(left, 52, 13.0, P99, "p99 end to end, ms (left)");
    text.put(left + 260, 52, 13.0, HITS, "hit ratio (right)");
    text.put(left + 430, 52, 13.0, BELADY, "Belady's optimum (right)");
    if search.cheapest.is_some() {
        text.put(
            left + 650,
            52,
            13.0,
            TARGET,
            "ringed: cheapest meeting the targets",
        );
    }
    for k in 0..=5 {
        let y = bottom - k * (bottom - top) / 5;
        let ms = p99_top * f64::from(k) / 5.0;
        text.put_right(left - 6, y + 4, 12.0, P99, &format!("{ms:.0}"));
        text.put(
            right + 6,
            y + 4,
            12.0,
            HITS,
            &format!("{:.1}", f64::from(k) / 5.0),
        );
    }
    for (i, r) in points.iter().enumerate() {
        let s = &r.setting;
        let models = s.max_models.map_or("-".into(), |m| m.to_string());
        text.put_centred(
            x(i),
            bottom + 18,
            12.0,
            INK,
            &format!("{}x{models}", s.replicas),
        );
        let below = format!(
            "{}L {}",
            s.max_concurrent_loads,
            crate::policy_name(s.eviction)
        );
        text.put_centred(x(i), bottom + 34, 11.0, INK, &below);
    }
    text.put(
        left,
        bottom + 62,
        12.0,
        INK,
        "replicas x models per replica; concurrent loads, eviction policy",
    );
    Ok(())
}

/// A dashed horizontal line across the plot area at `y`.
fn dashed<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    y: i32,
    color: RGBColor,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (left, right, _, _) = AREA;
    let mut from = left;
    while from < right {
        let to = (from + 8).min(right);
        area.draw(&PathElement::new(
            vec![(from, y), (to, y)],
            color.stroke_width(1),
        ))?;
        from += 14;
    }
    Ok(())
}

/// Text drawn into the RGB buffer, each glyph's coverage blended over what is there.
struct Text<'a> {
    rgb: &'a mut [u8],
    font: FontRef<'static>,
}

impl<'a> Text<'a> {
    fn new(rgb: &'a mut [u8]) -> Result<Self, PlotError> {
        let font = FontRef::try_from_slice(FONT).map_err(|e| PlotError::Draw(e.to_string()))?;
        Ok(Self { rgb, font })
    }

    fn width(&self, size: f32, s: &str) -> i32 {
        let scaled = self.font.as_scaled(PxScale::from(size));
        s.chars()
            .map(|c| scaled.h_advance(self.font.glyph_id(c)))
            .sum::<f32>() as i32
    }

    fn put_right(&mut self, x: i32, baseline: i32, size: f32, color: RGBColor, s: &str) {
        let w = self.width(size, s);
        self.put(x - w, baseline, size, color, s);
    }

    fn put_centred(&mut self, x: i32, baseline: i32, size: f32, color: RGBColor, s: &str) {
        let w = self.width(size, s);
        self.put(x - w / 2, baseline, size, color, s);
    }

    /// Writes `s` with its baseline at `baseline`, starting at `x`.
    fn put(&mut self, x: i32, baseline: i32, size: f32, color: RGBColor, s: &str) {
        let scale = PxScale::from(size);
        let scaled = self.font.as_scaled(scale);
        let mut pen = x as f32;
        for c in s.chars() {
            let id = self.font.glyph_id(c);
            let glyph = id.with_scale_and_position(scale, ab_glyph::point(pen, baseline as f32));
            pen += scaled.h_advance(id);
            let Some(outline) = self.font.outline_glyph(glyph) else {
                continue;
            };
            let bounds = outline.px_bounds();
            let rgb = &mut *self.rgb;
            outline.draw(|gx, gy, coverage| {
                let px = bounds.min.x as i32 + gx as i32;
                let py = bounds.min.y as i32 + gy as i32;
                if px < 0 || py < 0 || px >= W as i32 || py >= H as i32 {
                    return;
                }
                let at = ((py as u32 * W + px as u32) * 3) as usize;
                for (k, ink) in [color.0, color.1, color.2].into_iter().enumerate() {
                    let old = f32::from(rgb[at + k]);
                    rgb[at + k] = (old + (f32::from(ink) - old) * coverage.min(1.0)) as u8;
                }
            });
        }
    }
}

fn encode(rgb: &[u8]) -> Result<Vec<u8>, PlotError> {
    let mut out = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut out, W, H);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder
            .write_header()
            .map_err(|e| PlotError::Write(e.to_string()))?;
        writer
            .write_image_data(rgb)
            .map_err(|e| PlotError::Write(e.to_string()))?;
    }
    Ok(out)
}
