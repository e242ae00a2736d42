//! What `torch-arena help` and each command's usage errors print, and the defaults they state.

pub(crate) const USAGE: &str = "\
usage: torch-arena <command> [options]

Replays GPU allocation traces through torch-arena on a simulated GPU (no GPU needed) and
compares it with PyTorch's native caching allocator.

commands:
  replay TRACE... [options]   replay each trace under each setting; print per trace the peak
                              requested and reserved bytes, fragmentation, speed and driver
                              calls, and where memory ran out
  fit TRACE... [options]      the smallest GPU on which each trace runs with no out-of-memory,
                              for the arena and for PyTorch's native allocator under each of
                              its settings, and what the last step costs there
  synth KIND [options] -o FILE
                              write a synthetic trace in torch-arena's trace format
  convert TRACE -o FILE       write any trace (a PyTorch snapshot, an RMM log, a synthetic
                              trace) in torch-arena's trace format (gzipped if FILE ends in .gz)
  demo [options]              replay the training-loop trace the project ships against the
                              emulated native allocator, and explain the result
  help                        this text (also -h, --help, and COMMAND --help)
  --version                   the version of torch-arena

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
                              models and sources in docs/synthetic-workloads.md

replay options:
  --capacity SIZE   memory of the simulated GPU (default 80GiB)
  --conf CONF       arena settings in TORCH_ARENA_CONF syntax, e.g. stitch:False,page_size_mb:4;
                    repeat for a sweep: one replay per CONF (default: one, with the defaults).
                    The device is always the simulated one with --capacity (so no
                    sim_capacity_mb here)
  --native          also emulate PyTorch's native caching allocator on each trace, under the
                    expandable_segments and max_split_size the snapshot recorded (torch >= 2.5),
                    else PyTorch's defaults (no max_split_size, no expandable segments, 20 MiB
                    large segments). What the native allocator recorded in the trace itself
                    (PyTorch snapshots with segment events) is always shown
  --native-conf SETTINGS
                    also emulate the native allocator under SETTINGS, in
                    PYTORCH_CUDA_ALLOC_CONF's grammar (as for fit, below; an empty one is the
                    defaults); repeat for more: one more row per setting in every table, one
                    more line in plots. The JSON fields native_emulated_* and native_* describe
                    the first emulation (--native's, else the first --native-conf);
                    native_emulated lists them all
  --repeat N        replay each trace N times in a row, one step per pass: what is live at the
                    end of a pass stays live, what a pass allocates and frees is allocated and
                    freed again (default 1). Tables add a steady-state table (first and last step)
  --gpu-lag DURATION
                    GPU work finishes this long after the host queues it (0, 500us, 5ms; default
                    2ms, see BENCHMARKS.md): memory freed while earlier kernels still use it can
                    leave its stream only once they finish; a synchronising call that waits for
                    them is a host stall. The clock is the trace's timestamps, else 10 µs per
                    event. 0 replays as if the GPU finished everything at once
  --driver-costs FILE
                    latencies of the driver calls, one `NAME = MICROSECONDS` per line (e.g.
                    cuMemCreate = 7.6; `NAME per GiB = MICROSECONDS` adds a term per GiB for
                    cuMemCreate, cuMemRelease, cuMemAlloc and cuMemFree); unnamed calls keep
                    the defaults, measured on an H200 (in a source checkout:
                    bench/costs/h200.txt; the former A100 defaults: bench/costs/a100.txt).
                    The conf key
                    driver_costs:FILE does the same for one --conf of a sweep
  --backing         back the simulated pages with host memory and check every live
                    allocation's bytes (slow: for small traces)
  --check           after every event, check that the stats are exact and that no live
                    allocations overlap (slow)
  --live[=N]        after each trace, what was live by allocation site (the N largest, default
                    10: bytes, count, the largest sizes) at the peak of requested bytes, or just
                    before the event where the arena ran out of memory; in --json, the fields
                    live and live_at
  --json            print one JSON object per line per (trace, CONF) instead of tables:
                    trace, path, source, kind, device, events, seeded_events, capacity_bytes,
                    conf, conf_effective, backing, check, events_replayed,
                    peak_requested_bytes, peak_reserved_bytes, native_peak_reserved_bytes
                    (recorded in the trace), fragmentation (reserved / requested - 1),
                    oom_event, oom (the report: event, size_bytes, stream, live_bytes,
                    live_count, reserved_bytes, cached_bytes, message, largest_live),
                    native_emulated_peak_reserved_bytes, native_emulated_oom_event,
                    native_emulated_fragmentation, native_emulated_elapsed_s, elapsed_s,
                    ns_per_event, events_per_s, driver_calls, driver_calls_by_kind (CUDA driver
                    API name -> count; they add up to driver_calls), driver_calls_covered
                    (set_access_handles, mem_create_bytes, mem_release_bytes,
                    mem_alloc_bytes, mem_free_bytes: what the calls covered),
                    modelled_driver_s (calls x latency, grants per handle, plus any per-GiB
                    terms), modelled_stall_s (host blocked waiting for the GPU), growth
                    (physical memory created, as {at_peak, below_peak}, each {handles,
                    bytes}: for requests that took the bytes requested to a new peak, and for
                    those that left them at or under it, the growth a steady state avoids),
                    steps (one object per step: driver_calls, driver_calls_by_kind,
                    modelled_driver_s, modelled_stall_s, peak_requested_bytes,
                    peak_reserved_bytes, growth), gpu_lag_us,
                    repeat, driver_costs (where the latencies came from), native_driver_calls,
                    native_driver_calls_by_kind, native_driver_calls_covered,
                    native_modelled_driver_s, native_modelled_stall_s, native_growth (as
                    growth, for the emulation), native_driver_calls_from (emulated with --native,
                    else recorded: the snapshot's segment events, at least one call each),
                    native_steps (as steps, for the emulation), native_emulated (every
                    emulation: conf (null for --native), peak_requested_bytes,
                    peak_reserved_bytes, fragmentation, oom_event, driver_calls,
                    modelled_driver_s, modelled_stall_s, elapsed_s), error; null where unknown. A
                    trace that cannot be read gets {trace, path, error}
  --plot FILE       draw requested and reserved bytes over each trace into FILE (.svg or .png),
                    with the capacity, the seeded part, out-of-memory markers and each
                    allocator's modelled driver time (right axis): one panel per trace, stacked
                    in one image; with {trace} in FILE, one file per trace, {trace} replaced by
                    the trace's name. More than 6 traces in one FILE make an overview chart
                    instead: per trace, ours / native peak reserved and modelled driver time
  --progress        show progress on stderr even when it is not a terminal
  --no-progress     never show progress (default: shown when stderr is a terminal)

fit options:
  --conf CONF       arena settings, as for replay; repeat for more (default: the defaults)
  --native-conf SETTINGS
                    PyTorch's native allocator under SETTINGS, in PYTORCH_CUDA_ALLOC_CONF's
                    grammar (e.g. expandable_segments:True, max_split_size_mb:512,
                    roundup_power2_divisions:[256:1,>:4], garbage_collection_threshold:0.8 with
                    per_process_memory_fraction:0.9); repeat for more; an empty one is the defaults.
                    Default: the defaults, expandable_segments:True, and the settings a
                    snapshot recorded where it has them. Emulated: max_split_size_mb,
                    max_non_split_rounding_mb, large_segment_size_mb, roundup_power2_divisions,
                    garbage_collection_threshold, per_process_memory_fraction,
                    expandable_segments; pinned-memory and locking settings are accepted and
                    change nothing; backend:cudaMallocAsync is refused (not emulated)
  --repeat N        every one of N steps must run (default 1); the cost shown is the last step's
  --gpu-lag DURATION, --driver-costs FILE
                    as for replay, but the GPU lag defaults to 0
  -j, --jobs N      traces fitted at once (default: one per core)
  --plot FILE.svg   per trace, the last step's modelled driver time on devices from the least
                    minimum to 10 % past the largest (12 capacities, each allocator replayed
                    at each), with a dashed line where each starts to fit; up to 6 traces stack
                    in one image, more make an overview (each minimum over the bytes
                    requested, a dot per allocator); {trace} in FILE writes one file per trace
  --json            one JSON object per trace: trace, path, source, kind, events,
                    peak_requested_bytes (over every step), repeat, gpu_lag_us,
                    best_native_bytes (the least of the native settings' minimums), and fit:
                    one object per allocator and setting
                    with allocator (arena or native), conf (as given, empty for the defaults),
                    min_capacity_bytes (null: does not fit on any device up to 1 PiB),
                    ratio_to_requested, saved_vs_best_native_bytes (positive: needs less),
                    trials (replays the bisection ran) and last_step at the minimum
                    (memory_driver_calls, driver_calls, driver_calls_by_kind, modelled_driver_s,
                    modelled_stall_s). A trace that cannot be read gets {trace, path, error}
  --progress, --no-progress
                    as for replay
  The capacity is bisected between one that cannot fit (under the peak of the bytes requested)
  and one that ran with no out-of-memory, in 2 MiB steps, to within max(2 MiB, 0.25 %); the
  capacity reported is one that ran, so `replay --capacity` there fits.

synth:
  synth adversarial [--capacity SIZE] -o FILE        (default capacity 80GiB)
  synth rmm-random --n N --max SIZE [--seed S] -o FILE
                    -o, --output FILE: where to write it, in torch-arena's trace format;
                    `replay synth:...` replays the same trace without a file

demo options:
  (none)            replay the demo trace built into the command (traces/demo-train.trace.gz,
                    made by scripts/make-demo-trace; set TORCH_ARENA_DEMO_TRACE to use another
                    trace) with the native allocator emulated beside the arena
  --capacity SIZE, --conf CONF, --plot FILE, --gpu-lag DURATION, --driver-costs FILE,
  --progress, --no-progress
                    as for replay
  --repeat N        as for replay (default 3: the table shows steady-state calls per step
                    beside the native allocator's)
  --model [--steps N] [--conf CONF]
                    run the modelled training loop itself through the arena and print per-step
                    memory_stats figures and memory_summary (default 8 steps; CONF default
                    device:sim; add trace:PATH to record it). --steps implies --model

SIZE is a number and a unit: B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers
of 1000), e.g. 80GiB, 512MiB, 1.5GB.

exit status:
  0   everything ran and nothing ran out of memory
  1   bad usage, a trace that cannot be read, or a setting that cannot be used (the message
      names which); the other traces are still replayed. Also a file or stdout that cannot be
      written (a full disk): an output file is replaced only once written in full
  2   an arena replay ran out of memory (its report says where; the other replays still
      ran). The emulated native allocator running out is a result, not a failure
";

pub(crate) const REPLAY_SYNOPSIS: &str = "usage: torch-arena replay TRACE... [--capacity SIZE] [--conf CONF]... \
[--repeat N] [--gpu-lag DURATION] [--driver-costs FILE] [--native] [--native-conf SETTINGS]... [--backing] [--check] [--live[=N]] [--json] [--plot FILE] [--progress | --no-progress]";
pub(crate) const FIT_SYNOPSIS: &str = "usage: torch-arena fit TRACE... [--conf CONF]... [--native-conf SETTINGS]... \
[--repeat N] [--gpu-lag DURATION] [--driver-costs FILE] [-j N] [--json] [--plot FILE.svg] [--progress | --no-progress]";
/// The options of `fit`, for "did you mean" hints.
pub(crate) const FIT_OPTIONS: &[&str] = &[
    "--conf",
    "--native-conf",
    "--repeat",
    "--gpu-lag",
    "--driver-costs",
    "--jobs",
    "--json",
    "--plot",
    "--progress",
    "--no-progress",
    "--help",
];
pub(crate) const SYNTH_SYNOPSIS: &str = "usage: torch-arena synth adversarial [--capacity SIZE] -o FILE\n       \
torch-arena synth rmm-random --n N --max SIZE [--seed S] -o FILE";
pub(crate) const CONVERT_SYNOPSIS: &str = "usage: torch-arena convert TRACE -o FILE";
pub(crate) const DEMO_SYNOPSIS: &str = "usage: torch-arena demo [--capacity SIZE] [--conf CONF] [--plot FILE] \
[--repeat N] [--gpu-lag DURATION] [--driver-costs FILE] [--progress | --no-progress]\n       torch-arena demo --model [--steps N] [--conf CONF]";

/// Sites `--live` shows unless told.
pub(crate) const LIVE_TOP: usize = 10;
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

pub(crate) const REPLAY_OPTIONS: &[&str] = &[
    "--capacity",
    "--conf",
    "--repeat",
    "--gpu-lag",
    "--driver-costs",
    "--native",
    "--native-conf",
    "--backing",
    "--check",
    "--live",
    "--json",
    "--plot",
    "--progress",
    "--no-progress",
    "--help",
];
