//! Progress on stderr, drawn by indicatif: a bar with a rate and an ETA, and a spinner for work
//! that reports no progress. Shown when stderr is a terminal or `--progress` asks for it.

use std::io::{self, IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressDrawTarget, ProgressState, ProgressStyle, TermLike};

use crate::text::fmt_rate;

/// Whether progress goes to stderr unless told.
pub(crate) fn stderr_is_terminal() -> bool {
    io::stderr().is_terminal()
}

/// stderr as indicatif's terminal, drawn to whether or not it is one (indicatif's own stderr
/// target hides itself when stderr is not a terminal, which would ignore `--progress`). One
/// line, redrawn in place with ANSI sequences.
#[derive(Debug)]
struct Stderr;

impl Stderr {
    fn ansi(&self, n: usize, code: char) -> io::Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.write_str(&format!("\x1b[{n}{code}"))
    }
}

impl TermLike for Stderr {
    fn width(&self) -> u16 {
        100
    }
    fn move_cursor_up(&self, n: usize) -> io::Result<()> {
        self.ansi(n, 'A')
    }
    fn move_cursor_down(&self, n: usize) -> io::Result<()> {
        self.ansi(n, 'B')
    }
    fn move_cursor_right(&self, n: usize) -> io::Result<()> {
        self.ansi(n, 'C')
    }
    fn move_cursor_left(&self, n: usize) -> io::Result<()> {
        self.ansi(n, 'D')
    }
    fn write_line(&self, s: &str) -> io::Result<()> {
        writeln!(io::stderr().lock(), "{s}")
    }
    fn write_str(&self, s: &str) -> io::Result<()> {
        io::stderr().lock().write_all(s.as_bytes())
    }
    fn clear_line(&self) -> io::Result<()> {
        self.write_str("\r\x1b[2K")
    }
    fn flush(&self) -> io::Result<()> {
        io::stderr().flush()
    }
}

/// stderr, drawn to at most ten times a second.
fn target() -> ProgressDrawTarget {
    ProgressDrawTarget::term_like_with_hz(Box::new(Stderr), 10)
}

/// A progress line: label, bar, percent, how many of what per second, ETA. Nothing is drawn
/// until the work has taken a quarter of a second; the line is erased when dropped.
pub(crate) struct ProgressBar {
    bar: indicatif::ProgressBar,
    enabled: bool,
    shown: bool,
    start: Instant,
}

impl ProgressBar {
    pub(crate) fn new(enabled: bool, label: String) -> Self {
        let bar = ProgressBar {
            // Hidden until the first update that comes a quarter of a second in.
            bar: indicatif::ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::hidden()),
            enabled,
            shown: false,
            start: Instant::now(),
        }
        .counting("events");
        bar.bar.set_message(shorten(&label, 48));
        bar
    }

    /// The same bar, counting `unit` instead of events.
    pub(crate) fn counting(self, unit: &'static str) -> Self {
        let template =
            format!("{{msg}} [{{bar:24}}] {{percent:>3}} %  {{rate}} {unit}/s  ETA {{eta}}");
        let rate = |s: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = w.write_str(&fmt_rate(s.per_sec()));
        };
        self.bar.set_style(
            ProgressStyle::with_template(&template)
                .expect("a valid template")
                .with_key("rate", rate)
                .progress_chars("#-"),
        );
        self
    }

    pub(crate) fn update(&mut self, done: usize, total: usize) {
        if !self.enabled {
            return;
        }
        if !self.shown {
            if self.start.elapsed() < Duration::from_millis(250) {
                return;
            }
            self.bar.set_draw_target(target());
            self.shown = true;
        }
        self.bar.set_length(total as u64);
        self.bar.set_position(done as u64);
    }

    /// Runs `f` (which prints to stdout) with the line erased, then draws it again.
    pub(crate) fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bar.suspend(f)
    }
}

impl Drop for ProgressBar {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// Run `f`; while it runs and progress is on, show "`what` NAME… 1s" on stderr (erased at the
/// end).
pub(crate) fn with_spinner<T>(enabled: bool, what: &str, name: &str, f: impl FnOnce() -> T) -> T {
    if !enabled {
        return f();
    }
    let spinner = indicatif::ProgressBar::with_draw_target(None, target());
    spinner.set_style(ProgressStyle::with_template("{msg}… {elapsed}").expect("a valid template"));
    spinner.set_message(format!("{what} {}", shorten(name, 60)));
    spinner.enable_steady_tick(Duration::from_millis(200));
    let out = f();
    spinner.finish_and_clear();
    out
}

/// `s` cut to `max` characters, keeping its end (a file name's end tells traces apart).
pub(crate) fn shorten(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    let tail: String = s.chars().skip(n - (max - 1)).collect();
    format!("…{tail}")
}
