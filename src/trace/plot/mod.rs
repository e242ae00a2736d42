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

mod overview;
mod raster;
mod svg;

pub use overview::{OverviewRow, overview_png, overview_svg, write_overview};
pub use raster::png;
use raster::{Canvas, encode_png, text_width};
use svg::escape_xml;
pub use svg::svg;

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
    crate::atomic_file::write(path, |w| w.write_all(&bytes))
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

#[cfg(test)]
mod tests {
    use super::overview::ov_height;
    use super::raster::crc32;
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
