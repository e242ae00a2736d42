//! What a plot shows ([`Panel`], its [`Line`]s, [`Mark`]s and [`TimeLine`]s, each [`Style`]) and
//! the layout both outputs share: sizes and margins (pixels; SVG user units are the same numbers),
//! ticks, labels and colours. Neither output is drawn here.

use std::path::Path;

use torch_arena::error::{Error, Result};

use super::font;

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
    /// The n-th of the runs a plot compares (`torch-arena diff`: A blue, B orange).
    Run(usize),
}

/// What the x axis counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum XAxis {
    /// Event indices, 0 to [`Panel::events`] (titled "event").
    #[default]
    Events,
    /// A share of something, 0 to 100 %: x runs from 0 to [`Panel::events`], which stands for
    /// 100 %; ticks every 10 %, the axis titled with the text given.
    Percent(String),
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
    /// What x counts: events, or a share of the run.
    pub x_axis: XAxis,
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
            x_axis: XAxis::Events,
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

pub(super) const WIDTH: u32 = 960;
pub(super) const LEFT: f64 = 78.0;
/// Room for the right-hand (driver time) axis labels.
pub(super) const RIGHT: f64 = 64.0;
/// Title and subtitle.
pub(super) const TOP: f64 = 50.0;
pub(super) const PLOT_H: f64 = 240.0;
/// Space under the plot area for the x tick labels and the x axis title.
pub(super) const BELOW: f64 = 44.0;
pub(super) const LEGEND_ROW: f64 = 16.0;
pub(super) const LEGEND_COLS: usize = 3;
pub(super) const GAP: f64 = 16.0;

pub(super) const KIB: u64 = 1 << 10;
pub(super) const MIB: u64 = 1 << 20;
pub(super) const GIB: u64 = 1 << 30;
pub(super) const TIB: u64 = 1 << 40;

pub(super) fn legend_entries(p: &Panel) -> usize {
    p.lines.len() + p.times.len() + usize::from(p.capacity.is_some())
}

pub(super) fn legend_rows(p: &Panel) -> usize {
    legend_entries(p).div_ceil(LEGEND_COLS).max(1)
}

pub(super) fn panel_height(p: &Panel) -> f64 {
    TOP + PLOT_H + BELOW + legend_rows(p) as f64 * LEGEND_ROW + GAP
}

pub(super) fn image_height(panels: &[Panel]) -> u32 {
    let h: f64 = panels.iter().map(panel_height).sum();
    (h.ceil() as u32).max(60)
}

/// The mapping from (event, bytes) to image coordinates for one panel.
pub(super) struct Frame {
    pub(super) x0: f64,
    pub(super) y0: f64,
    pub(super) w: f64,
    pub(super) h: f64,
    pub(super) x_max: f64,
    pub(super) y_max: f64,
}

impl Frame {
    pub(super) fn new(panel: &Panel, top: f64, y_top: u64) -> Frame {
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

    pub(super) fn x(&self, event: u64) -> f64 {
        self.x0 + self.w * (event as f64 / self.x_max)
    }

    pub(super) fn y(&self, bytes: u64) -> f64 {
        self.y0 + self.h * (1.0 - bytes as f64 / self.y_max)
    }

    pub(super) fn bottom(&self) -> f64 {
        self.y0 + self.h
    }
}

/// Binary y ticks: a power-of-two step giving at most 6 intervals; returns (step, top).
pub(super) fn y_ticks(max: u64) -> (u64, u64) {
    let max = max.max(MIB);
    let step = max.div_ceil(6).next_power_of_two();
    (step, max.div_ceil(step) * step)
}

/// Decimal x ticks: 1, 2 or 5 × 10^k, at most 8 intervals.
pub(super) fn x_step(max: u64) -> u64 {
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
pub(super) fn bytes_label(bytes: u64, top: u64) -> String {
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
pub(super) fn nice_top(t: f64) -> f64 {
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
pub(super) fn capacity_label(p: &Panel, g: &PanelGeometry) -> String {
    let c = p.capacity.unwrap_or(0);
    let top = c.max(1);
    if g.capacity_y.is_some() {
        format!("capacity {}", bytes_label(c, top))
    } else {
        format!("capacity {} (off the scale)", bytes_label(c, top))
    }
}

/// Up to two decimals, trailing zeros dropped.
pub(super) fn trim_number(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// An event index as a tick label: 500, 20k, 1.5M.
pub(super) fn count_label(n: u64) -> String {
    match n {
        0..10_000 => n.to_string(),
        10_000..1_000_000 => format!("{}k", trim_number(n as f64 / 1e3)),
        _ => format!("{}M", trim_number(n as f64 / 1e6)),
    }
}

pub(super) fn color(style: Style) -> [u8; 3] {
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
        Style::Run(n) => [[0x1f, 0x77, 0xb4], [0xff, 0x7f, 0x0e]][n % 2],
    }
}

pub(super) fn hex(c: [u8; 3]) -> String {
    format!("#{:02x}{:02x}{:02x}", c[0], c[1], c[2])
}

/// Everything both renderers draw for one panel, in image coordinates.
pub(super) struct PanelGeometry {
    pub(super) frame: Frame,
    pub(super) title: (f64, f64),
    /// The title cut to the width (at the SVG's 14 px bold).
    pub(super) title_text: String,
    /// The subtitle cut to the width (11 px), clear of the right axis's title.
    pub(super) subtitle_text: String,
    /// y of the capacity line, when it is drawn inside the plot.
    pub(super) capacity_y: Option<f64>,
    /// x where the seeded part ends (0 = none).
    pub(super) seeded_x: Option<f64>,
    /// (x, label, colour) of each out-of-memory marker.
    pub(super) marks: Vec<(f64, String, [u8; 3])>,
    /// Each time line in image coordinates.
    pub(super) time_paths: Vec<Vec<(f64, f64)>>,
    /// (y, label) of the right axis ticks (seconds), empty without time lines.
    pub(super) time_ticks: Vec<(f64, String)>,
    /// (y, label) of each y tick.
    pub(super) y_ticks: Vec<(f64, String)>,
    /// (x, label) of each x tick.
    pub(super) x_ticks: Vec<(f64, String)>,
    pub(super) x_title: (f64, f64),
    /// The x axis's title.
    pub(super) x_title_text: String,
    /// (x, y) of each legend entry's sample line start, in line order.
    pub(super) legend: Vec<(f64, f64)>,
    /// Each line in image coordinates.
    pub(super) paths: Vec<Vec<(f64, f64)>>,
}

pub(super) fn geometry(panel: &Panel, top: f64) -> PanelGeometry {
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
    let (x_ticks, x_title_text) = match &panel.x_axis {
        XAxis::Events => {
            let xs = x_step(x_max);
            let ticks = (0..=x_max / xs)
                .map(|i| (frame.x(i * xs), count_label(i * xs)))
                .collect();
            (ticks, X_TITLE.to_string())
        }
        XAxis::Percent(title) => {
            let full = panel.events.max(1);
            let ticks = (0..=10u64)
                .map(|i| (frame.x(full * i / 10), format!("{}%", i * 10)))
                .collect();
            (ticks, title.clone())
        }
    };
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
    let title_text = font::fit(&panel.title, 14.0, true, frame.w + RIGHT - 4.0, false);
    // The subtitle stops short of the right axis's title ("driver time"), on about its line.
    let subtitle_room = if panel.times.is_empty() {
        frame.w + RIGHT - 4.0
    } else {
        frame.w + RIGHT - 16.0 - font::text_width(TIME_TITLE, 11.0, false)
    };
    let subtitle_text = font::fit(&panel.subtitle, 11.0, false, subtitle_room, false);
    PanelGeometry {
        title_text,
        subtitle_text,
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
        x_title_text,
        frame,
        y_ticks,
        x_ticks,
        legend,
        paths,
    }
}

pub(super) const X_TITLE: &str = "event";
/// The right axis's title, above it.
pub(super) const TIME_TITLE: &str = "driver time";

/// A legend entry's text cut to its column (the sample line and a gap before it, 11 px).
pub(super) fn legend_text(label: &str) -> String {
    let column = (WIDTH as f64 - LEFT - RIGHT) / LEGEND_COLS as f64;
    font::fit(label, 11.0, false, column - LEGEND_TEXT_DX - 6.0, false)
}

/// A legend entry's text starts this far right of its sample line's start.
pub(super) const LEGEND_TEXT_DX: f64 = 28.0;
