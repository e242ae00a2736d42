//! The overview chart: one row per trace of a sweep (ours / native peak reserved, ours / native
//! modelled driver time), as SVG and PNG.

use std::fmt::Write as _;
use std::path::Path;

use torch_arena::error::{Error, Result};

use super::font;
use super::layout::*;
use super::svg::{escape_xml, svg_open};

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

pub(super) fn ov_height(rows: &[OverviewRow]) -> u32 {
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
            // The name keeps its end (where trace names differ), the note whole if it can.
            let room = OV_NAME_W - 6.0;
            let name = if r.note.is_empty() {
                font::fit(&r.name, 11.0, false, room, true)
            } else {
                let note = format!(" ({})", r.note);
                let note_w = font::text_width(&note, 11.0, false).min(room / 2.0);
                let note = font::fit(&note, 11.0, false, note_w, false);
                font::fit(&r.name, 11.0, false, room - note_w, true) + &note
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
    let mut s = svg_open(ov_height(rows));
    let _ = writeln!(
        s,
        "<text x=\"10\" y=\"22\" font-size=\"14\" font-weight=\"bold\">{}</text>",
        escape_xml(&font::fit(title, 14.0, true, WIDTH as f64 - 20.0, false))
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
                        (x1 + 3.0).min(WIDTH as f64 - 2.0 - font::text_width(label, 9.0, false)),
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

/// The overview chart as a PNG file: [`overview_svg`] rendered.
pub fn overview_png(title: &str, rows: &[OverviewRow]) -> Vec<u8> {
    super::render::svg_to_png(&overview_svg(title, rows))
}

/// Draw an overview chart into `path`, as SVG or PNG by its extension.
pub fn write_overview(path: &Path, title: &str, rows: &[OverviewRow]) -> Result<()> {
    let bytes = match Format::from_path(path)? {
        Format::Svg => overview_svg(title, rows).into_bytes(),
        Format::Png => overview_png(title, rows),
    };
    torch_arena::atomic_file::write(path, |w| w.write_all(&bytes))
        .map_err(|e| Error::Trace(format!("cannot write plot '{}': {e}", path.display())))
}
