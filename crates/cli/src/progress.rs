//! Progress on stderr: a bar with a rate and an ETA, and a spinner for work that reports no
//! progress.

use std::io::Write;
use std::sync::mpsc;

use crate::text::fmt_rate;

use std::time::{Duration, Instant};

/// Whether progress goes to stderr.
pub(crate) fn stderr_is_terminal() -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(2) == 1 }
}

/// The time left at the rate so far, as "ETA 12 s", "ETA 3 min 5 s" ("" before any progress).
pub(crate) fn eta_text(done: usize, total: usize, elapsed: Duration) -> String {
    if done == 0 || done >= total {
        return String::new();
    }
    let left = elapsed.as_secs_f64() * (total - done) as f64 / done as f64;
    let secs = left.ceil() as u64;
    if secs < 60 {
        format!("ETA {secs} s")
    } else if secs < 3600 {
        format!("ETA {} min {} s", secs / 60, secs % 60)
    } else {
        format!("ETA {} h {} min", secs / 3600, secs % 3600 / 60)
    }
}

/// A `\r`-redrawn progress line: trace name, bar, percent, events per second, ETA. Drawn only after
/// the work has taken a moment, at most ten times a second, and erased when dropped.
pub(crate) struct ProgressBar {
    pub(crate) enabled: bool,
    pub(crate) label: String,
    pub(crate) start: Instant,
    pub(crate) last: Option<Instant>,
    pub(crate) width: usize,
    /// What is counted, for the rate ("events").
    pub(crate) unit: &'static str,
}

impl ProgressBar {
    pub(crate) fn new(enabled: bool, label: String) -> Self {
        ProgressBar {
            enabled,
            label: shorten(&label, 48),
            start: Instant::now(),
            last: None,
            width: 0,
            unit: "events",
        }
    }

    /// The same bar, counting `unit` instead of events.
    pub(crate) fn counting(mut self, unit: &'static str) -> Self {
        self.unit = unit;
        self
    }

    pub(crate) fn update(&mut self, done: usize, total: usize) {
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        let since_start = now - self.start;
        if since_start < Duration::from_millis(250)
            || self
                .last
                .is_some_and(|l| now - l < Duration::from_millis(100))
        {
            return;
        }
        self.last = Some(now);
        let frac = if total == 0 {
            1.0
        } else {
            (done as f64 / total as f64).min(1.0)
        };
        const BAR: usize = 24;
        let filled = (frac * BAR as f64).round() as usize;
        let rate = done as f64 / since_start.as_secs_f64().max(1e-9);
        let line = format!(
            "{} [{}{}] {:>5.1} %  {} {}/s  {}",
            self.label,
            "#".repeat(filled),
            "-".repeat(BAR - filled),
            frac * 100.0,
            fmt_rate(rate),
            self.unit,
            eta_text(done, total, since_start)
        );
        let pad = self.width.saturating_sub(line.chars().count());
        self.width = self.width.max(line.chars().count());
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{line}{}", " ".repeat(pad));
        let _ = err.flush();
    }
}

impl ProgressBar {
    /// Erase the line (before other output); the next update draws it again.
    pub(crate) fn clear(&mut self) {
        if self.width > 0 {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r{}\r", " ".repeat(self.width));
            let _ = err.flush();
            self.width = 0;
        }
    }
}

impl Drop for ProgressBar {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Run `f`; if it takes longer than a moment and progress is on, show "`what` NAME… 1.2 s" on
/// stderr meanwhile (erased at the end).
pub(crate) fn with_spinner<T: Send>(
    enabled: bool,
    what: &str,
    name: &str,
    f: impl FnOnce() -> T,
) -> T {
    if !enabled {
        return f();
    }
    let (tx, rx) = mpsc::channel::<()>();
    let name = shorten(name, 60);
    std::thread::scope(|s| {
        s.spawn(move || {
            let start = Instant::now();
            let mut width = 0;
            while let Err(mpsc::RecvTimeoutError::Timeout) =
                rx.recv_timeout(Duration::from_millis(200))
            {
                if start.elapsed() < Duration::from_millis(400) {
                    continue;
                }
                let line = format!("{what} {name}… {:.1} s", start.elapsed().as_secs_f64());
                width = width.max(line.chars().count());
                let _ = write!(std::io::stderr(), "\r{line}");
                let _ = std::io::stderr().flush();
            }
            if width > 0 {
                let _ = write!(std::io::stderr(), "\r{}\r", " ".repeat(width));
                let _ = std::io::stderr().flush();
            }
        });
        let out = f();
        drop(tx);
        out
    })
}

pub(crate) fn shorten(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    let tail: String = s.chars().skip(n - (max - 1)).collect();
    format!("…{tail}")
}
