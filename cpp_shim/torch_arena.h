/*
 * torch_arena.h: the public C interface of libtorch_arena.so.
 *
 * torch-arena is a CUDA caching allocator that PyTorch loads as a plugin through
 * torch.cuda.memory.CUDAPluggableAllocator. This header documents every symbol the shared library
 * exports: the two entry points PyTorch calls (written in C++, cpp_shim/shim.cpp), PyTorch's
 * optional hooks, and the query calls the Python package makes through ctypes (written in Rust,
 * src/abi/).
 *
 * USAGE (global mode; must run before CUDA is initialised in the process):
 *
 *     import ctypes, torch
 *     so = "/path/to/libtorch_arena.so"
 *     alloc = torch.cuda.memory.CUDAPluggableAllocator(so, "torch_arena_malloc", "torch_arena_free")
 *     lib = ctypes.CDLL(so)
 *     a = alloc.allocator()
 *     a.set_init_fn(ctypes.cast(lib.torch_arena_init, ctypes.c_void_p).value)
 *     a.set_reset_fn(ctypes.cast(lib.torch_arena_empty_cache, ctypes.c_void_p).value)
 *     a.set_memory_fraction_fn(ctypes.cast(lib.torch_arena_set_memory_fraction, ctypes.c_void_p).value)
 *     a.set_record_stream_fn(ctypes.cast(lib.torch_arena_record_stream, ctypes.c_void_p).value)
 *     a.set_base_alloc_fn(ctypes.cast(lib.torch_arena_base_alloc, ctypes.c_void_p).value)
 *     for setter, name in (("set_begin_allocate_to_pool", "torch_arena_begin_allocate_to_pool"),
 *                          ("set_end_allocate_to_pool_fn", "torch_arena_end_allocate_to_pool"),
 *                          ("set_release_pool", "torch_arena_release_pool")):
 *         getattr(a, setter)(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value)
 *     torch.cuda.memory.change_current_allocator(alloc)
 *
 * (The torch_arena Python package does all of this when TORCH_ARENA=1.)
 *
 * CONVENTIONS
 *
 * - Thread safety: every function may be called from any thread at any time, concurrently, with
 *   or without the Python GIL (PyTorch frees tensors from autograd worker threads). None of them
 *   calls back into Python or PyTorch. Only two kinds take the GIL, and never while holding a
 *   lock of torch-arena: torch_arena_malloc when Python allocation sites are captured (sites:python
 *   or all; a thread Python does not know is skipped, never given a thread state), and the JSON
 *   reports that name Python frames (torch_arena_live_json, _leaks_json, _history_json: they read
 *   code objects' file and function names under PyGILState_Ensure; call them through
 *   ctypes.CDLL, which releases the GIL, or with the GIL held through ctypes.PyDLL).
 * - No unwinding: no function but torch_arena_malloc lets anything unwind out of it. A panic
 *   inside the Rust code is caught at the boundary and reported as TORCH_ARENA_ERR_PANIC (or the
 *   function's documented failure value) with a last-error message. torch_arena_malloc throws
 *   C++ exceptions on failure (see there); torch_arena_free never throws.
 * - Status codes: functions returning int return TORCH_ARENA_OK (0) on success and one of the
 *   nonzero TORCH_ARENA_ERR_* codes below on failure, with the last error set.
 * - Last error: each failure stores its message for the calling thread and as the process-wide
 *   most recent one; read it with torch_arena_last_error. Successful calls do not clear it.
 * - NULL out-pointers and NULL strings are errors (TORCH_ARENA_ERR_INVALID_ARGUMENT), never
 *   dereferenced.
 * - Strings returned as `const char*` are static: owned by the library, valid while it is
 *   loaded, never to be freed. Strings written to a caller's buffer follow snprintf: the full
 *   length (excluding the NUL) is returned, at most cap-1 bytes plus a NUL are written (cut at a
 *   UTF-8 character boundary), and buf may be NULL when cap is 0.
 * - Streams are `cudaStream_t` passed as `void*` (the same ABI; this header needs no CUDA
 *   headers). NULL is the legacy default stream.
 * - Configuration: the allocator is created on first use from the environment variable
 *   TORCH_ARENA_CONF (PyTorch's PYTORCH_CUDA_ALLOC_CONF grammar, "key:value,key:value"), unless
 *   torch_arena_configure was called first. A bad TORCH_ARENA_CONF makes every call that needs
 *   the allocator fail with TORCH_ARENA_ERR_CONFIG and the same message (torch_arena_configure can
 *   still install a good configuration).
 * - Logging: the library reports problems (bad frees, unknown record_stream pointers, out of
 *   memory, a missing or failing driver, a bad configuration) and facts (the configuration, each
 *   device opened, empty_cache/defragment results) as log records with a level: error, warn,
 *   info, debug, trace. Records below the process-wide level are discarded; the level comes from
 *   the environment variable TORCH_ARENA_LOG (error|warn|info|debug|trace|off, case-insensitive;
 *   unset: warn; another value: warn, plus a warning naming it) and torch_arena_set_log_level.
 *   By default each record is written at once to stderr as one line,
 *   "torch-arena: warning: <message>" ("error", "warning", "info", "debug", "trace"). After
 *   torch_arena_log_attach(1) records go instead to an in-memory queue (nothing to stderr) that
 *   the consumer empties with torch_arena_log_drain; the Python package does this and forwards
 *   them to logging.getLogger("torch_arena"). Delivery never calls back into the caller, never
 *   takes the Python GIL and never blocks on an allocator lock. See "Logging" below.
 */
#ifndef TORCH_ARENA_H
#define TORCH_ARENA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#include <stdexcept>
#include <string>
#define TORCH_ARENA_NOEXCEPT noexcept
#else
#define TORCH_ARENA_NOEXCEPT
#endif

#if defined(__GNUC__)
#define TORCH_ARENA_API __attribute__((visibility("default")))
#else
#define TORCH_ARENA_API
#endif

/* ---------------------------------------------------------------------------------------------
 * Status codes. */

/** Success. */
#define TORCH_ARENA_OK 0
/** Out of memory: the last error starts with "CUDA out of memory. Tried to allocate". */
#define TORCH_ARENA_ERR_OOM 1
/** Any other failure: a device/driver error, an internal error. */
#define TORCH_ARENA_ERR_OTHER 2
/** A bad configuration text (the message names the key, the value and the accepted forms), or
 *  a configuration change after the allocator was initialised. */
#define TORCH_ARENA_ERR_CONFIG 3
/** A pointer torch-arena never returned, a double free, or a size that differs from the request
 *  (the message names the pointer). Nothing was changed. */
#define TORCH_ARENA_ERR_BAD_POINTER 4
/** A device ordinal outside what was configured. */
#define TORCH_ARENA_ERR_BAD_DEVICE 5
/** A NULL out-pointer or string, a buffer too small, an out-of-range argument. */
#define TORCH_ARENA_ERR_INVALID_ARGUMENT 6
/** A panic inside torch-arena was caught at the boundary: a bug; the process can go on. */
#define TORCH_ARENA_ERR_PANIC 7

/** What torch_arena_defragment / torch_arena_empty_cache_report recovered. */
typedef struct torch_arena_reclaim_report {
  /** Empty slabs dissolved into free pages. */
  uint64_t slabs_released;
  /** Idle mapped pages unmapped into the page pool. */
  uint64_t pages_unmapped;
  /** Pages released to the driver (cuMemRelease / cuMemFree). */
  uint64_t pages_released;
  /** Bytes of idle pages unmapped into the pool: still reserved (memory_reserved() does not
   *  drop by them), but no longer tied to one address range, so any new range can use them. */
  uint64_t bytes_recovered;
  /** Bytes given back to the driver. */
  uint64_t bytes_released;
} torch_arena_reclaim_report;

/** What torch_arena_growth reports: the physical memory a device's arena created since it
 *  started (cuMemCreate handles, or cuMemAlloc segments without VMM), by what the request it
 *  served did to the bytes requested. */
typedef struct torch_arena_growth_t {
  /** For requests that took the bytes requested to a new peak (the most ever requested at once,
   *  whatever reset_peak_memory_stats reset): growth any allocator needs. */
  uint64_t at_peak_handles;
  uint64_t at_peak_bytes;
  /** For requests that left them at or under that peak: the memory existed, not where the
   *  request landed (layout). After warm-up, this is the growth a steady state avoids. */
  uint64_t below_peak_handles;
  uint64_t below_peak_bytes;
} torch_arena_growth_t;

/** What torch_arena_pages reports: where a device's physical memory is, in bytes. With VMM, the
 *  four add up to what the arena holds reserved. */
typedef struct torch_arena_pages_t {
  /** Bytes per physical page (the granularity of the counts below). */
  uint64_t page_size;
  /** Pages holding at least one live (or pending) allocation. */
  uint64_t in_use_bytes;
  /** Pages mapped and holding nothing: reused where they are, or moved where a new range needs
   *  them. */
  uint64_t idle_mapped_bytes;
  /** Pages mapped and holding nothing that cannot move: a physical handle moves only whole, and
   *  other pages of theirs hold live allocations (or they belong to a private pool). */
  uint64_t held_bytes;
  /** Pages created and mapped nowhere, ready for any new range. */
  uint64_t pooled_bytes;
  /** What the arena may hold reserved: the device's capacity, or its memory fraction of it. */
  uint64_t limit_bytes;
  /** The device's free bytes, as the driver reports them (0 where it cannot say). */
  uint64_t device_free_bytes;
} torch_arena_pages_t;

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * The pair PyTorch calls (CUDAPluggableAllocator(path, "torch_arena_malloc", "torch_arena_free")).
 * Implemented in C++ (cpp_shim/shim.cpp). */

/**
 * alloc_fn: `void* alloc(size_t size, int device, cudaStream_t stream)`.
 *
 * Returns a pointer to at least `size` bytes of device memory on `device`, aligned to 512 bytes,
 * for use on `stream`. Size 0 returns NULL (as PyTorch's native allocator does).
 * Never returns NULL for size > 0 (PyTorch does not check): on failure it THROWS a C++ exception
 * deriving from std::runtime_error (PyTorch turns it into a Python RuntimeError):
 *   - out of memory: torch_arena::OutOfMemoryError, whose what() starts with
 *     "CUDA out of memory. Tried to allocate" (the text libraries match);
 *   - anything else (bad configuration, bad device, driver error): std::runtime_error.
 * Catch these as std::exception (or std::runtime_error): the concrete class's type information
 * is not exported from the library, so `catch (torch_arena::OutOfMemoryError&)` does not match
 * across a dlopen boundary.
 */
TORCH_ARENA_API void* torch_arena_malloc(size_t size, int device, void* stream);

/**
 * free_fn: `void free(void* ptr, size_t size, int device, cudaStream_t stream)`, with the size,
 * device and stream of the allocation (PyTorch passes the alloc-time values).
 *
 * NULL is a no-op. Never throws and never fails loudly (PyTorch frees from destructors): a
 * pointer never returned, a pointer inside an allocation or a double free changes nothing; a
 * size that differs from the request still frees the allocation (the pointer is what names it;
 * keeping it would leak it for good, and a retried free is then a double free). Each sets the
 * last error (naming the pointer), counts in torch_arena_bad_free_count, and is logged at warn
 * level (rate-limited: the first 10 of each kind, then every 1000th; see CONVENTIONS, Logging).
 */
TORCH_ARENA_API void torch_arena_free(void* ptr, size_t size, int device, void* stream) TORCH_ARENA_NOEXCEPT;

/* ---------------------------------------------------------------------------------------------
 * Private pools (CUDA graph capture), the C side. PyTorch's three pool hooks are C++ functions
 * (declared at the end of this header); they call these, with PyTorch's MempoolId_t
 * (std::pair<unsigned long long, unsigned long long>) split into id0 = .first, id1 = .second.
 * The semantics are PyTorch's (docs/cuda-graphs.md): between begin and end the allocations the
 * capture's filter accepts come from the pool; the pool's memory (freed during capture or
 * after) serves only that pool until its last release, and never leaves its address range
 * before: nothing unmaps, moves or releases it while its graphs may replay. */

/** Pool (id0, id1) of `device`: created (or shared: one use more) and recording. Fails
 *  (TORCH_ARENA_ERR_OTHER) if it is recording already. Failures are also logged at warn. */
int torch_arena_pool_begin(int device, uint64_t id0, uint64_t id1) TORCH_ARENA_NOEXCEPT;

/** The pool stops recording; it keeps its memory. Fails if it is not recording. */
int torch_arena_pool_end(int device, uint64_t id0, uint64_t id1) TORCH_ARENA_NOEXCEPT;

/** One use of the pool ends (a graph was reset or destroyed). With none left, its memory returns
 *  to general use as it becomes free, once a device-wide synchronisation (empty_cache, the
 *  out-of-memory path) proves that its graphs no longer run. Releasing the last use of a pool
 *  that is recording also ends its recording (a released pool takes no new memory): a later
 *  torch_arena_pool_end of it fails, and torch_arena_try_malloc_pool for it gets general
 *  memory. */
int torch_arena_pool_release(int device, uint64_t id0, uint64_t id1) TORCH_ARENA_NOEXCEPT;

/** torch_arena_try_malloc from pool (id0, id1) while it is recording. For a pool that is not
 *  recording (never begun, ended, or released) it does not fail: it serves general memory, as
 *  torch_arena_try_malloc does, because the shim's filter may accept a stream just before
 *  another thread ends the capture, and that allocation is then not part of it. Check with
 *  torch_arena_pool_of where a block went. */
int torch_arena_try_malloc_pool(size_t size, int device, void* stream, uint64_t id0, uint64_t id1,
                                void** out) TORCH_ARENA_NOEXCEPT;

/** What a private pool holds (torch_arena_pool_info). */
typedef struct torch_arena_pool_info_t {
  /** Captures sharing the pool that have not released it. */
  uint32_t use_count;
  /** 1 between begin and end. */
  uint32_t recording;
  /** 1 once every use was released (its memory is leaving). */
  uint32_t released;
  /** Streams that allocated in the pool and still hold memory there. */
  uint32_t states;
  /** Pages mapped in the pool's address ranges; of those, pages holding live blocks. */
  uint64_t mapped_pages;
  uint64_t used_pages;
} torch_arena_pool_info_t;

/** What pool (id0, id1) of `device` holds, into *out. TORCH_ARENA_ERR_BAD_POINTER (and *out
 *  zeroed) for a pool the device does not know: never begun, or released and wholly given back. */
int torch_arena_pool_info(int device, uint64_t id0, uint64_t id1,
                          torch_arena_pool_info_t* out) TORCH_ARENA_NOEXCEPT;

/** 1 if `ptr` lies in the memory of a private pool of `device` (its id to *id0, *id1 when not
 *  NULL), 0 if not, a negative status code on failure. */
int torch_arena_pool_of(void* ptr, int device, uint64_t* id0, uint64_t* id1) TORCH_ARENA_NOEXCEPT;

/* ---------------------------------------------------------------------------------------------
 * The status-returning forms of malloc/free (what the shim calls; usable from C). */

/**
 * Allocate like torch_arena_malloc, without exceptions; the pointer goes to *out (NULL for size 0).
 * Returns exactly one of: TORCH_ARENA_OK (0); TORCH_ARENA_ERR_OOM (1), the last error starting with
 * "CUDA out of memory. Tried to allocate"; TORCH_ARENA_ERR_OTHER (2), any other failure,
 * out == NULL included (then nothing is allocated).
 */
int torch_arena_try_malloc(size_t size, int device, void* stream, void** out) TORCH_ARENA_NOEXCEPT;

/**
 * Free like torch_arena_free, returning the outcome: TORCH_ARENA_OK, TORCH_ARENA_ERR_BAD_POINTER
 * (unknown pointer, double free, size mismatch), TORCH_ARENA_ERR_BAD_DEVICE, TORCH_ARENA_ERR_CONFIG,
 * TORCH_ARENA_ERR_OTHER or TORCH_ARENA_ERR_PANIC. Failures are recorded, counted and logged as for
 * torch_arena_free.
 */
int torch_arena_try_free(void* ptr, size_t size, int device, void* stream) TORCH_ARENA_NOEXCEPT;

/** Number of failed frees so far (any reason), process-wide. */
uint64_t torch_arena_bad_free_count(void) TORCH_ARENA_NOEXCEPT;

/**
 * The out-of-memory observer: `size_t observer(int device, size_t size, char* buf, size_t cap)`,
 * called at every out-of-memory error of torch_arena_malloc / torch_arena_try_malloc, before the
 * error is returned or thrown, on the allocating thread, with no lock of torch-arena held (it may
 * call back into torch-arena, but must not allocate device memory). It may write a line of at
 * most `cap` bytes (UTF-8, no NUL needed) into `buf` and return its length: the line is appended
 * to the error message. The Python package sets one that writes a memory snapshot and names the
 * file (TORCH_ARENA_OOM_SNAPSHOT, or leaks:True). NULL clears it. Returns 0.
 */
typedef size_t (*torch_arena_oom_observer)(int device, size_t size, char* buf, size_t cap);
int torch_arena_set_oom_observer(torch_arena_oom_observer observer) TORCH_ARENA_NOEXCEPT;

/* ---------------------------------------------------------------------------------------------
 * PyTorch's optional hooks (set on the object returned by CUDAPluggableAllocator.allocator()).
 * They return nothing, so failures are recorded as the last error and logged at warn level
 * (rate-limited). */

/**
 * set_init_fn: `void(int device_count)`, called at CUDA lazy init. Records the count and reads
 * the configuration (a bad TORCH_ARENA_CONF is reported here already); opens no device.
 */
void torch_arena_init(int device_count) TORCH_ARENA_NOEXCEPT;

/**
 * set_reset_fn: `void(void)`, called by torch.cuda.empty_cache() (and on CUDA graph capture
 * entry). Returns every cached page of every open device to the driver.
 */
void torch_arena_empty_cache(void) TORCH_ARENA_NOEXCEPT;

/**
 * set_memory_fraction_fn: `void(double fraction, int device)`, called by
 * torch.cuda.set_per_process_memory_fraction(fraction, device). Caps the bytes the arena of
 * `device` may hold at fraction x device memory; fraction must be in (0, 1] (else the last error
 * is set and nothing changes). Cached pages above a lowered cap are released (pooled pages,
 * then idle mapped ones, waiting for the GPU to finish with them); memory held by live
 * allocations is never touched, so reserved memory stays above the cap only by what they hold.
 * A request beyond the cap fails as out of memory.
 */
void torch_arena_set_memory_fraction(double fraction, int device) TORCH_ARENA_NOEXCEPT;

/**
 * set_record_stream_fn: `void(void* ptr, cudaStream_t stream)`, called by
 * tensor.record_stream(stream). `ptr` is a pointer torch_arena_malloc returned; its memory is not
 * reused until work queued on `stream` (up to its free) has completed. An unknown pointer sets
 * the last error.
 */
void torch_arena_record_stream(void* ptr, void* stream) TORCH_ARENA_NOEXCEPT;

/**
 * set_base_alloc_fn: `void*(void* ptr, size_t* size)`. Returns the base pointer of the live
 * allocation containing `ptr` (which may point inside it) and writes its size to *size.
 * An unknown pointer returns `ptr` with *size = 0 and sets the last error; size == NULL sets the
 * last error (and returns `ptr`).
 */
void* torch_arena_base_alloc(void* ptr, size_t* size) TORCH_ARENA_NOEXCEPT;

/* ---------------------------------------------------------------------------------------------
 * Configuration, errors, version. */

/**
 * Install a configuration (TORCH_ARENA_CONF grammar) before first use, instead of reading
 * TORCH_ARENA_CONF. Returns TORCH_ARENA_OK; TORCH_ARENA_ERR_CONFIG for a bad text (nothing is
 * installed; the message names the key, the value and the accepted forms) or when the allocator
 * is already initialised with a different configuration (the same one is accepted);
 * TORCH_ARENA_ERR_INVALID_ARGUMENT for conf == NULL.
 */
int torch_arena_configure(const char* conf) TORCH_ARENA_NOEXCEPT;

/** The configuration in force, every key spelled out ("device:sim,...,cpu_tensors:False"), copied
 *  into buf snprintf style (see CONVENTIONS). Returns 0 when torch-arena is not initialised yet (no
 *  torch_arena_configure call and no allocation so far), with the reason as the last error. */
size_t torch_arena_config(char* buf, size_t cap) TORCH_ARENA_NOEXCEPT;

/** Validate a configuration text without installing it: TORCH_ARENA_OK or TORCH_ARENA_ERR_CONFIG
 *  (TORCH_ARENA_ERR_INVALID_ARGUMENT for NULL), with the reason as the last error. */
int torch_arena_check_config(const char* conf) TORCH_ARENA_NOEXCEPT;

/**
 * Copy the last error message into buf (snprintf style; see CONVENTIONS): the calling thread's
 * most recent one, or the process-wide most recent one when this thread has none. Returns its
 * full length in bytes; 0 when there is none.
 */
size_t torch_arena_last_error(char* buf, size_t cap) TORCH_ARENA_NOEXCEPT;

/** Forget the last error, of this thread and process-wide. */
void torch_arena_clear_last_error(void) TORCH_ARENA_NOEXCEPT;

/** The library version ("0.1.0"); a static string. */
const char* torch_arena_version(void) TORCH_ARENA_NOEXCEPT;

/* ---------------------------------------------------------------------------------------------
 * Statistics and maintenance (for the Python package). `device` is a CUDA ordinal; a device not
 * yet used is opened by these calls. */

/** Number of torch.cuda.memory_stats() keys (122), or -1 on an internal error. */
int64_t torch_arena_stats_count(void) TORCH_ARENA_NOEXCEPT;

/** Key i (0 <= i < torch_arena_stats_count(), sorted as memory_stats() sorts them, e.g.
 *  "active.all.allocated"), a static string; NULL when out of range (last error set). */
const char* torch_arena_stats_key(int64_t i) TORCH_ARENA_NOEXCEPT;

/**
 * Fill values[0 .. torch_arena_stats_count()) with the statistics of `device`, in key order
 * (values[i] belongs to torch_arena_stats_key(i)). n is the capacity of values and must be at
 * least the count (else TORCH_ARENA_ERR_INVALID_ARGUMENT); values past the count are not touched.
 */
int torch_arena_stats(int device, int64_t* values, size_t n) TORCH_ARENA_NOEXCEPT;

/**
 * memory_summary() text of `device` (PyTorch's table, then the torch-arena section) into buf,
 * snprintf style. Returns the full length; 0 on failure (last error set; buf gets "").
 */
size_t torch_arena_summary(int device, int abbreviated, char* buf, size_t cap) TORCH_ARENA_NOEXCEPT;

/** reset_peak_memory_stats(device): every peak becomes the current value. Status code. */
int torch_arena_reset_peak_stats(int device) TORCH_ARENA_NOEXCEPT;

/** reset_accumulated_memory_stats(device): allocated/freed totals and counters to 0. Status code. */
int torch_arena_reset_accumulated_stats(int device) TORCH_ARENA_NOEXCEPT;

/** The memory `device`'s arena created, into *out. Status code (out == NULL:
 *  TORCH_ARENA_ERR_INVALID_ARGUMENT). */
int torch_arena_growth(int device, torch_arena_growth_t* out) TORCH_ARENA_NOEXCEPT;

/** Where `device`'s physical memory is, into *out. Status code (out == NULL:
 *  TORCH_ARENA_ERR_INVALID_ARGUMENT). */
int torch_arena_pages(int device, torch_arena_pages_t* out) TORCH_ARENA_NOEXCEPT;

/** Return empty slabs and idle mapped ranges of `device` to the page pool; *out says what was
 *  recovered. Status code (out == NULL: TORCH_ARENA_ERR_INVALID_ARGUMENT, nothing done). */
int torch_arena_defragment(int device, torch_arena_reclaim_report* out) TORCH_ARENA_NOEXCEPT;

/** torch_arena_empty_cache on every open device, with what was recovered in *out. Status code
 *  (out == NULL: TORCH_ARENA_ERR_INVALID_ARGUMENT, nothing done). */
int torch_arena_empty_cache_report(torch_arena_reclaim_report* out) TORCH_ARENA_NOEXCEPT;

/* ---------------------------------------------------------------------------------------------
 * Logging (see CONVENTIONS). Levels as integers: 0 off, 1 error, 2 warn, 3 info, 4 debug,
 * 5 trace. A consumer (the Python package) calls torch_arena_log_attach(1), then
 * torch_arena_log_drain from its own thread whenever convenient, and at exit drains a last time
 * and calls torch_arena_log_attach(0) so that later records (frees during shutdown) reach stderr.
 * Each record goes to exactly one place: records printed to stderr before attaching are not
 * queued, so the consumer never sees one twice. */

/**
 * Set the process-wide log level by name: "error", "warn" (or "warning"), "info", "debug",
 * "trace" or "off", case-insensitive. Takes effect at once, on every thread. Returns
 * TORCH_ARENA_OK; TORCH_ARENA_ERR_CONFIG for any other name (the level is unchanged; the last
 * error names the value and the accepted ones); TORCH_ARENA_ERR_INVALID_ARGUMENT for NULL.
 */
int torch_arena_set_log_level(const char* level) TORCH_ARENA_NOEXCEPT;

/** The current log level, 0 (off) .. 5 (trace). Not a status code. */
int torch_arena_log_level(void) TORCH_ARENA_NOEXCEPT;

/**
 * attached != 0: a consumer takes over delivery; from now on records are appended to the queue
 * and nothing is written to stderr. attached == 0 (the initial state): records go to stderr
 * again; records already queued stay there until drained. Not reference-counted.
 * The queue holds the 1024 most recent records: when it is full the oldest is dropped and
 * counted (torch_arena_log_dropped).
 */
void torch_arena_log_attach(int attached) TORCH_ARENA_NOEXCEPT;

/**
 * Pop as many whole queued records, oldest first, as fit into buf (cap bytes, room for a NUL
 * included) and write them one per line:
 *
 *     LEVEL \t TARGET \t MESSAGE \n      (no spaces; shown spaced for reading)
 *
 * LEVEL is ERROR, WARN, INFO, DEBUG or TRACE; TARGET is the Rust module that emitted the record
 * (e.g. "torch_arena::abi"); MESSAGE is UTF-8 text. In TARGET and MESSAGE a backslash, tab,
 * newline and carriage return are escaped as the two characters \\, \t, \n, \r, so every record
 * is exactly one line with exactly two tabs. A message longer than 3000 bytes (escaped) is cut
 * and ends with "... [truncated]"; every line is at most 3208 bytes, so cap >= 4096 always
 * holds at least one record. The bytes written are followed by a NUL.
 *
 * Returns the number of bytes written, < cap; 0 when the queue is empty. When the first record
 * alone does not fit, nothing is popped, buf[0] is set to NUL (if cap > 0) and the record's
 * length is returned, which is >= cap (snprintf style: a buffer of that length + 1 holds it).
 * buf may be NULL with cap 0: a cheap probe, 0 exactly when the queue is empty.
 */
size_t torch_arena_log_drain(char* buf, size_t cap) TORCH_ARENA_NOEXCEPT;

/** Records dropped so far because the queue was full (process-wide, never reset). */
uint64_t torch_arena_log_dropped(void) TORCH_ARENA_NOEXCEPT;

/* ------------------------------------------------------------------------------------------
 * TRACKING: steps, tags, allocation sites, leak reports, snapshots (docs/tracking-abi.md has the
 * JSON schemas; src/track/mod.rs the design).
 *
 * Every live allocation is tracked, always: block size, requested size, stream, thread (a small
 * per-thread number), sequence number, time (microseconds since the allocator started, from a
 * coarse monotonic clock: a few milliseconds of resolution), step, tag and site. Sites (call
 * stacks) are captured only as the configuration asks (keys sites, sites_every, sites_min_kb;
 * torch_arena_set_sites at run time). Site ids are small integers, 0 = not captured. Frames in
 * the JSON are innermost first: {"filename","line","name","kind":"python"|"native"} and, for
 * native frames, "ip" (a hex string); the leading frames of torch-arena itself are left out.
 *
 * The JSON functions write into buf snprintf style (see CONVENTIONS): they return the full
 * length; when that is >= cap the text was cut, call again with a bigger buffer. 0 means failure
 * (device out of range, bad configuration), with the last error set. A device never used has no
 * allocations and no segments (its JSON is still valid). Integers are JSON numbers; pointers and
 * streams are unsigned decimal integers.
 * ------------------------------------------------------------------------------------------ */

/**
 * Advance the process-wide step. At the boundary, every site's live bytes and count are recorded
 * (the last 256 boundaries per device are kept) for the leak judgement. Steps start at 0; returns
 * the new step (the first call returns 1). 0 on failure.
 */
uint64_t torch_arena_step(void) TORCH_ARENA_NOEXCEPT;

/** The current step (0 before the first torch_arena_step, and on failure). */
uint64_t torch_arena_current_step(void) TORCH_ARENA_NOEXCEPT;

/**
 * Push tag (UTF-8, any text) on the calling thread's tag stack: allocations that thread makes
 * from now on carry the innermost tag until it is popped (other threads keep their own). 0, TORCH_ARENA_ERR_INVALID_ARGUMENT (NULL)
 * or TORCH_ARENA_ERR_CONFIG (not UTF-8).
 */
int torch_arena_tag_push(const char* tag) TORCH_ARENA_NOEXCEPT;

/** Pop the calling thread's innermost tag. 0, or TORCH_ARENA_ERR_INVALID_ARGUMENT when this
 * thread's stack is empty. */
int torch_arena_tag_pop(void) TORCH_ARENA_NOEXCEPT;

/**
 * Change site capture at run time: mode "none", "python", "native" or "all" (as the sites key);
 * capture one allocation in `every` (>= 1) per thread; only requests of at least min_bytes.
 * 0, TORCH_ARENA_ERR_CONFIG (bad mode or every == 0; nothing changes) or
 * TORCH_ARENA_ERR_INVALID_ARGUMENT (NULL mode).
 * Python capture costs about 1-5 microseconds per captured allocation (more while another thread
 * holds the GIL); native capture about 2-7 microseconds. Sample or threshold accordingly.
 */
int torch_arena_set_sites(const char* mode, uint64_t every, uint64_t min_bytes) TORCH_ARENA_NOEXCEPT;

/**
 * Live allocations of `device`, oldest first:
 * {"device":0,"step":5,"allocations":[{"ptr":N,"size":N,"requested":N,"stream":N,"thread":N,
 *  "seq":N,"time_us":N,"step":N,"tag":"eval"|null,"site":N}],"sites":{"5":[frame,...]}}
 * "size" is the block size (the request rounded as the arena rounds it); "sites" has every
 * nonzero site id referenced. May take the GIL to name Python frames (never under a lock).
 */
size_t torch_arena_live_json(int device, char* buf, size_t cap) TORCH_ARENA_NOEXCEPT;

/**
 * Leak report of `device`:
 * {"device":0,"step":12,"warmup":2,"steps_observed":10,"growing":[{"site":5,"frames":[...],
 *  "bytes_per_step":1048576.0,"count_per_step":1.0,"live_bytes":N,"live_count":N,"first_step":3,
 *  "steps_grown":9,"example_sizes":[N,...],"example_ptrs":[N,...],"tags":["eval",...]}],
 *  "old":[{"ptr":N,"size":N,"requested":N,"step":N,"age":N,"site":N,"frames":[...]}],
 *  "old_count":N}
 * A site is growing when, over the step boundaries at or after `warmup`, its live bytes rose
 * overall, never fell (from any earlier boundary to any later one) by as much as they rose, and
 * rose in at least two intervals; the rate is measured from the last boundary at which the site
 * stood at its lowest. Only sites that were captured (site != 0) are judged. "old" (empty when
 * age_steps is 0) lists live allocations at least age_steps steps old, oldest first, at most
 * 1000 ("old_count" counts them all). May take the GIL to name Python frames.
 */
size_t torch_arena_leaks_json(int device, uint64_t warmup, uint64_t age_steps, char* buf, size_t cap) TORCH_ARENA_NOEXCEPT;

/**
 * Segments and blocks of `device`, for PyTorch-schema snapshots:
 * {"device":0,"reserved":N,"allocated":N,"pooled":N,"segments":[{"address":N,"total_size":N,
 *  "stream":N,"segment_type":"large"|"small","blocks":[{"address":N,"size":N,
 *  "requested_size":N,"state":"active_allocated"|"active_pending_free"|"inactive"}]}]}
 * A segment is a run of mapped pages of one stream (or a whole cuMemAlloc segment without VMM);
 * "small" segments hold slabs. Segments are sorted by address; blocks tile each segment
 * contiguously. "pooled" = bytes of created pages mapped nowhere, so
 * sum(total_size) + pooled == reserved. "active_pending_free": freed, waiting for the events of
 * streams named by record_stream. Never takes the GIL.
 */
size_t torch_arena_layout_json(int device, char* buf, size_t cap) TORCH_ARENA_NOEXCEPT;

/**
 * enabled != 0: clear and start the history ring (at most max_entries entries per device, oldest
 * dropped first; 0 = 100000), like torch.cuda.memory._record_memory_history. enabled == 0: stop
 * recording (the entries stay readable). 0 or an error code. While recording, each malloc and
 * free also reads the device's reserved bytes (one more arena lock per call).
 */
int torch_arena_history_enable(int enabled, uint64_t max_entries) TORCH_ARENA_NOEXCEPT;

/**
 * The history ring of `device`, oldest first:
 * {"device":0,"entries":[{"action":"alloc"|"free_requested"|"free_completed"|"segment_map"|
 *  "segment_unmap","addr":N,"size":N,"stream":N,"time_us":N,"site":N}],"sites":{...}}
 * "size" is the block size. free_completed is emitted together with free_requested; when the
 * allocation was used on other streams (record_stream) it carries "pending":true: its memory is
 * reusable only after those streams' events complete. segment_map / segment_unmap record a change
 * of the device's reserved bytes across one malloc (addr = the allocation's address) or one free
 * (addr = 0), size = the change; changes made by empty_cache or idle-page release are not
 * recorded. May take the GIL to name Python frames.
 */
size_t torch_arena_history_json(int device, char* buf, size_t cap) TORCH_ARENA_NOEXCEPT;

#ifdef __cplusplus
} /* extern "C" */

#include <functional>
#include <utility>

struct CUstream_st; /* cudaStream_t is CUstream_st* (cuda_runtime_api.h) */

namespace torch_arena {

/** PyTorch's c10::cuda::MempoolId_t. */
using MempoolId = std::pair<unsigned long long, unsigned long long>;
/** The filter torch.cuda.graph passes: does an allocation on this stream belong to the capture? */
using StreamFilter = std::function<bool(CUstream_st*)>;

}  // namespace torch_arena

extern "C" {

/**
 * PyTorch's pool hooks (set_begin_allocate_to_pool, set_end_allocate_to_pool_fn,
 * set_release_pool on the allocator object; the Python package sets them). C++ functions with
 * C names: PyTorch reinterpret_casts the integer address to `void(int, MempoolId_t,
 * std::function<bool(cudaStream_t)>)` and `void(int, MempoolId_t)`. The std::function is passed
 * by value, so these need the C++ ABI PyTorch's wheel was built with (libstdc++, whose
 * std::function is 32 bytes; checked when the shim compiles, see docs/cuda-graphs.md).
 *
 * begin keeps `filter`; until end, every torch_arena_malloc on `device` asks the recording
 * filters in the order their pools began and takes the first that accepts the stream to the
 * pool (a filter that throws counts as refusing). begin throws std::runtime_error when the pool
 * cannot record (already recording, as PyTorch's own TORCH_CHECK; a bad device or
 * configuration), so the capture does not start; end and release never throw: a failure (ended
 * or released without begin) sets the last error and is logged at warn. An allocation routed to
 * a pool that stopped recording meanwhile (another thread ended it) is served from general
 * memory.
 */
TORCH_ARENA_API void torch_arena_begin_allocate_to_pool(int device, torch_arena::MempoolId id,
                                                        torch_arena::StreamFilter filter);
TORCH_ARENA_API void torch_arena_end_allocate_to_pool(int device, torch_arena::MempoolId id) noexcept;
TORCH_ARENA_API void torch_arena_release_pool(int device, torch_arena::MempoolId id) noexcept;

} /* extern "C" */

namespace torch_arena {

/** Thrown by torch_arena_malloc when a request cannot be met; what() starts with
 *  "CUDA out of memory. Tried to allocate". Catch it as std::exception across a dlopen boundary. */
class OutOfMemoryError : public std::runtime_error {
 public:
  explicit OutOfMemoryError(const std::string& what);
  ~OutOfMemoryError() override;
};

}  // namespace torch_arena
#endif

#endif /* TORCH_ARENA_H */
