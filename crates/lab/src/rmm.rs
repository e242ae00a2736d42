//! RMM `logging_resource_adaptor` CSV logs as [`Trace`]s (`reference/anchors.md` §1.5).
//!
//! Header `Thread,Time,Action,Pointer,Size,Stream`; one row per event; `Time` is `HH:MM:SS:us`
//! (wall clock, so a run past midnight wraps: a step back of more than 12 hours is taken as a new
//! day); `Pointer` and `Stream` are hex (`0x…`) or decimal; actions `allocate`, `free` and
//! `allocate failure`.
//!
//! - `allocate` → [`Op::Alloc`](crate::Op::Alloc), `free` → [`Op::Free`](crate::Op::Free) of
//!   the live allocation at that pointer; each allocation gets a fresh id (pointers are reused).
//! - A `free` of a pointer the log never allocated was allocated before logging began: it is
//!   seeded (allocated first, sized by the free's `Size`) and the trace is [`Kind::Partial`];
//!   otherwise [`Kind::Fresh`].
//! - `allocate failure` rows are not replayed (nothing was allocated); they are returned by
//!   [`from_bytes_with_failures`], and [`from_bytes`] appends their count to the trace's name
//!   (`log.csv (2 allocate failures not replayed)`).
//! - RMM records no reserved bytes: [`Trace::native`] is `None`. Threads are not kept.

use crate::model::{Kind, Source, Trace, Window};
use torch_arena::error::{Error, Result};

/// An `allocate failure` row: kept as a note, not replayed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocFailure {
    /// 1-based line number in the file.
    pub line: usize,
    pub size: u64,
    pub stream: u64,
    /// Microseconds since the first row.
    pub time_us: i64,
}

const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

/// Parse an RMM CSV log (already decompressed). The count of `allocate failure` rows, if any, is
/// appended to the trace's name.
pub fn from_bytes(name: &str, data: &[u8]) -> Result<Trace> {
    let (mut t, fails) = from_bytes_with_failures(name, data)?;
    if !fails.is_empty() {
        let n = fails.len();
        t.name = format!(
            "{name} ({n} allocate failure{} not replayed)",
            if n == 1 { "" } else { "s" }
        );
    }
    Ok(t)
}

/// Parse an RMM CSV log, returning the trace and its `allocate failure` rows. Errors name the
/// file and the line.
pub fn from_bytes_with_failures(name: &str, data: &[u8]) -> Result<(Trace, Vec<AllocFailure>)> {
    let text = std::str::from_utf8(data).map_err(|e| {
        let line = data[..e.valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1;
        Error::Trace(format!(
            "{name}:{line}: not UTF-8 text (byte {}); expected an RMM CSV log",
            e.valid_up_to()
        ))
    })?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.lines().enumerate();
    let header = lines.next().map(|(_, l)| l.trim()).unwrap_or("");
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    if cols.len() < 5 || cols[..5] != ["Thread", "Time", "Action", "Pointer", "Size"] {
        return Err(Error::Trace(format!(
            "{name}:1: header is '{header}'; expected '{HEADER}'"
        )));
    }
    let has_stream = cols.get(5) == Some(&"Stream");

    let mut window = Window::default();
    let mut fails = Vec::new();
    let mut t0: Option<i64> = None;
    let mut day = 0i64;
    let mut last = 0i64;
    for (i, raw) in lines {
        let lineno = i + 1;
        let l = raw.trim();
        if l.is_empty() {
            continue;
        }
        let err = |what: String| Error::Trace(format!("{name}:{lineno}: {what} (line '{l}')"));
        let f: Vec<&str> = l.split(',').map(str::trim).collect();
        let want = if has_stream { 6 } else { 5 };
        if f.len() != want {
            return Err(err(format!(
                "{} fields; expected {want} ({})",
                f.len(),
                &HEADER[..if has_stream {
                    HEADER.len()
                } else {
                    HEADER.len() - 7
                }]
            )));
        }
        let clock = parse_time(f[1])
            .ok_or_else(|| err(format!("time '{}' is not HH:MM:SS:microseconds", f[1])))?;
        // Wall clock: a large step back is the next day.
        let mut t = clock.saturating_add(day);
        if t0.is_some() && t < last - 12 * 3_600_000_000 {
            day = day.saturating_add(24 * 3_600_000_000);
            t = t.saturating_add(24 * 3_600_000_000);
        }
        last = t;
        let time_us = t.saturating_sub(*t0.get_or_insert(t));
        let size = f[4]
            .parse::<u64>()
            .map_err(|_| err(format!("size '{}' is not a byte count", f[4])))?;
        let stream = if has_stream {
            parse_uint(f[5])
                .ok_or_else(|| err(format!("stream '{}' is not a hex or decimal number", f[5])))?
        } else {
            0
        };
        let action = f[2];
        if action == "allocate failure" {
            fails.push(AllocFailure {
                line: lineno,
                size,
                stream,
                time_us,
            });
            continue;
        }
        let ptr = parse_uint(f[3]).ok_or_else(|| {
            err(format!(
                "pointer '{}' is not a hex or decimal address",
                f[3]
            ))
        })?;
        match action {
            "allocate" => window.alloc(ptr, size, stream, time_us, 0),
            "free" => window.free(ptr, size, stream, time_us),
            other => {
                return Err(err(format!(
                    "action '{other}'; expected 'allocate', 'free' or 'allocate failure'"
                )));
            }
        }
    }
    let (events, seeded) = window.finish();
    let trace = Trace {
        name: name.to_string(),
        source: Source::RmmCsv,
        kind: if seeded > 0 {
            Kind::Partial
        } else {
            Kind::Fresh
        },
        device: 0,
        seeded,
        events,
        sites: vec!["unknown".to_string()],
        native: None,
        steps: None,
    };
    Ok((trace, fails))
}

/// `HH:MM:SS:us` (also `HH:MM:SS.us`) → microseconds since midnight. Hours are at most a
/// million and microseconds at most a day's, so no later sum can overflow.
fn parse_time(s: &str) -> Option<i64> {
    let mut it = s.split([':', '.']);
    let h: i64 = it.next()?.parse().ok()?;
    let m: i64 = it.next()?.parse().ok()?;
    let sec: i64 = it.next()?.parse().ok()?;
    let us: i64 = it.next()?.parse().ok()?;
    if it.next().is_some()
        || !(0..60).contains(&m)
        || !(0..61).contains(&sec)
        || !(0..1_000_000).contains(&h)
        || !(0..86_400_000_000).contains(&us)
    {
        return None;
    }
    Some(((h * 60 + m) * 60 + sec) * 1_000_000 + us)
}

/// `0x…` hex, or decimal; a negative decimal (a stream `-1`) as its 64-bit two's complement:
/// streams and pointers are opaque 64-bit keys.
fn parse_uint(s: &str) -> Option<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None if s.starts_with('-') => s.parse::<i64>().ok().map(|i| i as u64),
        None => s.parse().ok(),
    }
}
