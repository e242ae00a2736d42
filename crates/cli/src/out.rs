//! The command's output: `outln!`/`out!` (stdout, a failed write an error, never a panic),
//! `errln!` (stderr, never a panic), and the failure type every command returns.

use std::io::Write as _;

/// `println!` for the command's output: a failed write to stdout (a full disk behind `>`, a
/// closed descriptor) returns an error for `main` to report in one line, where `println!` would
/// panic. Use as `outln!(...)?`.
macro_rules! outln {
    () => {
        $crate::out::write_stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::out::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` as [`outln!`] does it.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::write_stdout(format_args!($($arg)*))
    };
}

/// `eprintln!` that never panics: when stderr itself cannot be written there is nowhere left to
/// report it (the exit status still says whether the command succeeded).
macro_rules! errln {
    ($($arg:tt)*) => {{
        let _ = std::io::Write::write_fmt(
            &mut std::io::stderr(),
            format_args!("{}\n", format_args!($($arg)*)),
        );
    }};
}

/// A failure: the message (without the `torch-arena: ` prefix), printed on stderr, exit 1.
pub(crate) type CliResult<T> = Result<T, String>;

/// Writes to stdout; an error becomes the command's failure (see [`outln!`]).
pub(crate) fn write_stdout(args: std::fmt::Arguments<'_>) -> CliResult<()> {
    std::io::stdout()
        .lock()
        .write_fmt(args)
        .map_err(stdout_error)
}

pub(crate) fn stdout_error(e: std::io::Error) -> String {
    format!("error writing to stdout: {e}")
}
