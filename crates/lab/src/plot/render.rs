//! PNG output: the SVG the lab writes, rendered by resvg (usvg parses it, tiny-skia draws and
//! encodes the PNG), so both formats show the same picture. Its text is set in the embedded
//! DejaVu Sans (`font.rs`): no system font is looked up, so a machine with none (a CI container)
//! draws the same image. The font database answers both the family the SVGs name and
//! `sans-serif` with it.

use std::sync::{Arc, LazyLock};

use resvg::tiny_skia;
use resvg::usvg::{self, fontdb};

use super::font;

/// The embedded fonts: DejaVu Sans, regular and bold (titles and markers are bold).
static FONTS: LazyLock<Arc<fontdb::Database>> = LazyLock::new(|| {
    let mut db = fontdb::Database::new();
    for bytes in font::files() {
        db.load_font_source(fontdb::Source::Binary(Arc::new(bytes)));
    }
    db.set_sans_serif_family(font::FAMILY);
    Arc::new(db)
});

/// `svg` (one of the lab's documents) as a PNG file, at one pixel per SVG user unit.
pub(super) fn svg_to_png(svg: &str) -> Vec<u8> {
    let options = usvg::Options {
        font_family: font::FAMILY.into(),
        fontdb: Arc::clone(&FONTS),
        ..usvg::Options::default()
    };
    // Our own SVG: a parse error or a zero-sized image is a bug here, not bad input.
    let tree = usvg::Tree::from_str(svg, &options).expect("the lab's SVG parses");
    let size = tree.size().to_int_size();
    let mut pixmap =
        tiny_skia::Pixmap::new(size.width(), size.height()).expect("a non-empty image");
    resvg::render(
        &tree,
        tiny_skia::Transform::identity(),
        &mut pixmap.as_mut(),
    );
    pixmap.encode_png().expect("PNG encoding in memory")
}
