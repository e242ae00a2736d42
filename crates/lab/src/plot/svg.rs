//! The panels as SVG text: polylines, ticks, legends and titles.

use std::fmt::Write as _;

use super::font;
use super::layout::*;

// ---------------------------------------------------------------------------------------------
// SVG

pub(super) fn escape_xml(s: &str) -> String {
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

/// An SVG document's opening tag and white background, `height` tall: text in the embedded
/// font's family (the PNG renders with it; a viewer without it falls back to its sans-serif).
pub(super) fn svg_open(height: u32) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {WIDTH} {height}\" font-family=\"'{}', sans-serif\" \
         font-size=\"11\">\n<rect width=\"{WIDTH}\" height=\"{height}\" fill=\"#ffffff\"/>\n",
        font::FAMILY
    )
}

/// Attributes for text drawn over lines: a white outline under the glyphs.
const HALO: &str =
    " stroke=\"#ffffff\" stroke-width=\"3\" stroke-linejoin=\"round\" paint-order=\"stroke\"";

/// A legend entry's text beside its sample line at (`x`, `y`), cut to its column (then the whole
/// text is its tooltip).
fn legend_label(s: &mut String, x: f64, y: f64, label: &str) {
    let shown = legend_text(label);
    let tip = if shown == label {
        String::new()
    } else {
        format!("<title>{}</title>", escape_xml(label))
    };
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\">{}{tip}</text>",
        x + LEGEND_TEXT_DX,
        y + 4.0,
        escape_xml(&shown)
    );
}

/// The panels as an SVG document.
pub fn svg(panels: &[Panel]) -> String {
    let mut s = svg_open(image_height(panels));
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
                escape_xml(&g.subtitle_text)
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
                "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#777777\"{HALO}>seeded</text>",
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
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            g.x_title.0,
            g.x_title.1,
            escape_xml(&g.x_title_text)
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
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#555555\">{TIME_TITLE}</text>",
                WIDTH as f64 - 4.0,
                // On the subtitle's line (which stops short of it), clear of the top tick.
                f.y0 - 12.0
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
        for ((x, _, c), mark) in g.marks.iter().zip(&panel.marks) {
            // A moment a diff compares, or an out-of-memory.
            let class = match mark.style {
                Style::Run(_) => "moment",
                _ => "oom",
            };
            let _ = writeln!(
                s,
                "<line class=\"{class}\" x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"{}\" stroke-width=\"2\"/>",
                f.y0,
                f.bottom(),
                hex(*c)
            );
        }
        // The markers' labels over every line (a white halo keeps them readable), one a row so
        // that markers close together do not write over each other, inside the plot area.
        for (i, (x, label, c)) in g.marks.iter().enumerate() {
            let end = *x > f.x0 + f.w * 0.7;
            let (anchor, dx, room) = if end {
                ("end", -4.0, x - 4.0 - f.x0)
            } else {
                ("start", 4.0, f.x0 + f.w - (x + 4.0))
            };
            let label = font::fit(label, 11.0, true, room, false);
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"{anchor}\" fill=\"{}\" font-weight=\"bold\"{HALO}>{}</text>",
                x + dx,
                f.y0 + 24.0 + 14.0 * (i % 12) as f64,
                hex(*c),
                escape_xml(&label)
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
            legend_label(&mut s, x, y, &line.label);
        }
        if panel.capacity.is_some()
            && let Some(&(x, y)) = slots.next()
        {
            let _ = writeln!(
                s,
                "<line x1=\"{x:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#000000\" stroke-dasharray=\"8 3 2 3\"/>",
                x + 22.0
            );
            legend_label(&mut s, x, y, &capacity_label(panel, &g));
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
            legend_label(&mut s, x, y, &line.label);
        }
        let _ = writeln!(s, "</g>");
        top += panel_height(panel);
    }
    s.push_str("</svg>\n");
    s
}
