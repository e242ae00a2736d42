//! The texts of `torch-arena --help` beyond each option's own (TRACE forms, SIZE, exit status,
//! the JSON fields), and the defaults they state. The options are in `args.rs`.

/// The command in one paragraph (`torch-arena --help`).
pub(crate) const ABOUT: &str = "Replays GPU allocation traces through torch-arena on a simulated \
GPU (no GPU needed) and compares it with PyTorch's native caching allocator.";

/// What a TRACE argument may be.
macro_rules! trace_forms {
    () => {
        "\
TRACE is a file or a synthetic trace:
  FILE                        a torch-arena trace (.trace, .trace.gz), a PyTorch snapshot from
                              torch.cuda.memory._dump_snapshot (.pickle, .pickle.gz) or an RMM
                              logging_resource_adaptor CSV log; the format is read from the content
  synth:adversarial:CAPACITY  a trace on which the native allocator's policy runs out of memory
                              at CAPACITY while the arena fits
  synth:rmm-random:N:MAX[:SEED]
                              RMM's random-allocations benchmark: N allocations of sizes uniform
                              in [1, MAX], 73 % of steps allocate (SEED default 1)
  synth:KIND[:STEPS[:SEED]]   a dynamic-shape workload, STEPS steps (default 3; SEED default 1):
                              varlen-train (GPT-2 small on variable-length batches),
                              llm-serve (continuous batching, KV caches grown by torch.cat),
                              moe-train (top-2 of 8 experts, imbalanced routing),
                              two-stream-train (DDP buckets reduced on a second stream);
                              models and sources in docs/synthetic-workloads.md"
    };
}

macro_rules! size_forms {
    () => {
        "\
SIZE is a number and a unit: B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers
of 1000), e.g. 80GiB, 512MiB, 1.5GB."
    };
}

macro_rules! exit_status {
    () => {
        "\
exit status:
  0   everything ran and nothing ran out of memory
  1   bad usage, a trace that cannot be read, or a setting that cannot be used (the message
      names which); the other traces are still replayed. Also a file or stdout that cannot be
      written (a full disk): an output file is replaced only once written in full
  2   an arena replay ran out of memory (its report says where; the other replays still
      ran). The emulated native allocator running out is a result, not a failure"
    };
}

macro_rules! demo_trace {
    () => {
        "Replay the demo trace built into the command (traces/demo-train.trace.gz, made by \
scripts/make-demo-trace; set TORCH_ARENA_DEMO_TRACE to use another trace) with the native \
allocator emulated beside the arena, and explain the result; `demo --model` runs the modelled \
training loop itself (how that trace is recorded)."
    };
}

pub(crate) const TRACE_FORMS_HELP: &str = concat!(trace_forms!(), "\n\n", size_forms!());
pub(crate) const EXIT_STATUS_HELP: &str = exit_status!();
pub(crate) const TOP_AFTER_HELP: &str = concat!(
    trace_forms!(),
    "\n\n",
    size_forms!(),
    "\n\ndemo: ",
    demo_trace!(),
    "\n\nEach command's options: torch-arena COMMAND --help.\n\n",
    exit_status!()
);
pub(crate) const REPLAY_AFTER_HELP: &str = concat!(
    trace_forms!(),
    "\n\n",
    size_forms!(),
    "\n\n",
    exit_status!()
);
pub(crate) const FIT_AFTER_HELP: &str = concat!(
    "The capacity is bisected between one that cannot fit (under the peak of the bytes \
requested)
and one that ran with no out-of-memory, in 2 MiB steps, to within max(2 MiB, 0.25 %); the
capacity reported is one that ran, so `replay --capacity` there fits.\n\n",
    trace_forms!(),
    "\n\n",
    exit_status!()
);
pub(crate) const DIFF_LONG_ABOUT: &str = "What grew and shrank between two moments: of two \
traces A and B (two runs, two snapshots, PyTorch's or torch-arena's), or of one trace (two of its \
steps with --steps I J, or two moments with --at given twice). Each side is the set of \
allocations live at its moment (requested bytes, seeded ones included), grouped by allocation \
site (the frame text replay --live shows) or by the site's file, and matched by that text. \
Prints the live bytes and allocations of A and B and the change, the peak requested over each \
run (or step), then the groups that grew (most added bytes first) and that shrank (most \
removed first). Given two explain reports (torch_arena.explain(json=True) dumped, or the report \
written at an out-of-memory error with explain:True), it compares what they hold by category \
(default) or by module instead.";

pub(crate) const DIFF_AFTER_HELP: &str = concat!(
    "examples:
  torch-arena diff before.pickle after.pickle               at each run's peak, by site
  torch-arena diff a.pickle.gz b.pickle.gz --at end --by file --top 20
  torch-arena diff run.pickle --steps 1 5 --plot steps.svg  step 5 against step 1 of one run
  torch-arena diff run.trace --at event:10000 --at end      two moments of one run
  torch-arena diff synth:varlen-train:4 --steps 0 3 --json
  torch-arena diff step2.json oom.explain.json --by module  two explain reports

Steps: a PyTorch snapshot marks them with the record_function ranges PyTorch keeps in its \
external_annotations while memory history is on (the end of each ProfilerStep#N, else of each \
Optimizer.step: every optimizer.step() ends a step, as torch-arena counts them); steps whose \
end fell before the first recorded event (a ring buffer that wrapped) are not numbered. \
torch-arena's trace format (version 1) and RMM logs record no step boundaries: --steps says \
so; use --at event:N on both sides instead.

Groups: --by site and --by file come from each allocation's frames. Neither a PyTorch snapshot \
nor a torch-arena trace records what an allocation holds (parameter, gradient, activation) or \
which nn.Module made it: --by category and --by module say so and stop. torch_arena.explain() \
finds both in a running process, and its reports (JSON) diff by either: dump \
explain(json=True) at the two moments, then diff the two files.

",
    trace_forms!(),
    "

exit status:
  0   the diff was printed
  1   bad usage, a trace that cannot be read, a step or event out of range, a grouping the
      traces do not record, or a file or stdout that cannot be written"
);

/// `diff --json`: the object's fields.
pub(crate) const DIFF_JSON_HELP: &str = "print one JSON object instead of the tables

Fields: by (site or file), a and b (each: trace, path, source, kind, events, seeded_events, \
step (null for the whole run), span_events ([from, to]: the events the moment was taken among), \
moment (peak, start, end or event:N), events_applied, live_bytes, live_count, \
peak_requested_bytes (over the run or the step), groups), delta_live_bytes, delta_live_count, \
delta_peak_requested_bytes (B - A), grew_groups, shrank_groups, unchanged_groups, grew and \
shrank (the --top rows of each: key, a_bytes, b_bytes, delta_bytes, a_count, b_count, \
delta_count), grew_not_shown, shrank_not_shown, and unavailable (category and module: why the \
traces cannot be grouped so)";

/// `diff --plot`: what is drawn, and why x is a share of each run.
pub(crate) const DIFF_PLOT_HELP: &str = "draw both runs' requested bytes on one axis into FILE \
(.svg or .png)

y: requested bytes live; x: the share of each run's events, 0 to 100 % (with --steps, of each \
step's events), so that runs of different lengths line up start to start and end to end. Events, \
not time: every trace form orders its events, but not all have a clock, and time stretches with \
host stalls that are not memory. A vertical line marks each side's moment";

pub(crate) const SYNTH_AFTER_HELP: &str = "\
  synth adversarial [--capacity SIZE] -o FILE        (default capacity 80GiB)
  synth rmm-random --n N --max SIZE [--seed S] -o FILE
`replay synth:...` replays the same trace without a file.";
pub(crate) const DEMO_LONG_ABOUT: &str = demo_trace!();

/// `replay --json`: the fields of each line.
pub(crate) const REPLAY_JSON_HELP: &str = "print one JSON object per line per (trace, CONF) \
instead of tables

Fields: trace, path, source, kind, device, events, seeded_events, capacity_bytes, \
conf, conf_effective, backing, check, events_replayed, peak_requested_bytes, \
peak_reserved_bytes, native_peak_reserved_bytes (recorded in the trace), fragmentation \
(reserved / requested - 1), oom_event, oom (the report: event, size_bytes, stream, live_bytes, \
live_count, reserved_bytes, cached_bytes, message, largest_live), \
native_emulated_peak_reserved_bytes, native_emulated_oom_event, native_emulated_fragmentation, \
native_emulated_elapsed_s, elapsed_s, ns_per_event, events_per_s, driver_calls, \
driver_calls_by_kind (CUDA driver API name -> count; they add up to driver_calls), \
driver_calls_covered (set_access_handles, mem_create_bytes, mem_release_bytes, \
mem_alloc_bytes, mem_free_bytes: what the calls covered), modelled_driver_s (calls x latency, \
grants per handle, plus any per-GiB terms), modelled_stall_s (host blocked waiting for the \
GPU), growth (physical memory created, as {at_peak, below_peak}, each {handles, bytes}: for \
requests that took the bytes requested to a new peak, and for those that left them at or under \
it, the growth a steady state avoids), steps (one object per step: driver_calls, \
driver_calls_by_kind, modelled_driver_s, modelled_stall_s, peak_requested_bytes, \
peak_reserved_bytes, growth), gpu_lag_us, repeat, driver_costs (where the latencies came \
from), native_driver_calls, native_driver_calls_by_kind, native_driver_calls_covered, \
native_modelled_driver_s, native_modelled_stall_s, native_growth (as growth, for the \
emulation), native_driver_calls_from (emulated with --native, else recorded: the snapshot's \
segment events, at least one call each), native_steps (as steps, for the emulation), \
native_emulated (every emulation: conf (null for --native), peak_requested_bytes, \
peak_reserved_bytes, fragmentation, oom_event, driver_calls, modelled_driver_s, \
modelled_stall_s, elapsed_s), error; null where unknown. A trace that cannot be read gets \
{trace, path, error}";

/// Sites `--live` shows unless told (the value `--live` with no `=N` reads).
pub(crate) const LIVE_TOP_TEXT: &str = "10";
/// Exit status when a replay ran out of memory.
pub(crate) const EXIT_OOM: u8 = 2;
/// Default simulated capacity.
pub(crate) const DEFAULT_CAPACITY: u64 = 80 << 30;
/// A plot of more traces than this (without `{trace}` in its name) is an overview chart.
pub(crate) const OVERVIEW_AFTER: usize = 6;
/// Default seed of `synth:rmm-random`.
pub(crate) const DEFAULT_SEED: u64 = 1;
/// Passes over the demo trace unless `--repeat` says otherwise.
pub(crate) const DEMO_REPEAT: u32 = 3;

/// After `torch-arena merge --help`'s options.
pub(crate) const MERGE_AFTER_HELP: &str = "\
The table: a row per rank (each category's bytes and the total for explain reports; the live \
bytes of the growing allocation sites and how many sites grow for leak reports), then per column \
the largest, least and mean value over the ranks and the largest over the mean (the imbalance), \
and which rank holds the most. The same table as torch_arena.explain(all_ranks=True) and \
leak_report(all_ranks=True) gather live under torchrun (docs/python.md, \"Across ranks\").

exit status:
  0   the table was written
  1   a file that cannot be read, is not a per-rank report or has no rank; reports of both
      kinds; a rank given twice; files of different world sizes (the message names the files)";
