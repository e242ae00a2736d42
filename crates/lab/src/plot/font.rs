//! The plots' font: DejaVu Sans (regular and bold), embedded from the `dejavu` crate, and its
//! metrics, so the layout cuts text to the width it really takes (titles, legend entries, names)
//! rather than guessing a width a character. The PNG renderer loads the same bytes
//! (`render.rs`), and the SVGs name [`FAMILY`] first, so what is measured is what is drawn.

use skrifa::instance::{LocationRef, Size};
use skrifa::metrics::GlyphMetrics;
use skrifa::{FontRef, MetadataProvider as _};

/// The family the SVGs ask for first (then `sans-serif`, for viewers without it).
pub(super) const FAMILY: &str = "DejaVu Sans";

/// The font files: regular, then bold (titles and markers are bold). Never inlined: the bytes
/// are a constant in whatever code calls `dejavu`, so each inlined call would link a copy.
#[inline(never)]
pub(super) fn files() -> [&'static [u8]; 2] {
    [dejavu::sans::regular(), dejavu::sans::bold()]
}

/// One face at one size, to measure text with.
struct Face {
    charmap: skrifa::charmap::Charmap<'static>,
    metrics: GlyphMetrics<'static>,
}

impl Face {
    fn new(size: f64, bold: bool) -> Face {
        let font = FontRef::new(files()[usize::from(bold)]).expect("DejaVu Sans parses");
        Face {
            charmap: font.charmap(),
            metrics: font.glyph_metrics(Size::new(size as f32), LocationRef::default()),
        }
    }

    /// The advance of `c` (a character the font lacks: its missing-glyph box).
    fn advance(&self, c: char) -> f64 {
        let glyph = self.charmap.map(c).unwrap_or_default();
        f64::from(self.metrics.advance_width(glyph).unwrap_or(0.0))
    }
}

/// How wide `text` is set at `size` px (without kerning, which only narrows it).
pub(super) fn text_width(text: &str, size: f64, bold: bool) -> f64 {
    let face = Face::new(size, bold);
    text.chars().map(|c| face.advance(c)).sum()
}

/// `text` whole if it fits in `max` px at `size`, else its start and an ellipsis (`keep_end`:
/// an ellipsis and its end, where trace names differ) that fit.
pub(super) fn fit(text: &str, size: f64, bold: bool, max: f64, keep_end: bool) -> String {
    let face = Face::new(size, bold);
    let width: f64 = text.chars().map(|c| face.advance(c)).sum();
    if width <= max {
        return text.to_string();
    }
    let mut room = max - face.advance('…');
    let mut kept = Vec::new();
    let chars: Box<dyn Iterator<Item = char>> = if keep_end {
        Box::new(text.chars().rev())
    } else {
        Box::new(text.chars())
    };
    for c in chars {
        room -= face.advance(c);
        if room < 0.0 {
            break;
        }
        kept.push(c);
    }
    if keep_end {
        std::iter::once('…').chain(kept.into_iter().rev()).collect()
    } else {
        kept.into_iter().chain(std::iter::once('…')).collect()
    }
}
