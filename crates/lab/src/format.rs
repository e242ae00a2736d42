//! The `torch-arena-trace` text format: what the plugin records with `trace:PATH`, and what
//! `torch-arena convert` writes. Specification: `docs/trace-format.md`.
//!
//! One record per line, so a reader streams it and a writer appends to it:
//!
//! ```text
//! torch-arena-trace 1
//! # anything after '#' at the start of a line is a comment
//! kind fresh
//! site 1 train.py:40 in step
//! a 0x7f0000000000 4096 0 0 17 1
//! f 0x7f0000000000 4096 0 0 42
//! reserved 0 20971520
//! ```
//!
//! `a ID SIZE STREAM DEVICE TIME_US [SITE]` allocates, `f ID SIZE STREAM DEVICE TIME_US` frees.
//! An `ID` is the device pointer at record time: an alloc and the free of the same pointer are
//! ordered in the file, so the reader gives every allocation its own id. Files starting with the
//! gzip magic bytes are decompressed on the fly.

use std::collections::HashMap;
use std::io::{self, BufRead, BufWriter, Write};
use std::path::Path;

use flate2::Compression;
use flate2::write::GzEncoder;
use torch_arena::error::{Error, Result};
use torch_arena::record::one_line;

use crate::model::{Kind, NativeReserved, Op, Source, Trace, Window};

pub use torch_arena::record::{MAGIC, VERSION};

fn err(path: &Path, line: usize, msg: impl std::fmt::Display) -> Error {
    Error::Trace(format!("{}:{line}: {msg}", path.display()))
}

/// Parses a number written in decimal or as `0x` hexadecimal.
fn num(s: &str) -> Option<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// The events of one device while reading: pointers become ids through the same [`Window`] as
/// every other importer (a free of a pointer never allocated in the file is seeded).
struct DeviceEvents {
    window: Window,
    native: Option<NativeReserved>,
}

impl Default for DeviceEvents {
    fn default() -> Self {
        DeviceEvents {
            // Ids from 1, as the recorder and `write` number them, so a written trace reads
            // back with the same ids.
            window: Window::starting_at(1),
            native: None,
        }
    }
}

/// Reads a `torch-arena-trace` file (plain or gzip, inflated under the parser budget,
/// [`super::pickle::inflate_budget`]). A multi-device recording keeps the device with the most
/// events. Every error names the file and, for bad content, the line.
///
/// A recording cut off (the process killed, the disk full) ends mid-line: that incomplete last
/// line, or the unreadable end of a gzip stream cut short, is dropped and the complete lines
/// before it are read; the warning saying so is logged ([`read_with_warnings`] returns it).
pub fn read(path: &Path) -> Result<Trace> {
    let (trace, warnings) = read_with_warnings(path)?;
    log_warnings(&warnings);
    Ok(trace)
}

/// [`read`], and the warnings about what was dropped instead of logging them.
pub fn read_with_warnings(path: &Path) -> Result<(Trace, Vec<String>)> {
    let input = crate::input::open(path)?;
    read_from(path, input)
}

pub(crate) fn log_warnings(warnings: &[String]) {
    for w in warnings {
        tracing::warn!("{w}");
    }
}

/// The warning for a file cut off mid-line at line `lineno`: `what` was dropped.
fn cut_off(path: &Path, lineno: usize, what: &str) -> String {
    let complete = lineno.saturating_sub(1);
    format!(
        "{}:{lineno}: the trace was cut off (a recording stopped by a kill or a full disk, or \
         an incomplete copy): {what} dropped; replaying the {complete} complete line{} before it",
        path.display(),
        if complete == 1 { "" } else { "s" }
    )
}

/// Reads a `torch-arena-trace` stream; `path` names it in errors and gives the trace its name.
/// Returns the trace and the warnings about a cut-off end that was dropped.
pub(crate) fn read_from(
    path: &Path,
    mut input: Box<dyn BufRead + '_>,
) -> Result<(Trace, Vec<String>)> {
    let mut warnings = Vec::new();
    let mut devices: HashMap<i32, DeviceEvents> = HashMap::new();
    let mut site_ids: HashMap<u64, u32> = HashMap::new();
    let mut sites = vec!["unknown".to_string()];
    let mut kind = Kind::Fresh;
    let mut seeded = 0usize;
    let mut buf = String::new();
    let mut lineno = 0usize;
    loop {
        buf.clear();
        lineno += 1;
        let n = match input.read_line(&mut buf) {
            Ok(n) => n,
            // A gzip stream that ends early: what it held up to the cut was read; the line in
            // progress is incomplete.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && lineno > 1 => {
                warnings.push(cut_off(
                    path,
                    lineno,
                    &format!(
                        "the gzip stream ends early: its incomplete last line ({} bytes) and \
                         the rest",
                        buf.len()
                    ),
                ));
                break;
            }
            Err(e) => {
                let what = if e.kind() == io::ErrorKind::InvalidData {
                    "not UTF-8 text, or corrupt compressed data".to_string()
                } else {
                    format!("read failed ({e}); the file may be truncated")
                };
                return Err(err(path, lineno, what));
            }
        };
        if n == 0 {
            if lineno == 1 {
                return Err(err(
                    path,
                    1,
                    format!("empty file: expected the header '{MAGIC} {VERSION}'"),
                ));
            }
            break;
        }
        // Every line is written with its newline: a last line without one is a record cut
        // short (`a 0x10 4096` may have been `a 0x10 40960 ...`), never to be trusted.
        if !buf.ends_with('\n') && lineno > 1 {
            warnings.push(cut_off(
                path,
                lineno,
                &format!(
                    "1 incomplete line at the end ({} bytes, no newline)",
                    buf.len()
                ),
            ));
            break;
        }
        let line = buf.trim_end_matches(['\n', '\r']);
        let bad = |msg: String| err(path, lineno, msg);
        if lineno == 1 {
            let mut words = line.split_whitespace();
            if words.next() != Some(MAGIC) {
                return Err(err(
                    path,
                    1,
                    format!("not a torch-arena trace: expected the header '{MAGIC} {VERSION}'"),
                ));
            }
            let version = words
                .next()
                .and_then(|v| v.parse::<u32>().ok())
                .ok_or_else(|| {
                    err(
                        path,
                        1,
                        format!("bad header {line:?}: expected '{MAGIC} {VERSION}'"),
                    )
                })?;
            if version > VERSION {
                return Err(err(
                    path,
                    1,
                    format!(
                        "version {version} is newer than this torch-arena reads ({VERSION}); \
                         upgrade torch-arena"
                    ),
                ));
            }
            if version == 0 {
                return Err(err(path, 1, "version 0 does not exist"));
            }
            continue;
        }
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match word {
            "a" | "f" => {
                let f: Vec<&str> = rest.split_whitespace().collect();
                let expect = if word == "a" { 5..=6 } else { 5..=5 };
                if !expect.contains(&f.len()) {
                    return Err(bad(format!(
                        "'{word}' needs {} fields, found {}: {line:?}",
                        if word == "a" {
                            "ID SIZE STREAM DEVICE TIME_US [SITE]"
                        } else {
                            "ID SIZE STREAM DEVICE TIME_US"
                        },
                        f.len()
                    )));
                }
                let field = |i: usize, name: &str| {
                    num(f[i]).ok_or_else(|| bad(format!("bad {name} {:?} in {line:?}", f[i])))
                };
                let ptr = field(0, "ID")?;
                let size = field(1, "SIZE")?;
                let stream = field(2, "STREAM")?;
                let device = f[3]
                    .parse::<i32>()
                    .map_err(|_| bad(format!("bad DEVICE {:?} in {line:?}", f[3])))?;
                let time_us = f[4]
                    .parse::<i64>()
                    .map_err(|_| bad(format!("bad TIME_US {:?} in {line:?}", f[4])))?;
                let d = devices.entry(device).or_default();
                if word == "a" {
                    let site = match f.get(5) {
                        None => 0,
                        Some(_) => {
                            let s = field(5, "SITE")?;
                            if s == 0 {
                                0
                            } else {
                                *site_ids.get(&s).ok_or_else(|| {
                                    err(
                                        path,
                                        lineno,
                                        format!("site {s} is used before its 'site {s} TEXT' line"),
                                    )
                                })?
                            }
                        }
                    };
                    if d.window.live.contains_key(&ptr) {
                        return Err(err(
                            path,
                            lineno,
                            format!(
                                "pointer {ptr:#x} on device {device} is allocated again while \
                                 still live (no free since its last alloc)"
                            ),
                        ));
                    }
                    d.window.alloc(ptr, size, stream, time_us, site);
                } else {
                    // A free of a pointer allocated before recording began is seeded, as in
                    // every importer: allocated before event 0 with the free's size.
                    d.window.free(ptr, size, stream, time_us);
                }
            }
            "site" => {
                let (id, text) = rest.split_once(' ').unwrap_or((rest, ""));
                let id = num(id).filter(|&i| i > 0).ok_or_else(|| {
                    bad(format!(
                        "bad site id in {line:?}: expected 'site N TEXT' with N > 0"
                    ))
                })?;
                let index =
                    u32::try_from(sites.len()).map_err(|_| err(path, lineno, "too many sites"))?;
                if site_ids.insert(id, index).is_some() {
                    return Err(err(path, lineno, format!("site {id} is defined twice")));
                }
                sites.push(text.to_string());
            }
            "reserved" | "reserved-peak" => {
                let f: Vec<&str> = rest.split_whitespace().collect();
                let parsed = match f.as_slice() {
                    [d, b] => d.parse::<i32>().ok().zip(num(b)),
                    _ => None,
                };
                let (device, bytes) = parsed.ok_or_else(|| {
                    bad(format!("bad line {line:?}: expected '{word} DEVICE BYTES'"))
                })?;
                let d = devices.entry(device).or_default();
                let at = d.window.events.len();
                match (&mut d.native, word) {
                    (Some(n), "reserved") => n.changes.push((at, bytes)),
                    (None, "reserved") if at == 0 => {
                        d.native = Some(NativeReserved {
                            initial: bytes,
                            ..Default::default()
                        })
                    }
                    (None, "reserved") => {
                        d.native = Some(NativeReserved {
                            changes: vec![(at, bytes)],
                            ..Default::default()
                        })
                    }
                    _ => {}
                }
                let n = d.native.get_or_insert_with(Default::default);
                n.peak = n.peak.max(bytes);
            }
            "kind" => {
                kind = match rest.trim() {
                    "fresh" => Kind::Fresh,
                    "partial" => Kind::Partial,
                    "warm" => Kind::Warm,
                    "state" => Kind::StateOnly,
                    other => {
                        return Err(bad(format!(
                            "unknown kind {other:?}: expected fresh, partial, warm or state"
                        )));
                    }
                }
            }
            "seeded" => {
                seeded = rest
                    .trim()
                    .parse()
                    .map_err(|_| bad(format!("bad line {line:?}: expected 'seeded N'")))?;
            }
            _ => {
                return Err(bad(format!(
                    "unknown record {word:?}: expected a, f, site, reserved, reserved-peak, kind, seeded or a \
                     '#' comment"
                )));
            }
        }
    }
    let (device, d) = devices
        .into_iter()
        .max_by_key(|(dev, d)| (d.window.events.len(), std::cmp::Reverse(*dev)))
        .unwrap_or((0, DeviceEvents::default()));
    if seeded > d.window.events.len() {
        return Err(Error::Trace(format!(
            "{}: 'seeded {seeded}' is more than the {} events of device {device}",
            path.display(),
            d.window.events.len()
        )));
    }
    // Frees of pointers the file never allocated were seeded: they go first.
    let new_seeds = d.window.seeds.len();
    let mut native = d.native;
    if let Some(n) = native.as_mut() {
        for c in &mut n.changes {
            c.0 += new_seeds;
        }
    }
    if new_seeds > 0 && kind == Kind::Fresh {
        kind = Kind::Partial;
    }
    let (events, _) = d.window.finish();
    let seeded = seeded + new_seeds;
    let trace = Trace {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string()),
        source: Source::Arena(VERSION),
        kind,
        device,
        seeded,
        events,
        sites,
        native,
        steps: None,
    };
    Ok((trace, warnings))
}

/// Writes `trace` to `path` (gzip when the name ends in `.gz`). Ids are written as they are:
/// unique per allocation, so reading the file back gives the same events.
///
/// The file is replaced atomically ([`torch_arena::atomic_file`]): a write that fails (a full disk) or
/// a process killed part-way leaves the old file as it was.
pub fn write(trace: &Trace, path: &Path) -> Result<()> {
    let fail = |e: io::Error| Error::Trace(format!("cannot write trace {}: {e}", path.display()));
    let gz = path.extension().is_some_and(|e| e == "gz");
    torch_arena::atomic_file::write(path, |file| {
        if gz {
            let mut out = BufWriter::new(GzEncoder::new(file, Compression::default()));
            write_body(trace, &mut out)?;
            // `finish` writes the gzip trailer and reports its error (a drop would ignore it).
            out.into_inner()
                .map_err(io::IntoInnerError::into_error)?
                .finish()?;
        } else {
            write_body(trace, file)?;
        }
        Ok(())
    })
    .map_err(fail)
}

fn write_body(trace: &Trace, out: &mut dyn Write) -> io::Result<()> {
    let d = trace.device;
    writeln!(out, "{MAGIC} {VERSION}")?;
    writeln!(out, "# {}", one_line(&trace.name))?;
    writeln!(out, "kind {}", trace.kind.as_str())?;
    if trace.seeded > 0 {
        writeln!(out, "seeded {}", trace.seeded)?;
    }
    for (i, s) in trace.sites.iter().enumerate().skip(1) {
        writeln!(out, "site {i} {}", one_line(s))?;
    }
    let mut changes = [].iter().peekable();
    if let Some(n) = &trace.native {
        writeln!(out, "reserved {d} {}", n.initial)?;
        changes = n.changes.iter().peekable();
    }
    for (i, e) in trace.events.iter().enumerate() {
        while let Some(&&(at, bytes)) = changes.peek() {
            if at > i {
                break;
            }
            writeln!(out, "reserved {d} {bytes}")?;
            changes.next();
        }
        match e.op {
            Op::Alloc if e.site != 0 => writeln!(
                out,
                "a {:#x} {} {} {d} {} {}",
                e.id, e.size, e.stream, e.time_us, e.site
            )?,
            Op::Alloc => writeln!(
                out,
                "a {:#x} {} {} {d} {}",
                e.id, e.size, e.stream, e.time_us
            )?,
            Op::Free => writeln!(
                out,
                "f {:#x} {} {} {d} {}",
                e.id, e.size, e.stream, e.time_us
            )?,
        }
    }
    for &(_, bytes) in changes {
        writeln!(out, "reserved {d} {bytes}")?;
    }
    if let Some(n) = &trace.native {
        writeln!(out, "reserved-peak {d} {}", n.peak)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::num;

    #[test]
    fn numbers_in_decimal_and_hex() {
        assert_eq!(num("42"), Some(42));
        assert_eq!(num("0x2a"), Some(42));
        assert_eq!(num("x"), None);
    }
}
