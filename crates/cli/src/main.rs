//! The `torch-arena` command: replay allocation traces through the arena on a simulated GPU and
//! compare it with PyTorch's native caching allocator.
//!
//! - `replay TRACE...`: load each trace (ours, a PyTorch snapshot, an RMM log, or a synthetic
//!   `synth:` spec), replay it under every `--conf`, optionally emulate the native allocator
//!   (`--native`), and print a table per trace (or JSON lines with `--json`), the report of any
//!   out-of-memory, and a plot (`--plot`).
//! - `fit TRACE...`: the smallest simulated device on which each trace runs with no
//!   out-of-memory, for the arena (each `--conf`) and the native allocator (each
//!   `--native-conf`), and the last step's cost there.
//! - `synth KIND -o FILE`: write a synthetic trace.
//! - `demo`: replay the training-loop trace the project ships and explain the result;
//!   `demo --model` runs the modelled training loop directly (how that trace is recorded).
//!
//! Exit status: 0 when everything ran, 1 for bad usage, unreadable traces, unusable settings or
//! output that cannot be written (one line on stderr, never a panic), 2 when a replay ran out
//! of memory.

use std::io::Write as _;
use std::process::ExitCode;

use convert::convert_command;
use demo::demo_command;
use fit::fit_command;
use out::stdout_error;
use replay::replay_command;
use synth::synth_command;
use usage::USAGE;

#[macro_use]
mod out;

mod args;
mod convert;
mod demo;
mod fit;
mod fit_plot;
mod json;
mod progress;
mod replay;
mod replay_json;
mod replay_plot;
mod replay_run;
mod synth;
#[cfg(test)]
mod tests;
mod text;

mod usage;

fn main() -> ExitCode {
    // `torch-arena replay ... | head` should end quietly, as other commands do, rather than
    // panic on the closed pipe.
    // SAFETY: setting a signal's disposition to the default at start-up, before any thread.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("replay") => replay_command(&args[1..]),
        Some("synth") => synth_command(&args[1..]),
        Some("convert") => convert_command(&args[1..]),
        Some("demo") => demo_command(&args[1..]),
        Some("fit") => fit_command(&args[1..]),
        None | Some("help" | "-h" | "--help") => out!("{USAGE}").map(|()| 0),
        Some("--version" | "-V" | "version") => {
            outln!("torch-arena {}", env!("CARGO_PKG_VERSION")).map(|()| 0)
        }
        Some(other) => Err(format!(
            "unknown command '{other}'; commands: replay, fit, synth, convert, demo, help\n\n{USAGE}"
        )),
    };
    // What is still buffered must reach stdout too, or the failure be reported (the flush at
    // exit ignores errors).
    let result = result.and_then(|code| {
        std::io::stdout()
            .flush()
            .map_err(stdout_error)
            .map(|()| code)
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            errln!("torch-arena: {e}");
            ExitCode::FAILURE
        }
    }
}
