//! PyTorch's allocator settings (`PYTORCH_CUDA_ALLOC_CONF`) for the native emulation: the options
//! struct, and the settings text parsed as PyTorch parses it.
//!
//! The rules follow PyTorch's `c10/core/AllocatorConfig.cpp` (`AcceleratorAllocatorConfig`: the
//! keys every device shares) and `c10/cuda/CUDAAllocatorConfig.h` (the CUDA keys). Settings that
//! change where device memory goes are emulated; settings about pinned host memory, locking or
//! graph-capture bookkeeping are accepted and have no effect on a replay (they change no byte of
//! device memory a trace's events take); `backend:cudaMallocAsync` is refused (a different
//! allocator, not emulated). Every refusal names the key, the value and what PyTorch accepts.

use torch_arena::config::{self, Value};
use torch_arena::error::{Error, Result};

const MIB: u64 = 1 << 20;
/// `kLargeBuffer`: the default `large_segment_size`, and the least `max_split_size_mb` and
/// `max_non_split_rounding_mb` PyTorch accepts (in MiB: 20).
const LARGE_BUFFER: u64 = 20 * MIB;
/// `kMinLargeAlloc`: `large_segment_size_mb` must be larger (in MiB: 10).
const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// `kRoundUpPowerOfTwoIntervals`: one `roundup_power2_divisions` entry per power of two from
/// `kRoundUpPowerOfTwoStart` (1 MiB) up to 64 GiB; sizes below 1 MiB use the first, sizes above
/// the last.
pub const ROUNDUP_INTERVALS: usize = 16;
/// log2 of `kRoundUpPowerOfTwoStart` (1 MiB).
const ROUNDUP_START_LOG2: u32 = 20;
/// `kMinBlockSize`.
const MIN_BLOCK: u64 = 512;

/// The native allocator's settings that matter for a replay.
#[derive(Clone, Debug, PartialEq)]
pub struct NativeOptions {
    /// The device's total memory (what `cudaMalloc` can take before it fails).
    pub capacity: u64,
    /// `max_split_size_mb` in bytes (`None` = unlimited).
    pub max_split_size: Option<u64>,
    /// `max_non_split_rounding_mb` in bytes: how much bigger than a request (of at least
    /// `max_split_size`) a cached oversize block may be and still serve it (default 20 MiB).
    pub max_non_split_rounding: u64,
    pub expandable_segments: bool,
    /// `large_segment_size_mb` in bytes (default 20 MiB).
    pub large_segment_size: u64,
    /// `roundup_power2_divisions`, one entry per interval (see `ROUNDUP_INTERVALS`); 0 or 1 =
    /// plain 512-byte rounding.
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
    /// `garbage_collection_threshold` (0 = off). Acts only under a memory fraction, as in PyTorch
    /// (`set_fraction && garbage_collection_threshold() > 0`).
    pub garbage_collection_threshold: f64,
    /// `per_process_memory_fraction` (or `torch.cuda.set_per_process_memory_fraction`): the
    /// share of `capacity` this process may reserve (`None` = not set).
    pub memory_fraction: Option<f64>,
    pub series_points: usize,
}

impl NativeOptions {
    /// PyTorch's defaults on a device of `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        NativeOptions {
            capacity,
            max_split_size: None,
            max_non_split_rounding: LARGE_BUFFER,
            expandable_segments: false,
            large_segment_size: LARGE_BUFFER,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            garbage_collection_threshold: 0.0,
            memory_fraction: None,
            series_points: 0,
        }
    }

    /// PyTorch's defaults on a device of `capacity` bytes with `text` (`PYTORCH_CUDA_ALLOC_CONF`'s
    /// grammar, `""` for none) applied; `source` names where the text came from in errors.
    pub fn with_conf(capacity: u64, source: &str, text: &str) -> Result<Self> {
        let mut o = NativeOptions::new(capacity);
        o.apply_conf(source, text)?;
        Ok(o)
    }

    /// Applies the settings in `text` on top of these.
    pub fn apply_conf(&mut self, source: &str, text: &str) -> Result<()> {
        let bad = |key: &str, value: &str, want: &str| {
            Error::Config(format!(
                "{source}: bad value '{value}' for '{key}': {want} (as PyTorch's \
                 PYTORCH_CUDA_ALLOC_CONF requires)"
            ))
        };
        let mut seen: Vec<String> = Vec::new();
        for (key, value) in config::entries(source, text)? {
            if seen.contains(&key) {
                return Err(Error::Config(format!(
                    "{source}: '{key}' is given twice; give each setting once"
                )));
            }
            seen.push(key.clone());
            let list = matches!(value, Value::List(_));
            let v = value.text();
            let scalar = |want: &str| if list { Err(bad(&key, v, want)) } else { Ok(v) };
            match key.as_str() {
                "max_split_size_mb" => {
                    let want = "a whole number of MiB, at least 20";
                    let mb = parse_mib(scalar(want)?).filter(|&m| m >= LARGE_BUFFER / MIB);
                    let mb = mb.ok_or_else(|| bad(&key, v, want))?;
                    self.max_split_size = Some(mb.saturating_mul(MIB));
                }
                "max_non_split_rounding_mb" => {
                    let want = "a whole number of MiB, at least 20";
                    let mb = parse_mib(scalar(want)?).filter(|&m| m >= LARGE_BUFFER / MIB);
                    let mb = mb.ok_or_else(|| bad(&key, v, want))?;
                    self.max_non_split_rounding = mb.saturating_mul(MIB);
                }
                "large_segment_size_mb" => {
                    let want = "a whole number of MiB, more than 10";
                    let mb = parse_mib(scalar(want)?).filter(|&m| m > MIN_LARGE_ALLOC / MIB);
                    let mb = mb.ok_or_else(|| bad(&key, v, want))?;
                    self.large_segment_size = mb.saturating_mul(MIB);
                }
                "garbage_collection_threshold" => {
                    let want = "a number between 0 and 1, both excluded";
                    let t = scalar(want)?.parse::<f64>().ok();
                    let t = t.filter(|t| *t > 0.0 && *t < 1.0);
                    self.garbage_collection_threshold = t.ok_or_else(|| bad(&key, v, want))?;
                }
                "per_process_memory_fraction" => {
                    let want = "a number from 0 to 1";
                    let f = scalar(want)?.parse::<f64>().ok();
                    let f = f.filter(|f| (0.0..=1.0).contains(f));
                    self.memory_fraction = Some(f.ok_or_else(|| bad(&key, v, want))?);
                }
                "expandable_segments" => {
                    self.expandable_segments = parse_bool(scalar("True or False")?)
                        .ok_or_else(|| bad(&key, v, "True or False"))?;
                }
                "roundup_power2_divisions" => {
                    self.roundup_power2_divisions =
                        parse_roundup(v).map_err(|want| bad(&key, v, &want))?;
                }
                "backend" => match v {
                    "native" => {}
                    "cudaMallocAsync" => {
                        return Err(Error::Config(format!(
                            "{source}: backend:cudaMallocAsync is CUDA's own stream-ordered \
                             allocator, which the lab does not emulate; leave 'backend' out or \
                             give backend:native"
                        )));
                    }
                    _ => return Err(bad(&key, v, "native or cudaMallocAsync")),
                },
                // No effect on the device memory a replay's events take: locking, pinned host
                // memory, graph-capture bookkeeping, how an out-of-memory is reported.
                "release_lock_on_cudamalloc"
                | "pinned_use_cuda_host_register"
                | "pinned_use_background_threads"
                | "graph_capture_record_stream_reuse"
                | "pinned_free_catch_all"
                | "throw_on_cudamalloc_oom" => {
                    parse_bool(scalar("True or False")?)
                        .ok_or_else(|| bad(&key, v, "True or False"))?;
                }
                "pinned_num_register_threads" | "pinned_reserve_segment_size_mb" => {
                    parse_mib(scalar("a whole number")?)
                        .ok_or_else(|| bad(&key, v, "a whole number"))?;
                }
                _ => {
                    return Err(Error::Config(format!(
                        "{source}: unknown setting '{key}'; the native emulation takes \
                         {EMULATED} (and accepts, without effect on a replay, {IGNORED})"
                    )));
                }
            }
        }
        Ok(())
    }

    /// What the allocator may reserve: `allowed_memory_maximum` (the fraction of the device,
    /// `static_cast<size_t>(fraction * total)`) under a memory fraction, else the device.
    pub fn limit(&self) -> u64 {
        match self.memory_fraction {
            Some(f) => ((f * self.capacity as f64) as u64).min(self.capacity),
            None => self.capacity,
        }
    }

    /// Whether `garbage_collect_cached_blocks` runs (`set_fraction && threshold > 0`).
    pub fn garbage_collection(&self) -> bool {
        self.memory_fraction.is_some() && self.garbage_collection_threshold > 0.0
    }

    /// `round_size`: at least 512 bytes; a multiple of 512, or with `roundup_power2_divisions`
    /// for the size's interval (`divisions > 1 && size > 512 * divisions`) the next of
    /// `divisions` equal steps between two powers of two (`roundup_power2_next_division`).
    pub fn round_size(&self, size: u64) -> u64 {
        if size < MIN_BLOCK {
            return MIN_BLOCK;
        }
        let divisions = self.divisions_for(size);
        if divisions > 1 && size > MIN_BLOCK.saturating_mul(divisions) {
            next_division(size, divisions)
        } else {
            size.div_ceil(MIN_BLOCK).saturating_mul(MIN_BLOCK)
        }
    }

    /// The divisions of `size`'s interval: index log2(size) − 20, clamped to the table.
    fn divisions_for(&self, size: u64) -> u64 {
        let log = 63 - size.leading_zeros();
        let index = log.saturating_sub(ROUNDUP_START_LOG2) as usize;
        self.roundup_power2_divisions[index.min(ROUNDUP_INTERVALS - 1)]
    }
}

const EMULATED: &str = "max_split_size_mb, max_non_split_rounding_mb, large_segment_size_mb, \
                        garbage_collection_threshold, per_process_memory_fraction, \
                        expandable_segments, roundup_power2_divisions, backend:native";
const IGNORED: &str = "release_lock_on_cudamalloc, pinned_use_cuda_host_register, \
                       pinned_use_background_threads, pinned_num_register_threads, \
                       pinned_reserve_segment_size_mb, pinned_free_catch_all, \
                       graph_capture_record_stream_reuse, throw_on_cudamalloc_oom";

/// `roundup_power2_next_division`: a power of two stays; otherwise the next multiple of
/// `floor_pow2(size) / divisions` (twice the floor when that step is 0).
fn next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> divisions.trailing_zeros();
    if step == 0 {
        return floor.saturating_mul(2);
    }
    let down = size & !(step - 1);
    if down == size {
        size
    } else {
        down.saturating_add(step)
    }
}

fn parse_mib(v: &str) -> Option<u64> {
    v.parse::<u64>().ok()
}

fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "True" | "true" => Some(true),
        "False" | "false" => Some(false),
        _ => None,
    }
}

/// `parseRoundUpPower2Divisions`: one number (a power of two) for every interval, or a list
/// `[SIZE_MB:N, ..., >:N]` where SIZE_MB is a power of two naming the interval that starts there
/// (clamped to the table) and N is 0 or a power of two. As in PyTorch, the first entry also fills
/// every interval below it, and `>` fills from the last named interval on (that interval
/// included) to the end.
fn parse_roundup(text: &str) -> std::result::Result<[u64; ROUNDUP_INTERVALS], String> {
    let mut table = [0u64; ROUNDUP_INTERVALS];
    let Some(items) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) else {
        let n = text
            .parse::<u64>()
            .ok()
            .filter(|n| n.is_power_of_two())
            .ok_or("a power of two, or a list such as [256:1,512:2,>:4]")?;
        return Ok([n; ROUNDUP_INTERVALS]);
    };
    let want = "a list of SIZE_MB:N or >:N entries, SIZE_MB a power of two and N 0 or a power \
                of two, such as [256:1,512:2,>:4]";
    let (mut first, mut last) = (true, 0usize);
    for item in items.split(',').filter(|i| !i.is_empty()) {
        let (k, n) = item.split_once(':').ok_or(want)?;
        let n = n
            .parse::<u64>()
            .ok()
            .filter(|&n| n == 0 || n.is_power_of_two())
            .ok_or(want)?;
        if k == ">" {
            table[last..].fill(n);
            continue;
        }
        let mb = k
            .parse::<u64>()
            .ok()
            .filter(|m| m.is_power_of_two())
            .ok_or(want)?;
        let index = ((63 - mb.leading_zeros()) as usize).min(ROUNDUP_INTERVALS - 1);
        if first {
            table[..index].fill(n);
            first = false;
        }
        table[index] = n;
        last = index;
    }
    Ok(table)
}
