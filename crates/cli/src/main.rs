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
//! - `diff A [B]`: what grew and shrank between two traces, or two steps or moments of one, by
//!   site or file (text, `--json`, `--plot`).
//! - `synth KIND -o FILE`: write a synthetic trace.
//! - `demo`: replay the training-loop trace the project ships and explain the result;
//!   `demo --model` runs the modelled training loop directly (how that trace is recorded).
//! - `merge FILE...`: the table of every rank's report (the per-rank JSON files of
//!   `torch_arena.explain` or the leak report) and their imbalance.
//! - `completions SHELL`: a shell completion script (clap_complete).
//!
//! The arguments are parsed by clap (`args.rs`). Exit status: 0 when everything ran, 1 for bad
//! usage, unreadable traces, unusable settings or output that cannot be written (one line on
//! stderr, never a panic), 2 when a replay ran out of memory.

use std::io::Write as _;
use std::process::ExitCode;

use args::{Cli, CliCommand, completions, parse_args};
use clap::CommandFactory as _;
use clap::error::ErrorKind;
use convert::convert_command;
use demo::demo_command;
use diff::diff_command;
use fit::fit_command;
use merge::merge_command;
use out::{CliResult, stdout_error};
use replay::replay_command;
use synth::synth_command;

#[macro_use]
mod out;

mod args;
mod convert;
mod demo;
mod diff;
mod diff_report;
mod fit;
mod fit_plot;
mod json;
mod merge;
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
    let result = run(&args);
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

/// Parse `args` and run the command; the exit status, or the message of a failure (exit 1).
fn run(args: &[String]) -> CliResult<u8> {
    // No command at all: the full help, as `torch-arena help` prints it.
    if args.is_empty() {
        return out!("{}", Cli::command().render_long_help()).map(|()| 0);
    }
    let cli = match parse_args(args) {
        Ok(cli) => cli,
        Err(e) => return clap_error(e),
    };
    match cli.command {
        CliCommand::Replay(a) => replay_command(a),
        CliCommand::Fit(a) => fit_command(a),
        CliCommand::Diff(a) => diff_command(a),
        CliCommand::Synth(a) => synth_command(a),
        CliCommand::Convert(a) => convert_command(a),
        CliCommand::Demo(a) => demo_command(a),
        CliCommand::Merge(a) => merge_command(a),
        CliCommand::Completions { shell } => {
            std::io::stdout()
                .lock()
                .write_all(&completions(shell))
                .map_err(stdout_error)?;
            Ok(0)
        }
        CliCommand::Version => outln!("torch-arena {}", env!("CARGO_PKG_VERSION")).map(|()| 0),
    }
}

/// What clap stopped at: help and the version go to stdout (exit 0, a failed write reported as
/// any other); a usage error is one `torch-arena: ` message on stderr and exit 1, as every other
/// failure (2 is for a replay that ran out of memory).
fn clap_error(e: clap::Error) -> CliResult<u8> {
    let text = e.render().to_string();
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => out!("{text}").map(|()| 0),
        kind => {
            let mut msg = text.trim_end().trim_start_matches("error: ").to_string();
            if kind == ErrorKind::InvalidSubcommand {
                msg += "\n\ncommands: replay, fit, synth, convert, demo, merge, diff, completions, help";
            }
            Err(msg)
        }
    }
}
