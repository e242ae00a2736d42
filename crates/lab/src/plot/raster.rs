//! The panels as PNG: a tiny rasterizer on an RGB buffer, a built-in 5x7 bitmap font, and the
//! PNG container around a zlib stream, with our own CRC-32.

use super::layout::*;
use std::io::Write as _;

// ---------------------------------------------------------------------------------------------
// PNG

/// An RGB image.
pub(super) struct Canvas {
    w: u32,
    h: u32,
    px: Vec<u8>,
}

impl Canvas {
    pub(super) fn new(w: u32, h: u32) -> Canvas {
        Canvas {
            w,
            h,
            px: vec![0xff; w as usize * h as usize * 3],
        }
    }

    /// Fills the rectangle from (x0, y0) to (x1, y1).
    pub(super) fn fill(&mut self, (x0, y0): (f64, f64), (x1, y1): (f64, f64), c: [u8; 3]) {
        for y in y0.round() as i64..y1.round() as i64 {
            for x in x0.round() as i64..x1.round() as i64 {
                self.set(x, y, c);
            }
        }
    }

    pub(super) fn set(&mut self, x: i64, y: i64, c: [u8; 3]) {
        if x < 0 || y < 0 || x >= self.w as i64 || y >= self.h as i64 {
            return;
        }
        let i = (y as usize * self.w as usize + x as usize) * 3;
        self.px[i..i + 3].copy_from_slice(&c);
    }

    /// A line `width` pixels thick (a square brush), Bresenham; `dash` = (on, off) pixels.
    pub(super) fn line(
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
    pub(super) fn text(&mut self, x: f64, y: f64, text: &str, c: [u8; 3], scale: i64) {
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
pub(super) fn text_width(text: &str, scale: i64) -> f64 {
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

pub(super) fn encode_png(cv: &Canvas) -> Vec<u8> {
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
pub(super) fn crc32(bytes: &[u8]) -> u32 {
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
