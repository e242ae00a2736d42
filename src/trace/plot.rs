//! Plots of requested and reserved bytes over a trace, so a person sees where reserved memory runs
//! away from what the program asked for.
//!
//! One [`Panel`] per trace: x is the event index, y is bytes (axis labels in KiB/MiB/GiB/TiB,
//! binary ticks). Each [`Line`] is a series of `(event, bytes)` points, styled by what it shows
//! ([`Style`]): the requested bytes (dark grey, dashed), the native allocator's reserved bytes as
//! the trace recorded them (red) or as emulated (orange), and the arena's reserved bytes under
//! each setting (blue, green, purple, …). Several panels are stacked vertically in one image.
//!
//! Two outputs, both written here without a plotting library: SVG (text: polylines, ticks, a
//! legend under each panel, a title) and PNG (a tiny rasterizer on an RGB buffer, a built-in 5×7
//! bitmap font, and the PNG container around a zlib stream from `flate2`, with our own CRC-32).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use crate::error::{Error, Result};

/// What a line shows; sets its colour and dash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// Requested bytes live (dashed dark grey).
    Requested,
    /// The native allocator's reserved bytes, from the trace's own segment events (red).
    NativeRecorded,
    /// The native allocator's reserved bytes, emulated (orange).
    NativeEmulated,
    /// The arena's reserved bytes under the n-th setting (a palette colour per n).
    Arena(usize),
}

/// One series of a panel.
#[derive(Clone, Debug)]
pub struct Line {
    /// Legend text.
    pub label: String,
    pub style: Style,
    /// `(event index, bytes)`, in event order.
    pub points: Vec<(u64, u64)>,
}

/// One trace's plot.
#[derive(Clone, Debug)]
pub struct Panel {
    pub title: String,
    /// Events in the trace: the x axis runs from 0 to this.
    pub events: u64,
    pub lines: Vec<Line>,
}

/// An output format, chosen from the file name's extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Svg,
    Png,
}

/// The extensions [`Format::from_path`] accepts, for error messages.
pub const ACCEPTED_EXTENSIONS: &str = ".svg or .png";

impl Format {
    /// The format for `path`'s extension (case-insensitive); an error names the accepted ones.
    pub fn from_path(path: &Path) -> Result<Format> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("svg") => Ok(Format::Svg),
            Some("png") => Ok(Format::Png),
            _ => Err(Error::Trace(format!(
                "plot file '{}': unknown extension; accepted: {ACCEPTED_EXTENSIONS}",
                path.display()
            ))),
        }
    }
}

/// Draw `panels` into `path`, as SVG or PNG by its extension.
pub fn write(path: &Path, panels: &[Panel]) -> Result<()> {
    let bytes = match Format::from_path(path)? {
        Format::Svg => svg(panels).into_bytes(),
        Format::Png => png(panels),
    };
    std::fs::write(path, bytes)
        .map_err(|e| Error::Trace(format!("cannot write plot '{}': {e}", path.display())))
}

// ---------------------------------------------------------------------------------------------
// Layout, shared by both outputs (pixels; SVG user units are the same numbers).

const WIDTH: u32 = 960;
const LEFT: f64 = 78.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 34.0;
const PLOT_H: f64 = 240.0;
/// Space under the plot area for the x tick labels and the x axis title.
const BELOW: f64 = 44.0;
const LEGEND_ROW: f64 = 16.0;
const LEGEND_COLS: usize = 3;
const GAP: f64 = 16.0;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

fn legend_rows(p: &Panel) -> usize {
    p.lines.len().div_ceil(LEGEND_COLS).max(1)
}

fn panel_height(p: &Panel) -> f64 {
    TOP + PLOT_H + BELOW + legend_rows(p) as f64 * LEGEND_ROW + GAP
}

fn image_height(panels: &[Panel]) -> u32 {
    let h: f64 = panels.iter().map(panel_height).sum();
    (h.ceil() as u32).max(60)
}

/// The mapping from (event, bytes) to image coordinates for one panel.
struct Frame {
    x0: f64,
    y0: f64,
    w: f64,
    h: f64,
    x_max: f64,
    y_max: f64,
}

impl Frame {
    fn new(panel: &Panel, top: f64, y_top: u64) -> Frame {
        let data_x = panel
            .lines
            .iter()
            .flat_map(|l| l.points.iter().map(|p| p.0))
            .max()
            .unwrap_or(0);
        Frame {
            x0: LEFT,
            y0: top + TOP,
            w: WIDTH as f64 - LEFT - RIGHT,
            h: PLOT_H,
            x_max: panel.events.max(data_x).max(1) as f64,
            y_max: y_top.max(1) as f64,
        }
    }

    fn x(&self, event: u64) -> f64 {
        self.x0 + self.w * (event as f64 / self.x_max)
    }

    fn y(&self, bytes: u64) -> f64 {
        self.y0 + self.h * (1.0 - bytes as f64 / self.y_max)
    }

    fn bottom(&self) -> f64 {
        self.y0 + self.h
    }
}

/// Binary y ticks: a power-of-two step giving at most 6 intervals; returns (step, top).
fn y_ticks(max: u64) -> (u64, u64) {
    let max = max.max(MIB);
    let step = max.div_ceil(6).next_power_of_two();
    (step, max.div_ceil(step) * step)
}

/// Decimal x ticks: 1, 2 or 5 × 10^k, at most 8 intervals.
fn x_step(max: u64) -> u64 {
    let max = max.max(1);
    let mut step = 1u64;
    loop {
        for m in [1, 2, 5] {
            if max.div_ceil(step * m) <= 8 {
                return step * m;
            }
        }
        step *= 10;
    }
}

/// `bytes` in the unit suited to the axis top `top` ("512 MiB", "1.5 GiB", "0").
fn bytes_label(bytes: u64, top: u64) -> String {
    if bytes == 0 {
        return "0".into();
    }
    let (unit, name) = [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")]
        .into_iter()
        .find(|&(u, _)| top >= u)
        .unwrap_or((1, "B"));
    format!("{} {name}", trim_number(bytes as f64 / unit as f64))
}

/// Up to two decimals, trailing zeros dropped.
fn trim_number(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// An event index as a tick label: 500, 20k, 1.5M.
fn count_label(n: u64) -> String {
    match n {
        0..10_000 => n.to_string(),
        10_000..1_000_000 => format!("{}k", trim_number(n as f64 / 1e3)),
        _ => format!("{}M", trim_number(n as f64 / 1e6)),
    }
}

fn color(style: Style) -> [u8; 3] {
    const PALETTE: [[u8; 3]; 7] = [
        [0x1f, 0x77, 0xb4],
        [0x2c, 0xa0, 0x2c],
        [0x94, 0x67, 0xbd],
        [0x8c, 0x56, 0x4b],
        [0xe3, 0x77, 0xc2],
        [0x17, 0xbe, 0xcf],
        [0xbc, 0xbd, 0x22],
    ];
    match style {
        Style::Requested => [0x44, 0x44, 0x44],
        Style::NativeRecorded => [0xd6, 0x27, 0x28],
        Style::NativeEmulated => [0xff, 0x7f, 0x0e],
        Style::Arena(n) => PALETTE[n % PALETTE.len()],
    }
}

fn hex(c: [u8; 3]) -> String {
    format!("#{:02x}{:02x}{:02x}", c[0], c[1], c[2])
}

/// Everything both renderers draw for one panel, in image coordinates.
struct PanelGeometry {
    frame: Frame,
    title: (f64, f64),
    /// (y, label) of each y tick.
    y_ticks: Vec<(f64, String)>,
    /// (x, label) of each x tick.
    x_ticks: Vec<(f64, String)>,
    x_title: (f64, f64),
    /// (x, y) of each legend entry's sample line start, in line order.
    legend: Vec<(f64, f64)>,
    /// Each line in image coordinates.
    paths: Vec<Vec<(f64, f64)>>,
}

fn geometry(panel: &Panel, top: f64) -> PanelGeometry {
    let y_data = panel
        .lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .max()
        .unwrap_or(0);
    let (ystep, ytop) = y_ticks(y_data);
    let frame = Frame::new(panel, top, ytop);
    let y_ticks = (0..=ytop / ystep)
        .map(|i| (frame.y(i * ystep), bytes_label(i * ystep, ytop)))
        .collect();
    let x_max = frame.x_max as u64;
    let xs = x_step(x_max);
    let x_ticks = (0..=x_max / xs)
        .map(|i| (frame.x(i * xs), count_label(i * xs)))
        .collect();
    let legend_top = frame.bottom() + BELOW;
    let col_w = frame.w / LEGEND_COLS as f64;
    let legend = (0..panel.lines.len())
        .map(|i| {
            (
                frame.x0 + (i % LEGEND_COLS) as f64 * col_w,
                legend_top + (i / LEGEND_COLS) as f64 * LEGEND_ROW + LEGEND_ROW / 2.0,
            )
        })
        .collect();
    let paths = panel
        .lines
        .iter()
        .map(|l| {
            l.points
                .iter()
                .map(|&(e, b)| (frame.x(e), frame.y(b)))
                .collect()
        })
        .collect();
    PanelGeometry {
        title: (frame.x0, top + TOP - 12.0),
        x_title: (frame.x0 + frame.w / 2.0, frame.bottom() + 34.0),
        frame,
        y_ticks,
        x_ticks,
        legend,
        paths,
    }
}

const X_TITLE: &str = "event";

// ---------------------------------------------------------------------------------------------
// SVG

fn escape_xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\t' && c != '\n' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// The panels as an SVG document.
pub fn svg(panels: &[Panel]) -> String {
    let height = image_height(panels);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {WIDTH} {height}\" font-family=\"sans-serif\" font-size=\"11\">"
    );
    let _ = writeln!(
        s,
        "<rect width=\"{WIDTH}\" height=\"{height}\" fill=\"#ffffff\"/>"
    );
    let mut top = 0.0;
    for panel in panels {
        let g = geometry(panel, top);
        let f = &g.frame;
        let _ = writeln!(s, "<g>");
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"14\" font-weight=\"bold\">{}</text>",
            g.title.0,
            g.title.1,
            escape_xml(&panel.title)
        );
        // Grid and y ticks.
        for (y, label) in &g.y_ticks {
            let _ = writeln!(
                s,
                "<line x1=\"{:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#e0e0e0\"/>",
                f.x0,
                f.x0 + f.w
            );
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                f.x0 - 6.0,
                y + 4.0,
                escape_xml(label)
            );
        }
        for (x, label) in &g.x_ticks {
            let _ = writeln!(
                s,
                "<line x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#000000\"/>",
                f.bottom(),
                f.bottom() + 5.0
            );
            let _ = writeln!(
                s,
                "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                f.bottom() + 17.0,
                escape_xml(label)
            );
        }
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{X_TITLE}</text>",
            g.x_title.0, g.x_title.1
        );
        // Axes.
        let _ = writeln!(
            s,
            "<polyline points=\"{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}\" fill=\"none\" stroke=\"#000000\"/>",
            f.x0,
            f.y0,
            f.x0,
            f.bottom(),
            f.x0 + f.w,
            f.bottom()
        );
        // Data.
        for (line, path) in panel.lines.iter().zip(&g.paths) {
            let dash = if line.style == Style::Requested {
                " stroke-dasharray=\"6 4\""
            } else {
                ""
            };
            let mut pts = String::with_capacity(path.len() * 14);
            for (x, y) in path {
                let _ = write!(pts, "{x:.1},{y:.1} ");
            }
            let _ = writeln!(
                s,
                "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"{dash}><title>{}</title></polyline>",
                pts.trim_end(),
                hex(color(line.style)),
                escape_xml(&line.label)
            );
        }
        // Legend.
        for (line, &(x, y)) in panel.lines.iter().zip(&g.legend) {
            let dash = if line.style == Style::Requested {
                " stroke-dasharray=\"6 4\""
            } else {
                ""
            };
            let _ = writeln!(
                s,
                "<line x1=\"{x:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"{}\" stroke-width=\"2\"{dash}/>",
                x + 22.0,
                hex(color(line.style))
            );
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                x + 28.0,
                y + 4.0,
                escape_xml(&line.label)
            );
        }
        let _ = writeln!(s, "</g>");
        top += panel_height(panel);
    }
    s.push_str("</svg>\n");
    s
}

// ---------------------------------------------------------------------------------------------
// PNG

/// An RGB image.
struct Canvas {
    w: u32,
    h: u32,
    px: Vec<u8>,
}

impl Canvas {
    fn new(w: u32, h: u32) -> Canvas {
        Canvas {
            w,
            h,
            px: vec![0xff; w as usize * h as usize * 3],
        }
    }

    fn set(&mut self, x: i64, y: i64, c: [u8; 3]) {
        if x < 0 || y < 0 || x >= self.w as i64 || y >= self.h as i64 {
            return;
        }
        let i = (y as usize * self.w as usize + x as usize) * 3;
        self.px[i..i + 3].copy_from_slice(&c);
    }

    /// A line `width` pixels thick (a square brush), Bresenham; `dash` = (on, off) pixels.
    fn line(
        &mut self,
        a: (f64, f64),
        b: (f64, f64),
        c: [u8; 3],
        width: i64,
        dash: Option<(u32, u32)>,
        phase: &mut u32,
    ) {
        let (mut x0, mut y0) = (a.0.round() as i64, a.1.round() as i64);
        let (x1, y1) = (b.0.round() as i64, b.1.round() as i64);
        let dx = (x1 - x0).abs();
        let dy = -(y1 - y0).abs();
        let sx = if x0 < x1 { 1 } else { -1 };
        let sy = if y0 < y1 { 1 } else { -1 };
        let mut err = dx + dy;
        loop {
            let on = match dash {
                Some((on, off)) => *phase % (on + off) < on,
                None => true,
            };
            *phase = phase.wrapping_add(1);
            if on {
                for ox in 0..width {
                    for oy in 0..width {
                        self.set(x0 + ox - width / 2, y0 + oy - width / 2, c);
                    }
                }
            }
            if x0 == x1 && y0 == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x0 += sx;
            }
            if e2 <= dx {
                err += dx;
                y0 += sy;
            }
        }
    }

    /// `text` in the 5×7 font at `scale`, top-left corner at (x, y). Lower case is drawn as
    /// upper case; characters the font lacks as '?'.
    fn text(&mut self, x: f64, y: f64, text: &str, c: [u8; 3], scale: i64) {
        let (x, y) = (x.round() as i64, y.round() as i64);
        for (i, ch) in text.chars().enumerate() {
            let g = glyph(ch.to_ascii_uppercase());
            let gx = x + i as i64 * 6 * scale;
            for (row, bits) in g.iter().enumerate() {
                for col in 0..5 {
                    if bits & (0x10 >> col) != 0 {
                        for sx in 0..scale {
                            for sy in 0..scale {
                                self.set(gx + col * scale + sx, y + row as i64 * scale + sy, c);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Width in pixels of `text` in the 5×7 font at `scale`.
fn text_width(text: &str, scale: i64) -> f64 {
    (text.chars().count() as i64 * 6 * scale) as f64
}

/// The 5×7 font: seven rows, bit 4 the leftmost column.
fn glyph(c: char) -> [u8; 7] {
    match c {
        ' ' => [0; 7],
        '0' => [0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E],
        '1' => [0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E],
        '2' => [0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F],
        '3' => [0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E],
        '4' => [0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02],
        '5' => [0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E],
        '6' => [0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E],
        '7' => [0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08],
        '8' => [0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E],
        '9' => [0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C],
        'A' => [0x0E, 0x11, 0x11, 0x11, 0x1F, 0x11, 0x11],
        'B' => [0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E],
        'C' => [0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E],
        'D' => [0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C],
        'E' => [0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F],
        'F' => [0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10],
        'G' => [0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F],
        'H' => [0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11],
        'I' => [0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E],
        'J' => [0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C],
        'K' => [0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11],
        'L' => [0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F],
        'M' => [0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11],
        'N' => [0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11],
        'O' => [0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E],
        'P' => [0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10],
        'Q' => [0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D],
        'R' => [0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11],
        'S' => [0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E],
        'T' => [0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04],
        'U' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E],
        'V' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04],
        'W' => [0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A],
        'X' => [0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11],
        'Y' => [0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04],
        'Z' => [0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F],
        '.' => [0, 0, 0, 0, 0, 0x0C, 0x0C],
        ',' => [0, 0, 0, 0, 0x0C, 0x04, 0x08],
        ':' => [0, 0x0C, 0x0C, 0, 0x0C, 0x0C, 0],
        ';' => [0, 0x0C, 0x0C, 0, 0x0C, 0x04, 0x08],
        '-' => [0, 0, 0, 0x1F, 0, 0, 0],
        '_' => [0, 0, 0, 0, 0, 0, 0x1F],
        '(' => [0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02],
        ')' => [0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08],
        '[' => [0x0E, 0x08, 0x08, 0x08, 0x08, 0x08, 0x0E],
        ']' => [0x0E, 0x02, 0x02, 0x02, 0x02, 0x02, 0x0E],
        '{' => [0x02, 0x04, 0x04, 0x08, 0x04, 0x04, 0x02],
        '}' => [0x08, 0x04, 0x04, 0x02, 0x04, 0x04, 0x08],
        '<' => [0x02, 0x04, 0x08, 0x10, 0x08, 0x04, 0x02],
        '>' => [0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08],
        '/' => [0, 0x01, 0x02, 0x04, 0x08, 0x10, 0],
        '%' => [0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03],
        '=' => [0, 0, 0x1F, 0, 0x1F, 0, 0],
        '+' => [0, 0x04, 0x04, 0x1F, 0x04, 0x04, 0],
        '*' => [0, 0x04, 0x15, 0x0E, 0x15, 0x04, 0],
        '#' => [0x0A, 0x0A, 0x1F, 0x0A, 0x1F, 0x0A, 0x0A],
        '&' => [0x0C, 0x12, 0x14, 0x08, 0x15, 0x12, 0x0D],
        '\'' => [0x04, 0x04, 0x08, 0, 0, 0, 0],
        '"' => [0x0A, 0x0A, 0, 0, 0, 0, 0],
        '!' => [0x04, 0x04, 0x04, 0x04, 0x04, 0, 0x04],
        '|' => [0x04; 7],
        '~' => [0, 0, 0x08, 0x15, 0x02, 0, 0],
        _ => [0x0E, 0x11, 0x01, 0x02, 0x04, 0, 0x04], // '?'
    }
}

fn raster(panels: &[Panel]) -> Canvas {
    const BLACK: [u8; 3] = [0, 0, 0];
    const GRID: [u8; 3] = [0xe0, 0xe0, 0xe0];
    let mut cv = Canvas::new(WIDTH, image_height(panels));
    let mut top = 0.0;
    for panel in panels {
        let g = geometry(panel, top);
        let f = &g.frame;
        let mut phase = 0;
        // The title at double size when it fits, else at normal size, cut to the width.
        let room = f.w + RIGHT - 4.0;
        if text_width(&panel.title, 2) <= room {
            cv.text(g.title.0, g.title.1 - 9.0, &panel.title, BLACK, 2);
        } else {
            let fit = (room / 6.0) as usize;
            let title: String = if panel.title.chars().count() > fit {
                let cut: String = panel.title.chars().take(fit.saturating_sub(3)).collect();
                format!("{cut}...")
            } else {
                panel.title.clone()
            };
            cv.text(g.title.0, g.title.1 - 5.0, &title, BLACK, 1);
        }
        for (y, label) in &g.y_ticks {
            cv.line((f.x0, *y), (f.x0 + f.w, *y), GRID, 1, None, &mut phase);
            cv.text(f.x0 - 6.0 - text_width(label, 1), y - 3.0, label, BLACK, 1);
        }
        for (x, label) in &g.x_ticks {
            cv.line(
                (*x, f.bottom()),
                (*x, f.bottom() + 5.0),
                BLACK,
                1,
                None,
                &mut phase,
            );
            cv.text(
                x - text_width(label, 1) / 2.0,
                f.bottom() + 9.0,
                label,
                BLACK,
                1,
            );
        }
        cv.text(
            g.x_title.0 - text_width(X_TITLE, 1) / 2.0,
            g.x_title.1 - 7.0,
            X_TITLE,
            BLACK,
            1,
        );
        cv.line((f.x0, f.y0), (f.x0, f.bottom()), BLACK, 1, None, &mut phase);
        cv.line(
            (f.x0, f.bottom()),
            (f.x0 + f.w, f.bottom()),
            BLACK,
            1,
            None,
            &mut phase,
        );
        for (line, path) in panel.lines.iter().zip(&g.paths) {
            let dash = (line.style == Style::Requested).then_some((6, 4));
            let mut phase = 0;
            for w in path.windows(2) {
                cv.line(w[0], w[1], color(line.style), 2, dash, &mut phase);
            }
            if let [only] = path.as_slice() {
                cv.line(*only, *only, color(line.style), 2, None, &mut phase);
            }
        }
        for (line, &(x, y)) in panel.lines.iter().zip(&g.legend) {
            let dash = (line.style == Style::Requested).then_some((6, 4));
            let mut phase = 0;
            cv.line(
                (x, y),
                (x + 22.0, y),
                color(line.style),
                2,
                dash,
                &mut phase,
            );
            cv.text(x + 28.0, y - 3.0, &line.label, BLACK, 1);
        }
        top += panel_height(panel);
    }
    cv
}

/// The panels as a PNG file (8-bit RGB, no interlace).
pub fn png(panels: &[Panel]) -> Vec<u8> {
    let cv = raster(panels);
    encode_png(&cv)
}

fn encode_png(cv: &Canvas) -> Vec<u8> {
    let mut out = vec![0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];
    let mut ihdr = Vec::with_capacity(13);
    ihdr.extend_from_slice(&cv.w.to_be_bytes());
    ihdr.extend_from_slice(&cv.h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8 bits, RGB, deflate, filter 0, no interlace
    chunk(&mut out, b"IHDR", &ihdr);
    let row = cv.w as usize * 3;
    let mut raw = Vec::with_capacity((row + 1) * cv.h as usize);
    for r in cv.px.chunks(row) {
        raw.push(0); // filter type None
        raw.extend_from_slice(r);
    }
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(&raw).expect("writing to a Vec cannot fail");
    let idat = z.finish().expect("writing to a Vec cannot fail");
    chunk(&mut out, b"IDAT", &idat);
    chunk(&mut out, b"IEND", &[]);
    out
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320) as PNG chunks use it.
fn crc32(bytes: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (n, slot) in t.iter_mut().enumerate() {
            let mut c = n as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            *slot = c;
        }
        t
    });
    let mut c = 0xFFFF_FFFFu32;
    for &b in bytes {
        c = table[((c ^ b as u32) & 0xFF) as usize] ^ (c >> 8);
    }
    c ^ 0xFFFF_FFFF
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;

    fn sample() -> Vec<Panel> {
        vec![
            Panel {
                title: "a <trace> & more".into(),
                events: 100,
                lines: vec![
                    Line {
                        label: "requested".into(),
                        style: Style::Requested,
                        points: vec![(0, 0), (50, 40 * MIB), (100, 10 * MIB)],
                    },
                    Line {
                        label: "arena (defaults)".into(),
                        style: Style::Arena(0),
                        // A horizontal line at 50 MiB: a known pixel for the PNG test.
                        points: vec![(0, 50 * MIB), (100, 50 * MIB)],
                    },
                    Line {
                        label: "native (emulated)".into(),
                        style: Style::NativeEmulated,
                        points: vec![(0, 20 * MIB), (100, 80 * MIB)],
                    },
                ],
            },
            Panel {
                title: "second".into(),
                events: 2_000_000,
                lines: vec![Line {
                    label: "native (recorded)".into(),
                    style: Style::NativeRecorded,
                    points: vec![(0, 3 * GIB), (2_000_000, 5 * GIB)],
                }],
            },
        ]
    }

    #[test]
    fn ticks_and_labels() {
        assert_eq!(y_ticks(70 * GIB), (16 * GIB, 80 * GIB));
        assert_eq!(y_ticks(0), (256 * KIB, MIB));
        assert_eq!(bytes_label(512 * MIB, 2 * GIB), "0.5 GiB");
        assert_eq!(bytes_label(512 * MIB, 512 * MIB), "512 MiB");
        assert_eq!(bytes_label(0, GIB), "0");
        assert_eq!(x_step(100), 20);
        assert_eq!(x_step(8), 1);
        assert_eq!(x_step(2_000_000), 500_000);
        assert_eq!(count_label(500_000), "500k");
        assert_eq!(count_label(1_500_000), "1.5M");
        assert_eq!(count_label(9_999), "9999");
    }

    #[test]
    fn format_from_extension() {
        assert_eq!(Format::from_path(Path::new("a.SVG")).unwrap(), Format::Svg);
        assert_eq!(
            Format::from_path(Path::new("x/a.png")).unwrap(),
            Format::Png
        );
        let e = Format::from_path(Path::new("a.jpg"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("a.jpg") && e.contains(".svg or .png"), "{e}");
        assert!(Format::from_path(Path::new("noext")).is_err());
    }

    /// Every tag is closed in order; returns the element names seen.
    fn check_balanced(doc: &str) -> Vec<String> {
        let mut stack: Vec<String> = Vec::new();
        let mut seen = Vec::new();
        let mut rest = doc;
        while let Some(i) = rest.find('<') {
            let j = rest[i..].find('>').expect("unterminated tag") + i;
            let tag = &rest[i + 1..j];
            assert!(!tag.contains('<'), "'<' inside a tag: {tag}");
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(stack.pop().as_deref(), Some(name), "mismatched </{name}>");
            } else {
                let name = tag.split_whitespace().next().unwrap().trim_end_matches('/');
                seen.push(name.to_string());
                if !tag.ends_with('/') {
                    stack.push(name.to_string());
                }
            }
            rest = &rest[j + 1..];
        }
        assert!(stack.is_empty(), "unclosed: {stack:?}");
        seen
    }

    #[test]
    fn svg_is_well_formed_and_labelled() {
        let doc = svg(&sample());
        assert!(doc.starts_with("<svg "));
        let names = check_balanced(&doc);
        assert_eq!(names.iter().filter(|n| *n == "g").count(), 2);
        assert_eq!(
            names.iter().filter(|n| *n == "polyline").count(),
            2 + 4,
            "an axis and the data lines per panel"
        );
        for label in [
            "a &lt;trace&gt; &amp; more",
            "second",
            "requested",
            "arena (defaults)",
            "native (emulated)",
            "native (recorded)",
            "80 MiB",
            "5 GiB",
            ">event<",
            "500k",
        ] {
            assert!(doc.contains(label), "missing {label}");
        }
        assert!(!doc.contains("a <trace>"));
    }

    fn chunks(png: &[u8]) -> Vec<([u8; 4], Vec<u8>)> {
        let mut out = Vec::new();
        let mut at = 8;
        while at < png.len() {
            let len = u32::from_be_bytes(png[at..at + 4].try_into().unwrap()) as usize;
            let kind: [u8; 4] = png[at + 4..at + 8].try_into().unwrap();
            let data = png[at + 8..at + 8 + len].to_vec();
            let crc = u32::from_be_bytes(png[at + 8 + len..at + 12 + len].try_into().unwrap());
            let mut check = flate2::Crc::new();
            check.update(&png[at + 4..at + 8 + len]);
            assert_eq!(
                crc,
                check.sum(),
                "CRC of {}",
                String::from_utf8_lossy(&kind)
            );
            out.push((kind, data));
            at += 12 + len;
        }
        out
    }

    #[test]
    fn crc32_known_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn png_is_valid_and_draws_the_lines() {
        let panels = sample();
        let file = png(&panels);
        assert_eq!(&file[..8], b"\x89PNG\r\n\x1a\n");
        let cs = chunks(&file);
        let kinds: Vec<&[u8]> = cs.iter().map(|c| &c.0[..]).collect();
        assert_eq!(kinds, [&b"IHDR"[..], b"IDAT", b"IEND"]);
        let ihdr = &cs[0].1;
        let w = u32::from_be_bytes(ihdr[0..4].try_into().unwrap());
        let h = u32::from_be_bytes(ihdr[4..8].try_into().unwrap());
        assert_eq!((w, h), (WIDTH, image_height(&panels)));
        assert_eq!(&ihdr[8..], &[8, 2, 0, 0, 0]);
        let mut raw = Vec::new();
        flate2::read::ZlibDecoder::new(&cs[1].1[..])
            .read_to_end(&mut raw)
            .unwrap();
        let stride = w as usize * 3 + 1;
        assert_eq!(raw.len(), stride * h as usize);
        let pixel = |x: usize, y: usize| {
            let i = y * stride + 1 + x * 3;
            [raw[i], raw[i + 1], raw[i + 2]]
        };
        // The arena line at 50 MiB on a 0..80 MiB axis (ticks of 16 MiB), at event 75.
        let g = geometry(&panels[0], 0.0);
        let (x, y) = (
            g.frame.x(75).round() as usize,
            g.frame.y(50 * MIB).round() as usize,
        );
        assert_eq!(pixel(x, y), color(Style::Arena(0)));
        assert_eq!(pixel(5, 5), [0xff; 3], "background");
        // The y axis, in the second panel too.
        let g2 = geometry(&panels[1], panel_height(&panels[0]));
        let mid = ((g2.frame.y0 + g2.frame.bottom()) / 2.0).round() as usize;
        assert_eq!(pixel(g2.frame.x0.round() as usize, mid), [0, 0, 0]);
    }

    #[test]
    fn empty_inputs_do_not_panic() {
        let p = Panel {
            title: String::new(),
            events: 0,
            lines: vec![Line {
                label: "x".into(),
                style: Style::Arena(9),
                points: vec![],
            }],
        };
        check_balanced(&svg(std::slice::from_ref(&p)));
        assert!(png(&[p]).starts_with(b"\x89PNG"));
        assert!(png(&[]).starts_with(b"\x89PNG"));
    }
}
