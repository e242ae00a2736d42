//! Plots of requested and reserved bytes over a trace, so a person sees where reserved memory runs
//! away from what the program asked for.
//!
//! One [`Panel`] per trace: x is the event index, y is bytes (axis labels in KiB/MiB/GiB/TiB,
//! binary ticks). Each [`Line`] is a series of `(event, bytes)` points, styled by what it shows
//! ([`Style`]): the requested bytes (dark grey, dashed), the native allocator's reserved bytes as
//! the trace recorded them (red) or as emulated (orange), and the arena's reserved bytes under
//! each setting (blue, green, purple, …). Several panels are stacked vertically in one image.
//! A panel also marks the device's capacity (a dashed line), the seeded part of a trace (what was
//! live before it began, shaded), each out-of-memory (a vertical line), and, against a right-hand
//! axis, each allocator's modelled driver time accumulated over the trace (dotted). Its title is
//! cut to fit the width (the whole title stays in the SVG's `<title>`).
//!
//! For many traces, [`overview_svg`] / [`overview_png`] draw one row per trace instead (ours /
//! native peak reserved, ours / native modelled driver time), so a sweep is one readable chart.
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

/// A vertical marker at an event (an out-of-memory).
#[derive(Clone, Debug)]
pub struct Mark {
    pub event: u64,
    /// Text beside the marker ("OOM: arena (defaults)").
    pub label: String,
    pub style: Style,
}

/// Modelled driver time accumulated over the events, in seconds, drawn against the right axis.
#[derive(Clone, Debug)]
pub struct TimeLine {
    pub label: String,
    pub style: Style,
    /// `(event index, seconds so far)`, in event order.
    pub points: Vec<(u64, f64)>,
}

/// One trace's plot.
#[derive(Clone, Debug)]
pub struct Panel {
    pub title: String,
    /// A second line under the title (e.g. modelled driver time); empty for none.
    pub subtitle: String,
    /// Events in the trace: the x axis runs from 0 to this.
    pub events: u64,
    pub lines: Vec<Line>,
    /// The device's capacity: a dashed line (named in the legend instead when it is more than
    /// twice the highest line, so it does not squash the curves).
    pub capacity: Option<u64>,
    /// Events before this one are the seeded live set (shaded).
    pub seeded: u64,
    /// Out-of-memory markers.
    pub marks: Vec<Mark>,
    /// Modelled driver time over the trace, per allocator (right axis).
    pub times: Vec<TimeLine>,
}

impl Panel {
    /// A panel with only a title and lines.
    pub fn new(title: impl Into<String>, events: u64, lines: Vec<Line>) -> Panel {
        Panel {
            title: title.into(),
            subtitle: String::new(),
            events,
            lines,
            capacity: None,
            seeded: 0,
            marks: Vec::new(),
            times: Vec::new(),
        }
    }
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
/// Room for the right-hand (driver time) axis labels.
const RIGHT: f64 = 64.0;
/// Title and subtitle.
const TOP: f64 = 50.0;
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

fn legend_entries(p: &Panel) -> usize {
    p.lines.len() + p.times.len() + usize::from(p.capacity.is_some())
}

fn legend_rows(p: &Panel) -> usize {
    legend_entries(p).div_ceil(LEGEND_COLS).max(1)
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

/// A round axis top at or above `t`: 1, 2 or 5 × 10^k.
fn nice_top(t: f64) -> f64 {
    let mut step = 10f64.powf(t.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if step * m >= t {
            step *= m;
            return step;
        }
    }
    step * 10.0
}

/// Seconds as an axis label: "0", "250 µs", "1.5 ms", "2 s".
pub fn seconds_label(t: f64) -> String {
    if t <= 0.0 {
        "0".into()
    } else if t < 1e-3 {
        format!("{} µs", trim_number(t * 1e6))
    } else if t < 1.0 {
        format!("{} ms", trim_number(t * 1e3))
    } else {
        format!("{} s", trim_number(t))
    }
}

/// The capacity's legend text.
fn capacity_label(p: &Panel, g: &PanelGeometry) -> String {
    let c = p.capacity.unwrap_or(0);
    let top = c.max(1);
    if g.capacity_y.is_some() {
        format!("capacity {}", bytes_label(c, top))
    } else {
        format!("capacity {} (off the scale)", bytes_label(c, top))
    }
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
    /// The title cut to the width (at the SVG's 14 px bold, about 8.5 px a character).
    title_text: String,
    /// y of the capacity line, when it is drawn inside the plot.
    capacity_y: Option<f64>,
    /// x where the seeded part ends (0 = none).
    seeded_x: Option<f64>,
    /// (x, label, colour) of each out-of-memory marker.
    marks: Vec<(f64, String, [u8; 3])>,
    /// Each time line in image coordinates.
    time_paths: Vec<Vec<(f64, f64)>>,
    /// (y, label) of the right axis ticks (seconds), empty without time lines.
    time_ticks: Vec<(f64, String)>,
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
    let mut y_data = panel
        .lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .max()
        .unwrap_or(0);
    let capacity_inside = panel.capacity.filter(|&c| c <= y_data.saturating_mul(2));
    if let Some(c) = capacity_inside {
        y_data = y_data.max(c);
    }
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
    let legend = (0..legend_entries(panel))
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
    let t_max = panel
        .times
        .iter()
        .flat_map(|t| t.points.iter().map(|p| p.1))
        .fold(0.0f64, |a, b| if b.is_finite() { a.max(b) } else { a });
    let t_top = if t_max > 0.0 { nice_top(t_max) } else { 1.0 };
    let ty = |t: f64| frame.y0 + frame.h * (1.0 - (t / t_top).clamp(0.0, 1.0));
    let time_paths = panel
        .times
        .iter()
        .map(|l| l.points.iter().map(|&(e, t)| (frame.x(e), ty(t))).collect())
        .collect();
    let time_ticks = if panel.times.is_empty() {
        Vec::new()
    } else {
        (0..=4)
            .map(|i| {
                let t = t_top * i as f64 / 4.0;
                (ty(t), seconds_label(t))
            })
            .collect()
    };
    let fit = ((frame.w + RIGHT - 4.0) / 8.5) as usize;
    let title_text = if panel.title.chars().count() > fit {
        let cut: String = panel.title.chars().take(fit.saturating_sub(1)).collect();
        format!("{cut}…")
    } else {
        panel.title.clone()
    };
    PanelGeometry {
        title_text,
        capacity_y: capacity_inside.map(|c| frame.y(c)),
        seeded_x: (panel.seeded > 0).then(|| frame.x(panel.seeded)),
        marks: panel
            .marks
            .iter()
            .map(|m| (frame.x(m.event), m.label.clone(), color(m.style)))
            .collect(),
        time_paths,
        time_ticks,
        title: (frame.x0, top + TOP - 26.0),
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
// Overview: one row per trace

/// One trace of an overview chart: ours against native, as ratios (`None` = not known).
#[derive(Clone, Debug)]
pub struct OverviewRow {
    pub name: String,
    /// Our peak reserved / native's.
    pub reserved_ratio: Option<f64>,
    /// Our modelled driver time / native's.
    pub driver_ratio: Option<f64>,
    /// Text after the name ("OOM: arena", ...), empty for none.
    pub note: String,
}

const OV_TOP: f64 = 70.0;
const OV_ROW: f64 = 16.0;
const OV_NAME_W: f64 = 330.0;
const OV_A: (f64, f64) = (340.0, 620.0);
const OV_B: (f64, f64) = (660.0, 940.0);
/// The reserved ratio axis runs from 0 to this (ratios above are clipped, their value written).
const OV_A_MAX: f64 = 2.0;
/// The driver-time ratio axis is log10 from 10^OV_B_LO to 10^OV_B_HI.
const OV_B_LO: f64 = -2.0;
const OV_B_HI: f64 = 3.0;

fn ov_height(rows: &[OverviewRow]) -> u32 {
    (OV_TOP + rows.len().max(1) as f64 * OV_ROW + 40.0).ceil() as u32
}

fn ov_a(r: f64) -> f64 {
    OV_A.0 + (OV_A.1 - OV_A.0) * (r / OV_A_MAX).clamp(0.0, 1.0)
}

fn ov_b(r: f64) -> f64 {
    let l = if r > 0.0 { r.log10() } else { OV_B_LO };
    OV_B.0 + (OV_B.1 - OV_B.0) * ((l - OV_B_LO) / (OV_B_HI - OV_B_LO)).clamp(0.0, 1.0)
}

fn ov_bar_color(r: f64) -> [u8; 3] {
    if r <= 1.0 {
        color(Style::Arena(0))
    } else {
        color(Style::NativeEmulated)
    }
}

/// `name` cut to `chars` characters, keeping its end (where trace names differ).
fn cut_start(name: &str, chars: usize) -> String {
    let n = name.chars().count();
    if n <= chars {
        name.to_string()
    } else {
        let tail: String = name.chars().skip(n - chars + 1).collect();
        format!("…{tail}")
    }
}

/// What the overview's bars and labels are, for both renderers: per row
/// (y, name, reserved bar end and label, driver bar end and label).
struct OvRow {
    y: f64,
    name: String,
    a: Option<(f64, String, [u8; 3])>,
    b: Option<(f64, String, [u8; 3])>,
}

fn ov_rows(rows: &[OverviewRow]) -> Vec<OvRow> {
    rows.iter()
        .enumerate()
        .map(|(i, r)| {
            let name = if r.note.is_empty() {
                cut_start(&r.name, 52)
            } else {
                let note = format!(" ({})", r.note);
                cut_start(&r.name, 52usize.saturating_sub(note.chars().count()).max(8)) + &note
            };
            OvRow {
                y: OV_TOP + i as f64 * OV_ROW,
                name,
                a: r.reserved_ratio
                    .filter(|v| v.is_finite())
                    .map(|v| (ov_a(v), format!("{v:.2}"), ov_bar_color(v))),
                b: r.driver_ratio
                    .filter(|v| v.is_finite())
                    .map(|v| (ov_b(v), trim_number(v), ov_bar_color(v))),
            }
        })
        .collect()
}

const OV_A_TITLE: &str = "peak reserved, ours / native";
const OV_B_TITLE: &str = "modelled driver time, ours / native (log)";

/// The overview chart as an SVG document: per trace, ours / native peak reserved and modelled
/// driver time (bars in blue where ours is at or under native, orange where over).
pub fn overview_svg(title: &str, rows: &[OverviewRow]) -> String {
    let h = ov_height(rows);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{h}\" \
         viewBox=\"0 0 {WIDTH} {h}\" font-family=\"sans-serif\" font-size=\"11\">"
    );
    let _ = writeln!(
        s,
        "<rect width=\"{WIDTH}\" height=\"{h}\" fill=\"#ffffff\"/>"
    );
    let _ = writeln!(
        s,
        "<text x=\"10\" y=\"22\" font-size=\"14\" font-weight=\"bold\">{}</text>",
        escape_xml(&cut_start(title, 105))
    );
    let bottom = OV_TOP + rows.len() as f64 * OV_ROW;
    for ((x0, x1), name) in [(OV_A, OV_A_TITLE), (OV_B, OV_B_TITLE)] {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-weight=\"bold\">{name}</text>",
            (x0 + x1) / 2.0,
            OV_TOP - 30.0
        );
    }
    // Axes: ticks at 0, 0.5, 1, 1.5, 2 and at each power of ten; a line at 1 in both.
    let mut ticks: Vec<(f64, String)> = (0..=4)
        .map(|i| {
            let v = i as f64 * OV_A_MAX / 4.0;
            (ov_a(v), trim_number(v))
        })
        .collect();
    ticks.extend(
        (OV_B_LO as i32..=OV_B_HI as i32)
            .map(|e| (ov_b(10f64.powi(e)), trim_number(10f64.powi(e)))),
    );
    for (x, label) in &ticks {
        let _ = writeln!(
            s,
            "<line x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{bottom:.1}\" stroke=\"#e0e0e0\"/>",
            OV_TOP - 8.0
        );
        let _ = writeln!(
            s,
            "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{label}</text>",
            OV_TOP - 12.0
        );
    }
    for x in [ov_a(1.0), ov_b(1.0)] {
        let _ = writeln!(
            s,
            "<line class=\"parity\" x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{bottom:.1}\" stroke=\"#000000\"/>",
            OV_TOP - 8.0
        );
    }
    for r in ov_rows(rows) {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            OV_NAME_W,
            r.y + 11.0,
            escape_xml(&r.name)
        );
        for (bar, x0) in [(&r.a, OV_A.0), (&r.b, OV_B.0)] {
            match bar {
                Some((x1, label, c)) => {
                    let _ = writeln!(
                        s,
                        "<rect x=\"{x0:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"/>",
                        r.y + 3.0,
                        (x1 - x0).max(1.0),
                        OV_ROW - 5.0,
                        hex(*c)
                    );
                    let _ = writeln!(
                        s,
                        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"9\">{}</text>",
                        (x1 + 3.0).min(WIDTH as f64 - 2.0 - 5.5 * label.len() as f64),
                        r.y + 11.0,
                        escape_xml(label)
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"9\" fill=\"#777777\">n/a</text>",
                        x0 + 3.0,
                        r.y + 11.0
                    );
                }
            }
        }
    }
    s.push_str("</svg>\n");
    s
}

/// The overview chart as a PNG file.
pub fn overview_png(title: &str, rows: &[OverviewRow]) -> Vec<u8> {
    const BLACK: [u8; 3] = [0, 0, 0];
    let mut cv = Canvas::new(WIDTH, ov_height(rows));
    let mut phase = 0;
    cv.text(10.0, 10.0, &cut_start(title, 150), BLACK, 1);
    let bottom = OV_TOP + rows.len() as f64 * OV_ROW;
    for ((x0, x1), name) in [(OV_A, OV_A_TITLE), (OV_B, OV_B_TITLE)] {
        cv.text(
            (x0 + x1) / 2.0 - text_width(name, 1) / 2.0,
            OV_TOP - 38.0,
            name,
            BLACK,
            1,
        );
    }
    let mut ticks: Vec<(f64, String)> = (0..=4)
        .map(|i| {
            let v = i as f64 * OV_A_MAX / 4.0;
            (ov_a(v), trim_number(v))
        })
        .collect();
    ticks.extend(
        (OV_B_LO as i32..=OV_B_HI as i32)
            .map(|e| (ov_b(10f64.powi(e)), trim_number(10f64.powi(e)))),
    );
    for (x, label) in &ticks {
        cv.line(
            (*x, OV_TOP - 8.0),
            (*x, bottom),
            [0xe0; 3],
            1,
            None,
            &mut phase,
        );
        cv.text(
            x - text_width(label, 1) / 2.0,
            OV_TOP - 20.0,
            label,
            BLACK,
            1,
        );
    }
    for x in [ov_a(1.0), ov_b(1.0)] {
        cv.line((x, OV_TOP - 8.0), (x, bottom), BLACK, 1, None, &mut phase);
    }
    for r in ov_rows(rows) {
        cv.text(
            OV_NAME_W - text_width(&r.name, 1),
            r.y + 4.0,
            &r.name,
            BLACK,
            1,
        );
        for (bar, x0) in [(&r.a, OV_A.0), (&r.b, OV_B.0)] {
            match bar {
                Some((x1, label, c)) => {
                    cv.fill((x0, r.y + 3.0), (x1.max(x0 + 1.0), r.y + OV_ROW - 2.0), *c);
                    let x = (x1 + 3.0).min(WIDTH as f64 - 2.0 - text_width(label, 1));
                    cv.text(x, r.y + 4.0, label, BLACK, 1);
                }
                None => cv.text(x0 + 3.0, r.y + 4.0, "n/a", [0x77; 3], 1),
            }
        }
    }
    encode_png(&cv)
}

/// Draw an overview chart into `path`, as SVG or PNG by its extension.
pub fn write_overview(path: &Path, title: &str, rows: &[OverviewRow]) -> Result<()> {
    let bytes = match Format::from_path(path)? {
        Format::Svg => overview_svg(title, rows).into_bytes(),
        Format::Png => overview_png(title, rows),
    };
    std::fs::write(path, bytes)
        .map_err(|e| Error::Trace(format!("cannot write plot '{}': {e}", path.display())))
}

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
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"14\" font-weight=\"bold\">{}<title>{}</title></text>",
            g.title.0,
            g.title.1,
            escape_xml(&g.title_text),
            escape_xml(&panel.title)
        );
        if !panel.subtitle.is_empty() {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#444444\">{}</text>",
                g.title.0,
                g.title.1 + 16.0,
                escape_xml(&panel.subtitle)
            );
        }
        if let Some(x) = g.seeded_x {
            let _ = writeln!(
                s,
                "<rect class=\"seeded\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#f0f0f0\"><title>seeded: what was live before the trace began</title></rect>",
                f.x0,
                f.y0,
                (x - f.x0).max(0.0),
                f.h
            );
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#777777\">seeded</text>",
                f.x0 + 3.0,
                f.y0 + 12.0
            );
        }
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
        for (y, label) in &g.time_ticks {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#555555\">{}</text>",
                f.x0 + f.w + 6.0,
                y + 4.0,
                escape_xml(label)
            );
        }
        if !g.time_ticks.is_empty() {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#555555\">driver time</text>",
                WIDTH as f64 - 4.0,
                f.y0 - 6.0
            );
        }
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
        for (line, path) in panel.times.iter().zip(&g.time_paths) {
            let mut pts = String::with_capacity(path.len() * 14);
            for (x, y) in path {
                let _ = write!(pts, "{x:.1},{y:.1} ");
            }
            let _ = writeln!(
                s,
                "<polyline class=\"driver-time\" points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.2\" stroke-dasharray=\"2 3\"><title>{}</title></polyline>",
                pts.trim_end(),
                hex(color(line.style)),
                escape_xml(&line.label)
            );
        }
        if let Some(y) = g.capacity_y {
            let _ = writeln!(
                s,
                "<line class=\"capacity\" x1=\"{:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#000000\" stroke-width=\"1\" stroke-dasharray=\"8 3 2 3\"/>",
                f.x0,
                f.x0 + f.w
            );
        }
        for (x, label, c) in &g.marks {
            let _ = writeln!(
                s,
                "<line class=\"oom\" x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"{}\" stroke-width=\"2\"/>",
                f.y0,
                f.bottom(),
                hex(*c)
            );
            let anchor = if *x > f.x0 + f.w * 0.7 {
                "end"
            } else {
                "start"
            };
            let dx = if anchor == "end" { -4.0 } else { 4.0 };
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"{anchor}\" fill=\"{}\" font-weight=\"bold\">{}</text>",
                x + dx,
                f.y0 + 24.0,
                hex(*c),
                escape_xml(label)
            );
        }
        // Legend: the lines, the time lines, the capacity.
        let mut slots = g.legend.iter().skip(panel.lines.len());
        for (line, &(x, y)) in panel.times.iter().zip(slots.by_ref()) {
            let _ = writeln!(
                s,
                "<line x1=\"{x:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"{}\" stroke-width=\"2\" stroke-dasharray=\"2 3\"/>",
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
        if panel.capacity.is_some()
            && let Some(&(x, y)) = slots.next()
        {
            let _ = writeln!(
                s,
                "<line x1=\"{x:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#000000\" stroke-dasharray=\"8 3 2 3\"/>",
                x + 22.0
            );
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                x + 28.0,
                y + 4.0,
                escape_xml(&capacity_label(panel, &g))
            );
        }
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

    /// Fills the rectangle from (x0, y0) to (x1, y1).
    fn fill(&mut self, (x0, y0): (f64, f64), (x1, y1): (f64, f64), c: [u8; 3]) {
        for y in y0.round() as i64..y1.round() as i64 {
            for x in x0.round() as i64..x1.round() as i64 {
                self.set(x, y, c);
            }
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
            let ch = match ch {
                'µ' => 'u',
                '…' => '~',
                c => c,
            };
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
        if !panel.subtitle.is_empty() {
            cv.text(g.title.0, g.title.1 + 9.0, &panel.subtitle, [0x44; 3], 1);
        }
        if let Some(x) = g.seeded_x {
            cv.fill((f.x0, f.y0), (x.max(f.x0), f.bottom()), [0xf0; 3]);
            cv.text(f.x0 + 3.0, f.y0 + 4.0, "seeded", [0x77; 3], 1);
        }
        for (y, label) in &g.time_ticks {
            cv.text(f.x0 + f.w + 6.0, y - 3.0, label, [0x55; 3], 1);
        }
        if !g.time_ticks.is_empty() {
            let label = "driver time";
            let x = WIDTH as f64 - 4.0 - text_width(label, 1);
            cv.text(x, f.y0 - 12.0, label, [0x55; 3], 1);
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
        for (line, path) in panel.times.iter().zip(&g.time_paths) {
            let mut phase = 0;
            for w in path.windows(2) {
                cv.line(w[0], w[1], color(line.style), 1, Some((2, 3)), &mut phase);
            }
        }
        if let Some(y) = g.capacity_y {
            let mut phase = 0;
            cv.line(
                (f.x0, y),
                (f.x0 + f.w, y),
                BLACK,
                1,
                Some((8, 3)),
                &mut phase,
            );
        }
        for (x, label, c) in &g.marks {
            let mut phase = 0;
            cv.line((*x, f.y0), (*x, f.bottom()), *c, 2, None, &mut phase);
            let tx = if *x > f.x0 + f.w * 0.7 {
                x - 4.0 - text_width(label, 1)
            } else {
                x + 4.0
            };
            cv.text(tx, f.y0 + 18.0, label, *c, 1);
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
        let mut slots = g.legend.iter().skip(panel.lines.len());
        for (line, &(x, y)) in panel.times.iter().zip(slots.by_ref()) {
            let mut phase = 0;
            cv.line(
                (x, y),
                (x + 22.0, y),
                color(line.style),
                1,
                Some((2, 3)),
                &mut phase,
            );
            cv.text(x + 28.0, y - 3.0, &line.label, BLACK, 1);
        }
        if panel.capacity.is_some()
            && let Some(&(x, y)) = slots.next()
        {
            let mut phase = 0;
            cv.line((x, y), (x + 22.0, y), BLACK, 1, Some((8, 3)), &mut phase);
            cv.text(x + 28.0, y - 3.0, &capacity_label(panel, &g), BLACK, 1);
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
                subtitle: "modelled driver time: 1 ms".into(),
                events: 100,
                capacity: Some(96 * MIB),
                seeded: 10,
                marks: vec![Mark {
                    event: 90,
                    label: "OOM: arena".into(),
                    style: Style::Arena(0),
                }],
                times: vec![TimeLine {
                    label: "driver time, arena".into(),
                    style: Style::Arena(0),
                    points: vec![(0, 0.0), (50, 0.0005), (100, 0.001)],
                }],
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
                capacity: Some(80 * GIB),
                ..Panel::new(
                    "second",
                    2_000_000,
                    vec![Line {
                        label: "native (recorded)".into(),
                        style: Style::NativeRecorded,
                        points: vec![(0, 3 * GIB), (2_000_000, 5 * GIB)],
                    }],
                )
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
            2 + 4 + 1,
            "an axis and the data lines per panel, and the first panel's driver time"
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

    #[test]
    fn svg_marks_capacity_oom_seeded_and_driver_time() {
        let panels = sample();
        let doc = svg(&panels);
        let g = geometry(&panels[0], 0.0);
        // The capacity line at 96 MiB (inside twice the data's 80 MiB peak).
        let y = g.frame.y(96 * MIB);
        assert!(
            doc.contains(&format!(
                "<line class=\"capacity\" x1=\"{:.1}\" y1=\"{y:.1}\"",
                g.frame.x0
            )),
            "{doc}"
        );
        assert!(doc.contains("capacity 96 MiB"));
        // The second panel's 80 GiB is far above its 5 GiB: named, not drawn.
        assert_eq!(doc.matches("class=\"capacity\"").count(), 1);
        assert!(doc.contains("capacity 80 GiB (off the scale)"));
        // The OOM marker at event 90, labelled.
        let x = g.frame.x(90);
        assert!(
            doc.contains(&format!("<line class=\"oom\" x1=\"{x:.1}\"")),
            "{doc}"
        );
        assert!(doc.contains(">OOM: arena</text>"));
        // The seeded part, shaded up to event 10.
        assert!(doc.contains(&format!(
            "<rect class=\"seeded\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\"",
            g.frame.x0,
            g.frame.y0,
            g.frame.x(10) - g.frame.x0
        )));
        // Driver time: a dotted line against a right axis labelled in seconds, and the subtitle.
        assert_eq!(doc.matches("class=\"driver-time\"").count(), 1);
        assert!(doc.contains(">1 ms</text>") && doc.contains(">driver time</text>"));
        assert!(doc.contains(">modelled driver time: 1 ms</text>"));
    }

    #[test]
    fn long_titles_are_cut_to_fit() {
        let long = "x".repeat(300);
        let p = Panel::new(long.clone(), 10, vec![]);
        let g = geometry(&p, 0.0);
        let shown = g.title_text.chars().count();
        assert!(shown < 300 && g.title_text.ends_with('…'), "{shown}");
        assert!(shown as f64 * 8.5 <= g.frame.w + RIGHT);
        let doc = svg(&[p]);
        assert!(
            doc.contains(&format!("<title>{long}</title>")),
            "the whole title stays"
        );
    }

    #[test]
    fn overview_has_a_row_per_trace() {
        let rows: Vec<OverviewRow> = (0..50)
            .map(|i| OverviewRow {
                name: format!("trace-{i}"),
                reserved_ratio: Some(0.5 + i as f64 / 50.0),
                driver_ratio: if i == 3 {
                    None
                } else {
                    Some(10f64.powi(i % 5 - 1))
                },
                note: if i == 7 {
                    "OOM: native".into()
                } else {
                    String::new()
                },
            })
            .collect();
        let doc = overview_svg("50 traces", &rows);
        check_balanced(&doc);
        for i in 0..50 {
            assert!(doc.contains(&format!(">trace-{i}")), "row {i}");
        }
        assert!(doc.contains("trace-7 (OOM: native)"));
        assert_eq!(doc.matches(">n/a<").count(), 1);
        assert_eq!(doc.matches("class=\"parity\"").count(), 2);
        // 50 rows fit in a short image, not 50 stacked panels.
        assert!(ov_height(&rows) < 1000);
        let png = overview_png("50 traces", &rows);
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
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
            capacity: Some(0),
            seeded: 3,
            marks: vec![Mark {
                event: 0,
                label: String::new(),
                style: Style::Requested,
            }],
            times: vec![TimeLine {
                label: "t".into(),
                style: Style::Arena(1),
                points: vec![(0, f64::NAN), (1, 0.0)],
            }],
            ..Panel::new(
                "",
                0,
                vec![Line {
                    label: "x".into(),
                    style: Style::Arena(9),
                    points: vec![],
                }],
            )
        };
        check_balanced(&svg(std::slice::from_ref(&p)));
        assert!(png(&[p]).starts_with(b"\x89PNG"));
        assert!(png(&[]).starts_with(b"\x89PNG"));
        check_balanced(&overview_svg("", &[]));
        assert!(overview_png("", &[]).starts_with(b"\x89PNG"));
    }
}
