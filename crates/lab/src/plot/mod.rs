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
//! A panel can count x as a share instead ([`XAxis::Percent`]): `torch-arena diff` draws two runs
//! of different lengths on one axis that way, each in a [`Style::Run`] colour, with the moment
//! each side was taken at marked.
//!
//! For many traces, [`overview_svg`] / [`overview_png`] draw one row per trace instead (ours /
//! native peak reserved, ours / native modelled driver time), so a sweep is one readable chart.
//!
//! Two outputs of one picture: SVG, written here by hand (text: polylines, ticks, a legend under
//! each panel, a title), and PNG, that same SVG rendered by resvg with an embedded DejaVu Sans
//! (`render.rs`, `font.rs`), so a PNG looks like the SVG on a machine without any fonts.

use std::path::Path;

use torch_arena::error::{Error, Result};

mod font;
mod layout;
mod overview;
mod render;
mod svg;

pub use layout::{
    ACCEPTED_EXTENSIONS, Format, Line, Mark, Panel, Style, TimeLine, XAxis, seconds_label,
};
pub use overview::{OverviewRow, overview_png, overview_svg, write_overview};
pub use svg::svg;

/// The panels as a PNG file: [`svg`] rendered.
pub fn png(panels: &[Panel]) -> Vec<u8> {
    render::svg_to_png(&svg(panels))
}

/// Draw `panels` into `path`, as SVG or PNG by its extension.
pub fn write(path: &Path, panels: &[Panel]) -> Result<()> {
    let bytes = match Format::from_path(path)? {
        Format::Svg => svg(panels).into_bytes(),
        Format::Png => png(panels),
    };
    torch_arena::atomic_file::write(path, |w| w.write_all(&bytes))
        .map_err(|e| Error::Trace(format!("cannot write plot '{}': {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::layout::*;
    use super::overview::ov_height;
    use super::*;

    fn sample() -> Vec<Panel> {
        vec![
            Panel {
                title: "a <trace> & more".into(),
                subtitle: "modelled driver time: 1 ms".into(),
                events: 100,
                capacity: Some(96 * MIB),
                seeded: 10,
                x_axis: XAxis::Events,
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
        assert!(font::text_width(&g.title_text, 14.0, true) <= g.frame.w + RIGHT - 4.0);
        assert!(font::text_width(&long[..shown - 1], 14.0, true) > g.frame.w + RIGHT - 40.0);
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

    /// A PNG file's pixels, as RGB (the images are opaque), and its size.
    struct Pixels {
        w: u32,
        h: u32,
        rgba: Vec<u8>,
    }

    impl Pixels {
        fn decode(file: &[u8]) -> Pixels {
            let p = resvg::tiny_skia::Pixmap::decode_png(file).expect("the PNG decodes");
            Pixels {
                w: p.width(),
                h: p.height(),
                rgba: p.data().to_vec(),
            }
        }

        fn at(&self, x: usize, y: usize) -> [u8; 3] {
            let i = (y * self.w as usize + x) * 4;
            assert_eq!(self.rgba[i + 3], 0xff, "opaque at ({x}, {y})");
            [self.rgba[i], self.rgba[i + 1], self.rgba[i + 2]]
        }

        /// Pixels in `xs` × `ys` that are not the white background.
        fn inked(&self, xs: std::ops::Range<usize>, ys: std::ops::Range<usize>) -> usize {
            ys.flat_map(|y| xs.clone().map(move |x| (x, y)))
                .filter(|&(x, y)| self.at(x, y) != [0xff; 3])
                .count()
        }
    }

    /// Each channel of `got` within `tol` of `want` (lines are anti-aliased).
    fn near(got: [u8; 3], want: [u8; 3], tol: u8) -> bool {
        got.iter().zip(want).all(|(g, w)| g.abs_diff(w) <= tol)
    }

    #[test]
    fn png_is_valid_and_draws_the_lines() {
        let panels = sample();
        let file = png(&panels);
        assert_eq!(&file[..8], b"\x89PNG\r\n\x1a\n");
        let cs = chunks(&file);
        assert_eq!(&cs[0].0, b"IHDR");
        assert_eq!(&cs.last().unwrap().0, b"IEND");
        assert!(cs.iter().any(|c| &c.0 == b"IDAT"));
        let ihdr = &cs[0].1;
        let w = u32::from_be_bytes(ihdr[0..4].try_into().unwrap());
        let h = u32::from_be_bytes(ihdr[4..8].try_into().unwrap());
        assert_eq!((w, h), (WIDTH, image_height(&panels)));
        assert_eq!(ihdr[8], 8, "8 bits a channel");
        let px = Pixels::decode(&file);
        assert_eq!((px.w, px.h), (w, h));
        // The arena line at 50 MiB on a 0..80 MiB axis (ticks of 16 MiB), at event 75.
        let g = geometry(&panels[0], 0.0);
        let (x, y) = (
            g.frame.x(75).round() as usize,
            g.frame.y(50 * MIB).round() as usize,
        );
        let c = color(Style::Arena(0));
        assert!(
            (y - 1..=y + 1).any(|y| near(px.at(x, y), c, 64)),
            "{:?}",
            px.at(x, y)
        );
        assert_eq!(px.at(5, 5), [0xff; 3], "background");
        // The y axis, in the second panel too: black, anti-aliased over two columns.
        let g2 = geometry(&panels[1], panel_height(&panels[0]));
        let mid = ((g2.frame.y0 + g2.frame.bottom()) / 2.0).round() as usize;
        let x0 = g2.frame.x0.round() as usize;
        assert!(
            (x0 - 1..=x0).any(|x| near(px.at(x, mid), [0; 3], 0x90)),
            "{:?}",
            px.at(x0, mid)
        );
    }

    #[test]
    fn png_draws_the_titles_text() {
        // The title's box: from its x to 300 px right, its cap height above the baseline.
        let title_box = |g: &PanelGeometry| {
            let (x, y) = (g.title.0 as usize, g.title.1 as usize);
            (x..x + 300, y - 12..y + 2)
        };
        let with = Panel::new("Reserved bytes over the trace", 100, vec![]);
        let without = Panel::new("", 100, vec![]);
        let g = geometry(&with, 0.0);
        let (xs, ys) = title_box(&g);
        let inked = Pixels::decode(&png(&[with])).inked(xs.clone(), ys.clone());
        assert!(inked > 300, "the title is drawn: {inked} pixels of ink");
        let blank = Pixels::decode(&png(&[without])).inked(xs, ys);
        assert_eq!(blank, 0, "nothing else is drawn there");

        // The overview's title too, at (10, 22).
        let rows = [OverviewRow {
            name: "t".into(),
            reserved_ratio: Some(1.0),
            driver_ratio: Some(1.0),
            note: String::new(),
        }];
        let inked = Pixels::decode(&overview_png("An overview", &rows)).inked(10..200, 10..24);
        assert!(inked > 100, "the overview's title is drawn: {inked}");
        let blank = Pixels::decode(&overview_png("", &rows)).inked(10..200, 10..24);
        assert_eq!(blank, 0);
    }

    /// A share axis (`torch-arena diff`): ticks 0 % to 100 % of `events`, the title given, and
    /// the compared moments drawn as moments, not out-of-memory markers.
    #[test]
    fn a_percent_axis_and_moment_marks() {
        let p = Panel {
            marks: vec![Mark {
                event: 2_500,
                label: "A: peak".into(),
                style: Style::Run(0),
            }],
            x_axis: XAxis::Percent("share of each run's events".into()),
            ..Panel::new(
                "A vs B",
                10_000,
                vec![
                    Line {
                        label: "A".into(),
                        style: Style::Run(0),
                        points: vec![(0, 0), (2_500, 40 * MIB), (10_000, 0)],
                    },
                    Line {
                        label: "B".into(),
                        style: Style::Run(1),
                        points: vec![(0, 0), (5_000, 60 * MIB), (10_000, 0)],
                    },
                ],
            )
        };
        let text = svg(std::slice::from_ref(&p));
        check_balanced(&text);
        for s in [
            ">0%<",
            ">50%<",
            ">100%<",
            ">share of each run&apos;s events<",
        ] {
            assert!(text.contains(s), "svg lacks {s:?}");
        }
        assert!(!text.contains(">event<"));
        assert_eq!(text.matches("class=\"moment\"").count(), 1);
        assert!(!text.contains("class=\"oom\""));
        assert!(text.contains("#1f77b4") && text.contains("#ff7f0e"));
        assert!(png(&[p]).starts_with(b"\x89PNG"));
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
