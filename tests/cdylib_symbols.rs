//! The cdylib PyTorch loads carries the plugin only: no code of the lab (trace importers and the
//! unpickler, the native emulation, replay, fit, plots) and none of the libraries only the lab
//! and the command use (flate2, plotters, indicatif, resvg and the font it draws with). Its
//! symbol table and strings are searched as bytes, so a mangled name, a panic location or a
//! message from the lab would all be found.

#[path = "common/cdylib.rs"]
mod cdylib;

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[test]
fn the_cdylib_links_none_of_the_lab() {
    let path = cdylib::cdylib();
    let bytes = std::fs::read(&path).unwrap();
    // What must be there: the exports PyTorch calls, and the plugin's own modules by name.
    for here in [
        "torch_arena_malloc",
        "torch_arena_free",
        "torch_arena::arena",
        "Recorder",
    ] {
        assert!(contains(&bytes, here), "{} lacks `{here}`", path.display());
    }
    // The lab's crate, its unpickler, and the libraries only the lab and the command link
    // (flate2 and its deflate side; std's own inflate is for debug info, not ours).
    for absent in [
        "torch_arena_lab",
        "crates/lab/",
        "unpickl",
        "plotters",
        "indicatif",
        "flate2",
        "miniz_oxide::deflate",
        "resvg",
        "usvg",
        "tiny_skia",
        "skrifa",
        "DejaVu",
    ] {
        assert!(
            !contains(&bytes, absent),
            "{} contains `{absent}`",
            path.display()
        );
    }
}
