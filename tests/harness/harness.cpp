// A stand-in for PyTorch: loads libtorch_arena.so with dlopen and calls it exactly as
// CUDAPluggableAllocator does, through raw function pointers of PyTorch's types, never checking
// for NULL, and catching failures as `const std::exception&` (the concrete exception type is not
// visible across the dlopen boundary, and PyTorch does not know it anyway).
//
// usage: torch_arena_harness <path/to/libtorch_arena.so> <threads|oom|hooks|badfree|hostile>
// The library reads its configuration from TORCH_ARENA_CONF (the test sets a simulated device).
// Prints "harness <scenario>: ok" and exits 0 on success; prints the failed check and exits 1.

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <exception>
#include <iterator>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

// PyTorch's types (CUDAPluggableAllocator.h; cudaStream_t is `CUstream_st*`, ABI-identical to void*).
struct CUstream_st;
using cudaStream_t = CUstream_st*;
using AllocFn = void* (*)(size_t, int, cudaStream_t);
using FreeFn = void (*)(void*, size_t, int, cudaStream_t);
using InitFn = void (*)(int);
using ResetFn = void (*)();
using MemoryFractionFn = void (*)(double, int);
using RecordStreamFn = void (*)(void*, cudaStream_t);
using BaseAllocFn = void* (*)(void*, size_t*);

// The query calls, as the Python package declares them with ctypes.
struct ReclaimReport {
  uint64_t slabs_released, pages_unmapped, pages_released, bytes_recovered, bytes_released;
};
using StatsCountFn = int64_t (*)();
using StatsKeyFn = const char* (*)(int64_t);
using StatsFn = int (*)(int, int64_t*, size_t);
using SummaryFn = size_t (*)(int, int, char*, size_t);
using LastErrorFn = size_t (*)(char*, size_t);
using ClearLastErrorFn = void (*)();
using VersionFn = const char* (*)();
using TryFreeFn = int (*)(void*, size_t, int, void*);
using BadFreeCountFn = uint64_t (*)();
using ReclaimFn = int (*)(int, ReclaimReport*);
using EmptyCacheReportFn = int (*)(ReclaimReport*);
using ResetStatsFn = int (*)(int);

const char* const kOomPrefix = "CUDA out of memory. Tried to allocate";

std::string g_scenario = "?";

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stdout, "harness %s: FAILED: %s\n", g_scenario.c_str(), what.c_str());
  std::fflush(stdout);
  std::exit(1);
}

#define CHECK(cond, msg)                                                                      \
  do {                                                                                        \
    if (!(cond)) fail(std::string("check `") + #cond + "` at line " + std::to_string(__LINE__) + \
                      ": " + (msg));                                                          \
  } while (0)

// Like PyTorch: `reinterpret_cast` of an integer address (ctypes gives an int) to the fn type.
template <class F>
F sym(void* lib, const char* name) {
  void* p = dlsym(lib, name);
  if (p == nullptr) fail(std::string("dlsym(") + name + ") is NULL: " + dlerror());
  return reinterpret_cast<F>(reinterpret_cast<uintptr_t>(p));
}

struct Lib {
  AllocFn alloc;
  FreeFn free;
  InitFn init;
  ResetFn reset;
  MemoryFractionFn memory_fraction;
  RecordStreamFn record_stream;
  BaseAllocFn base_alloc;
  StatsCountFn stats_count;
  StatsKeyFn stats_key;
  StatsFn stats;
  SummaryFn summary;
  LastErrorFn last_error;
  ClearLastErrorFn clear_last_error;
  VersionFn version;
  TryFreeFn try_free;
  BadFreeCountFn bad_free_count;
  ReclaimFn defragment;
  EmptyCacheReportFn empty_cache_report;
  ResetStatsFn reset_peak;
  ResetStatsFn reset_accumulated;
  void* handle;

  explicit Lib(void* h)
      : alloc(sym<AllocFn>(h, "torch_arena_malloc")),
        free(sym<FreeFn>(h, "torch_arena_free")),
        init(sym<InitFn>(h, "torch_arena_init")),
        reset(sym<ResetFn>(h, "torch_arena_empty_cache")),
        memory_fraction(sym<MemoryFractionFn>(h, "torch_arena_set_memory_fraction")),
        record_stream(sym<RecordStreamFn>(h, "torch_arena_record_stream")),
        base_alloc(sym<BaseAllocFn>(h, "torch_arena_base_alloc")),
        stats_count(sym<StatsCountFn>(h, "torch_arena_stats_count")),
        stats_key(sym<StatsKeyFn>(h, "torch_arena_stats_key")),
        stats(sym<StatsFn>(h, "torch_arena_stats")),
        summary(sym<SummaryFn>(h, "torch_arena_summary")),
        last_error(sym<LastErrorFn>(h, "torch_arena_last_error")),
        clear_last_error(sym<ClearLastErrorFn>(h, "torch_arena_clear_last_error")),
        version(sym<VersionFn>(h, "torch_arena_version")),
        try_free(sym<TryFreeFn>(h, "torch_arena_try_free")),
        bad_free_count(sym<BadFreeCountFn>(h, "torch_arena_bad_free_count")),
        defragment(sym<ReclaimFn>(h, "torch_arena_defragment")),
        empty_cache_report(sym<EmptyCacheReportFn>(h, "torch_arena_empty_cache_report")),
        reset_peak(sym<ResetStatsFn>(h, "torch_arena_reset_peak_stats")),
        reset_accumulated(sym<ResetStatsFn>(h, "torch_arena_reset_accumulated_stats")),
        handle(h) {}

  std::string error() const {
    size_t n = last_error(nullptr, 0);
    std::vector<char> buf(n + 1, 'x');
    size_t m = last_error(buf.data(), buf.size());
    if (m != n) fail("torch_arena_last_error changed length between two calls");
    if (buf[n] != '\0') fail("torch_arena_last_error did not NUL-terminate");
    return std::string(buf.data(), n);
  }

  // One statistic of device 0, by key, through the count/key/values calls.
  int64_t stat(const char* key) const {
    int64_t count = stats_count();
    CHECK(count > 0, "torch_arena_stats_count() = " + std::to_string(count));
    std::vector<int64_t> values(static_cast<size_t>(count), INT64_MIN);
    int rc = stats(0, values.data(), values.size());
    CHECK(rc == 0, "torch_arena_stats failed: " + error());
    for (int64_t i = 0; i < count; ++i) {
      const char* k = stats_key(i);
      CHECK(k != nullptr, "torch_arena_stats_key(" + std::to_string(i) + ") is NULL");
      if (std::strcmp(k, key) == 0) return values[static_cast<size_t>(i)];
    }
    fail(std::string("no stat key ") + key);
  }

  std::string summary_text(int abbreviated) const {
    size_t n = summary(0, abbreviated, nullptr, 0);
    std::vector<char> buf(n + 1, 'x');
    size_t m = summary(0, abbreviated, buf.data(), buf.size());
    CHECK(m == n, "summary length changed between two calls");
    CHECK(buf[n] == '\0', "summary not NUL-terminated");
    return std::string(buf.data(), n);
  }
};

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

bool sim_backing() {
  const char* conf = std::getenv("TORCH_ARENA_CONF");
  return conf != nullptr && std::strstr(conf, "sim_backing:True") != nullptr;
}

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%#" PRIxPTR, reinterpret_cast<uintptr_t>(p));
  return buf;
}

cudaStream_t stream_of(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// Calls alloc the way PyTorch does, turning an exception into a test failure.
void* must_alloc(const Lib& lib, size_t size, cudaStream_t stream) {
  try {
    void* p = lib.alloc(size, 0, stream);
    if (size > 0) {
      CHECK(p != nullptr, "alloc(" + std::to_string(size) + ") returned NULL without throwing");
      CHECK(reinterpret_cast<uintptr_t>(p) % 512 == 0, "alloc returned " + hex(p) + ", not 512-byte aligned");
    } else {
      CHECK(p == nullptr, "alloc(0) returned " + hex(p) + ", expected NULL");
    }
    return p;
  } catch (const std::exception& e) {
    fail("alloc(" + std::to_string(size) + ") threw: " + e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// Pattern oracle: with sim_backing:True every allocation is host memory; each live allocation
// carries its own tag at its start, its end and a few points between (everything when small).

uint64_t word_for(uint64_t tag, size_t off) { return tag * 0x9E3779B97F4A7C15ull ^ off; }

template <class Fn>
void pattern_points(size_t size, Fn fn) {
  if (size <= 64 * 1024) {
    for (size_t off = 0; off + 8 <= size; off += 8) fn(off);
  } else {
    const size_t last = (size - 8) & ~size_t{7};
    for (size_t i = 0; i < 17; ++i) fn(((last / 16) * i) & ~size_t{7});
    fn(last);
  }
}

void write_pattern(void* p, size_t size, uint64_t tag) {
  auto* base = static_cast<unsigned char*>(p);
  pattern_points(size, [&](size_t off) {
    uint64_t w = word_for(tag, off);
    std::memcpy(base + off, &w, 8);
  });
  for (size_t off = size & ~size_t{7}; off < size; ++off) base[off] = static_cast<unsigned char>(tag);
}

bool check_pattern(const void* p, size_t size, uint64_t tag, std::string* why) {
  const auto* base = static_cast<const unsigned char*>(p);
  bool ok = true;
  pattern_points(size, [&](size_t off) {
    uint64_t w;
    std::memcpy(&w, base + off, 8);
    if (ok && w != word_for(tag, off)) {
      ok = false;
      *why = "pattern of allocation " + hex(p) + " (" + std::to_string(size) + " bytes) overwritten at offset " +
             std::to_string(off);
    }
  });
  for (size_t off = size & ~size_t{7}; ok && off < size; ++off) {
    if (base[off] != static_cast<unsigned char>(tag)) {
      ok = false;
      *why = "tail byte of allocation " + hex(p) + " overwritten at offset " + std::to_string(off);
    }
  }
  return ok;
}

// ---------------------------------------------------------------------------------------------
// Scenario "threads".

struct LiveSet {
  std::mutex mu;
  std::map<uintptr_t, size_t> live;  // start -> size

  // Returns "" or why [p, p+size) overlaps a live allocation.
  std::string insert(void* p, size_t size) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> g(mu);
    auto next = live.lower_bound(a);
    if (next != live.end() && next->first < a + size) {
      return "allocation " + hex(p) + "+" + std::to_string(size) + " overlaps live " +
             hex(reinterpret_cast<void*>(next->first)) + "+" + std::to_string(next->second);
    }
    if (next != live.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second > a) {
        return "allocation " + hex(p) + "+" + std::to_string(size) + " overlaps live " +
               hex(reinterpret_cast<void*>(prev->first)) + "+" + std::to_string(prev->second);
      }
    }
    live.emplace(a, size);
    return "";
  }

  void erase(void* p) {
    std::lock_guard<std::mutex> g(mu);
    live.erase(reinterpret_cast<uintptr_t>(p));
  }
};

struct Block {
  void* ptr;
  size_t size;
  cudaStream_t stream;
  uint64_t tag;
};

size_t random_size(std::mt19937_64& rng) {
  const unsigned r = static_cast<unsigned>(rng() % 1000);
  if (r < 40) return 0;                                               // 4%: size 0
  if (r < 80) return 1 + rng() % 511;                                 // 4%: under 512 B
  if (r < 700) return 512 + rng() % ((1u << 20) - 511);               // 62%: small, up to 1 MiB
  if (r < 960) return (1u << 20) + rng() % (19u << 20);               // 26%: 1 .. 20 MiB
  return (20u << 20) + rng() % (44u << 20);                           // 4%: 20 .. 64 MiB
}

int scenario_threads(const Lib& lib) {
  lib.init(1);
  const bool backing = sim_backing();
  constexpr int kThreads = 8;
  constexpr int kOps = 5000;
  constexpr size_t kMaxLive = 24;
  LiveSet set;
  std::atomic<bool> failed{false};
  std::atomic<int> running{kThreads};
  std::atomic<uint64_t> next_tag{1};
  std::atomic<int64_t> allocations{0};
  std::mutex why_mu;
  std::string why;
  auto report = [&](const std::string& w) {
    std::lock_guard<std::mutex> g(why_mu);
    if (!failed.exchange(true)) why = w;
  };

  auto worker = [&](int tid) {
    std::mt19937_64 rng(static_cast<uint64_t>(tid) * 7919 + 17);
    const cudaStream_t own = stream_of(static_cast<uintptr_t>(tid) + 1);
    std::vector<Block> live;
    auto release = [&](size_t i) {
      Block b = live[i];
      live[i] = live.back();
      live.pop_back();
      std::string w;
      if (backing && !check_pattern(b.ptr, b.size, b.tag, &w)) report(w);
      set.erase(b.ptr);  // before free: once freed, another thread may get this address
      if (rng() % 20 == 0) lib.record_stream(b.ptr, stream_of(100 + static_cast<uintptr_t>(tid)));
      lib.free(b.ptr, b.size, 0, b.stream);
    };
    for (int op = 0; op < kOps && !failed.load(); ++op) {
      const bool do_alloc = live.empty() || (live.size() < kMaxLive && rng() % 2 == 0);
      if (!do_alloc) {
        release(static_cast<size_t>(rng() % live.size()));
        continue;
      }
      const size_t size = random_size(rng);
      const cudaStream_t stream = rng() % 3 == 0 ? nullptr : own;
      void* p = nullptr;
      try {
        p = lib.alloc(size, 0, stream);
      } catch (const std::exception& e) {
        report("thread " + std::to_string(tid) + ": alloc(" + std::to_string(size) + ") threw: " + e.what());
        break;
      }
      if (size == 0) {
        if (p != nullptr) report("alloc(0) returned " + hex(p));
        lib.free(p, 0, 0, stream);  // PyTorch frees the NULL data pointer of an empty tensor
        continue;
      }
      allocations.fetch_add(1);
      if (p == nullptr) {
        report("alloc(" + std::to_string(size) + ") returned NULL without throwing");
        break;
      }
      if (reinterpret_cast<uintptr_t>(p) % 512 != 0) report("alloc returned " + hex(p) + ", not 512-byte aligned");
      std::string w = set.insert(p, size);
      if (!w.empty()) {
        report(w);
        break;
      }
      const uint64_t tag = next_tag.fetch_add(1);
      if (backing) write_pattern(p, size, tag);
      live.push_back(Block{p, size, stream, tag});
    }
    while (!live.empty()) release(live.size() - 1);
    running.fetch_sub(1);
  };

  // A reader polls stats and the summary while the workers run (no deadlock, no failure).
  auto reader = [&]() {
    const int64_t count = lib.stats_count();
    std::vector<int64_t> values(static_cast<size_t>(count > 0 ? count : 1));
    while (running.load() > 0 && !failed.load()) {
      if (lib.stats(0, values.data(), values.size()) != 0) report("torch_arena_stats failed: " + lib.error());
      lib.summary(0, 1, nullptr, 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  std::thread r(reader);
  for (auto& t : threads) t.join();
  r.join();
  if (failed.load()) fail(why);
  CHECK(set.live.empty(), "allocations still live after every thread freed its own");

  lib.reset();  // torch.cuda.empty_cache()
  CHECK(lib.stat("allocated_bytes.all.current") == 0,
        "allocated_bytes.all.current = " + std::to_string(lib.stat("allocated_bytes.all.current")));
  CHECK(lib.stat("requested_bytes.all.current") == 0,
        "requested_bytes.all.current = " + std::to_string(lib.stat("requested_bytes.all.current")));
  CHECK(lib.stat("allocation.all.current") == 0,
        "allocation.all.current = " + std::to_string(lib.stat("allocation.all.current")));
  CHECK(lib.stat("allocation.all.allocated") == allocations.load(),
        "allocation.all.allocated = " + std::to_string(lib.stat("allocation.all.allocated")) + ", expected " +
            std::to_string(allocations.load()));
  CHECK(lib.bad_free_count() == 0, "bad frees reported: " + lib.error());
  std::printf("threads: %d threads x %d ops, %" PRId64 " allocations, backing=%d\n", kThreads, kOps,
              allocations.load(), backing ? 1 : 0);
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Scenario "oom": a tiny simulated device.

// Allocates `size` until alloc throws; returns the pointers, the exception text in *what.
std::vector<void*> fill_until_oom(const Lib& lib, size_t size, std::string* what) {
  std::vector<void*> got;
  for (int i = 0; i < 100000; ++i) {
    try {
      void* p = lib.alloc(size, 0, nullptr);
      CHECK(p != nullptr, "alloc returned NULL without throwing");
      got.push_back(p);
    } catch (const std::exception& e) {
      *what = e.what();
      CHECK(dynamic_cast<const std::runtime_error*>(&e) != nullptr, "the exception is not a std::runtime_error");
      return got;
    }
  }
  fail("no out-of-memory exception after 100000 allocations of " + std::to_string(size) + " bytes");
}

int scenario_oom(const Lib& lib) {
  lib.init(1);
  constexpr size_t kChunk = (3u << 20) + 4096 + 17;

  // One request larger than the whole device.
  try {
    void* p = lib.alloc(size_t{1} << 40, 0, nullptr);
    fail("alloc(1 TiB) returned " + hex(p) + " instead of throwing");
  } catch (const std::exception& e) {
    CHECK(starts_with(e.what(), kOomPrefix), std::string("what() = ") + e.what());
    CHECK(lib.error() == e.what(), "last error differs from what(): " + lib.error());
  }

  // The out-of-memory observer (what the Python package sets to write a snapshot) runs before
  // the exception is thrown, and its line ends the exception's message.
  {
    using Observer = size_t (*)(int, size_t, char*, size_t);
    using SetObserverFn = int (*)(Observer);
    static std::atomic<int> observed{0};
    auto set_observer = reinterpret_cast<SetObserverFn>(
        reinterpret_cast<uintptr_t>(dlsym(lib.handle, "torch_arena_set_oom_observer")));
    CHECK(set_observer != nullptr, "torch_arena_set_oom_observer is not exported");
    Observer note = [](int device, size_t size, char* buf, size_t cap) -> size_t {
      observed++;
      std::string line = "observer: device " + std::to_string(device) + ", " +
                         std::to_string(size) + " bytes";
      size_t n = std::min(line.size(), cap);
      std::memcpy(buf, line.data(), n);
      return n;
    };
    CHECK(set_observer(note) == 0, "set_oom_observer");
    try {
      void* p = lib.alloc(size_t{1} << 41, 0, nullptr);
      fail("alloc(2 TiB) returned " + hex(p) + " instead of throwing");
    } catch (const std::exception& e) {
      std::string w = e.what();
      CHECK(starts_with(w, kOomPrefix), "what() = " + w);
      CHECK(w.find("\nobserver: device 0, 2199023255552 bytes") != std::string::npos,
            "the observer's line is not in what(): " + w);
    }
    CHECK(observed.load() == 1, "observer calls: " + std::to_string(observed.load()));
    CHECK(set_observer(nullptr) == 0, "clear the observer");
  }

  std::string what;
  std::vector<void*> first = fill_until_oom(lib, kChunk, &what);
  CHECK(!first.empty(), "not even one allocation succeeded before the OOM: " + what);
  CHECK(starts_with(what, kOomPrefix), "what() = " + what);

  // At the limit: size 0 still gives NULL without throwing.
  CHECK(must_alloc(lib, 0, nullptr) == nullptr, "alloc(0)");

  // The process goes on: free everything, and the same memory can be had again.
  for (void* p : first) lib.free(p, kChunk, 0, nullptr);
  CHECK(lib.stat("allocated_bytes.all.current") == 0, "allocated bytes after freeing everything");
  void* again = must_alloc(lib, kChunk, nullptr);
  lib.free(again, kChunk, 0, nullptr);

  std::string what2;
  std::vector<void*> second = fill_until_oom(lib, kChunk, &what2);
  CHECK(second.size() >= first.size(), "after freeing everything only " + std::to_string(second.size()) +
                                           " allocations fit, " + std::to_string(first.size()) + " the first time");
  CHECK(starts_with(what2, kOomPrefix), "what() = " + what2);
  for (void* p : second) lib.free(p, kChunk, 0, nullptr);

  // Other sizes fit after an OOM too (the arena released what it cached).
  void* small = must_alloc(lib, 4096, nullptr);
  void* big = must_alloc(lib, kChunk * (first.size() / 2 > 0 ? first.size() / 2 : 1), nullptr);
  lib.free(small, 4096, 0, nullptr);
  lib.free(big, kChunk * (first.size() / 2 > 0 ? first.size() / 2 : 1), 0, nullptr);

  CHECK(lib.stat("allocated_bytes.all.current") == 0, "allocated bytes at the end");
  CHECK(lib.stat("num_ooms") >= 3, "num_ooms = " + std::to_string(lib.stat("num_ooms")));
  CHECK(lib.bad_free_count() == 0, "bad frees reported: " + lib.error());
  std::printf("oom: %zu chunks of %zu bytes fit; message: %s\n", first.size(), kChunk, what.c_str());
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Scenario "hooks": the optional hooks and the query calls. Expects sim_capacity_mb:1024.

int scenario_hooks(const Lib& lib) {
  lib.init(1);

  const char* version = lib.version();
  CHECK(version != nullptr && version[0] != '\0', "torch_arena_version() is empty");

  // Stats keys: 122, sorted, NULL past the end.
  const int64_t count = lib.stats_count();
  CHECK(count == 122, "torch_arena_stats_count() = " + std::to_string(count));
  for (int64_t i = 1; i < count; ++i) {
    CHECK(std::strcmp(lib.stats_key(i - 1), lib.stats_key(i)) < 0, "keys not sorted at " + std::to_string(i));
  }
  CHECK(lib.stats_key(count) == nullptr, "key past the end is not NULL");
  CHECK(lib.stats_key(-1) == nullptr, "key -1 is not NULL");
  CHECK(lib.stats(0, nullptr, 0) != 0, "torch_arena_stats(values=NULL) succeeded");
  std::vector<int64_t> short_buf(10);
  CHECK(lib.stats(0, short_buf.data(), short_buf.size()) != 0, "torch_arena_stats(n=10) succeeded");

  // record_stream on a live allocation, then free on the alloc stream.
  void* p = must_alloc(lib, 1 << 20, stream_of(1));
  lib.clear_last_error();
  lib.record_stream(p, stream_of(2));
  CHECK(lib.error().empty(), "record_stream on a live pointer set an error: " + lib.error());
  lib.free(p, 1 << 20, 0, stream_of(1));
  CHECK(lib.error().empty(), "free after record_stream set an error: " + lib.error());
  lib.record_stream(reinterpret_cast<void*>(0x7000deadbe00), stream_of(2));
  CHECK(!lib.error().empty(), "record_stream on an unknown pointer set no error");

  // base_alloc: an interior pointer maps to the base.
  const size_t size = (3u << 20) + 123;
  void* q = must_alloc(lib, size, nullptr);
  size_t base_size = 12345;
  void* base = lib.base_alloc(static_cast<char*>(q) + 1000, &base_size);
  CHECK(base == q, "base_alloc(q+1000) = " + hex(base) + ", expected " + hex(q));
  CHECK(base_size >= size, "base_alloc size " + std::to_string(base_size) + " < " + std::to_string(size));
  base = lib.base_alloc(q, &base_size);
  CHECK(base == q, "base_alloc(q) = " + hex(base));
  void* unknown = reinterpret_cast<void*>(0x7000deadbe00);
  lib.clear_last_error();
  base = lib.base_alloc(unknown, &base_size);
  CHECK(base == unknown && base_size == 0, "base_alloc(unknown) = " + hex(base) + ", size " + std::to_string(base_size));
  CHECK(!lib.error().empty(), "base_alloc(unknown) set no error");
  CHECK(lib.base_alloc(q, nullptr) == q, "base_alloc(q, NULL)");
  lib.free(q, size, 0, nullptr);

  // set_memory_fraction: 1024 MiB x 0.25 = 256 MiB; 512 MiB must fail with the OOM exception.
  lib.memory_fraction(0.25, 0);
  try {
    void* r = lib.alloc(512u << 20, 0, nullptr);
    fail("alloc(512 MiB) above a 0.25 fraction returned " + hex(r));
  } catch (const std::exception& e) {
    CHECK(starts_with(e.what(), kOomPrefix), std::string("what() = ") + e.what());
  }
  void* fits = must_alloc(lib, 64u << 20, nullptr);
  lib.free(fits, 64u << 20, 0, nullptr);
  lib.memory_fraction(1.0, 0);
  void* now_fits = must_alloc(lib, 512u << 20, nullptr);
  lib.free(now_fits, 512u << 20, 0, nullptr);
  lib.clear_last_error();
  lib.memory_fraction(2.0, 0);
  CHECK(!lib.error().empty(), "set_memory_fraction(2.0) set no error");

  // Summary: non-empty, snprintf-style truncation.
  const std::string text = lib.summary_text(0);
  CHECK(!text.empty(), "summary is empty: " + lib.error());
  CHECK(lib.summary_text(1).size() > 0, "abbreviated summary is empty");
  char small[10];
  std::memset(small, 'x', sizeof small);
  CHECK(lib.summary(0, 0, small, sizeof small) == text.size(), "truncated summary length");
  CHECK(small[9] == '\0' && std::strlen(small) == 9, "truncated summary not NUL-terminated at 9");

  // Reset calls and reclaim reports.
  CHECK(lib.reset_peak(0) == 0, "reset_peak_stats: " + lib.error());
  CHECK(lib.reset_accumulated(0) == 0, "reset_accumulated_stats: " + lib.error());
  ReclaimReport rr{};
  CHECK(lib.defragment(0, &rr) == 0, "defragment: " + lib.error());
  CHECK(lib.defragment(0, nullptr) != 0, "defragment(out=NULL) succeeded");
  CHECK(lib.empty_cache_report(&rr) == 0, "empty_cache_report: " + lib.error());
  CHECK(lib.empty_cache_report(nullptr) != 0, "empty_cache_report(NULL) succeeded");
  lib.reset();

  // A bad free is reported with the pointer in the last error.
  void* bogus = reinterpret_cast<void*>(0x7000abcde000);
  lib.clear_last_error();
  lib.free(bogus, 512, 0, nullptr);
  const std::string err = lib.error();
  CHECK(err.find(hex(bogus)) != std::string::npos, "last error after a bad free does not name " + hex(bogus) + ": " + err);

  CHECK(lib.stat("allocated_bytes.all.current") == 0, "allocated bytes at the end");
  std::printf("hooks: version %s, summary %zu bytes\n", version, text.size());
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Scenario "badfree": bad pointers, double frees and size mismatches are reported, never thrown,
// and leave the allocator working.

int scenario_badfree(const Lib& lib) {
  lib.init(1);
  const uint64_t before = lib.bad_free_count();

  // A pointer never returned, through PyTorch's free (must not crash or throw), then try_free.
  void* never = reinterpret_cast<void*>(0x7000f00d0000);
  lib.clear_last_error();
  lib.free(never, 4096, 0, nullptr);
  std::string err = lib.error();
  CHECK(err.find(hex(never)) != std::string::npos, "unknown-pointer free: last error does not name it: " + err);
  CHECK(lib.try_free(never, 4096, 0, nullptr) != 0, "try_free(never returned) reported success");

  // Double free.
  void* p = must_alloc(lib, 8192, nullptr);
  lib.clear_last_error();
  lib.free(p, 8192, 0, nullptr);
  CHECK(lib.error().empty(), "a good free set an error: " + lib.error());
  lib.free(p, 8192, 0, nullptr);
  err = lib.error();
  CHECK(err.find(hex(p)) != std::string::npos, "double free: last error does not name the pointer: " + err);
  CHECK(lib.try_free(p, 8192, 0, nullptr) != 0, "try_free(double free) reported success");

  // Size mismatch: reported. The arena may keep the allocation (then the right size frees it) or
  // free it anyway (then the right size is a double free); either way the books balance.
  const int64_t live_before = lib.stat("allocation.all.current");
  void* q = must_alloc(lib, 100000, nullptr);
  lib.clear_last_error();
  lib.free(q, 4096, 0, nullptr);
  err = lib.error();
  CHECK(err.find(hex(q)) != std::string::npos, "size mismatch: last error does not name the pointer: " + err);
  const int64_t live_after = lib.stat("allocation.all.current");
  if (live_after == live_before + 1) {
    CHECK(lib.try_free(q, 100000, 0, nullptr) == 0, "free with the right size after a mismatch: " + lib.error());
  } else {
    CHECK(live_after == live_before, "allocation.all.current = " + std::to_string(live_after) + " after a size mismatch");
    CHECK(lib.try_free(q, 100000, 0, nullptr) != 0, "the allocation was freed on a mismatch, yet freed again");
  }
  CHECK(lib.stat("allocation.all.current") == live_before, "allocation.all.current after the mismatch");

  // An interior pointer of a live allocation is not an allocation.
  void* r = must_alloc(lib, 1 << 20, nullptr);
  CHECK(lib.try_free(static_cast<char*>(r) + 512, (1 << 20) - 512, 0, nullptr) != 0, "freeing an interior pointer succeeded");
  lib.free(r, 1 << 20, 0, nullptr);

  // NULL is a no-op, not an error.
  lib.clear_last_error();
  lib.free(nullptr, 0, 0, nullptr);
  lib.free(nullptr, 123, 0, nullptr);
  CHECK(lib.error().empty(), "free(NULL) set an error: " + lib.error());

  // Many bad frees: the log is rate-limited, nothing breaks.
  for (int i = 0; i < 2500; ++i) lib.free(reinterpret_cast<void*>(0x7100000000 + 512 * static_cast<uintptr_t>(i)), 512, 0, nullptr);

  const uint64_t reported = lib.bad_free_count() - before;
  CHECK(reported >= 2506, "bad_free_count grew by " + std::to_string(reported) + ", expected at least 2506");

  // The allocator still works and its books balance.
  void* s = must_alloc(lib, 5000, nullptr);
  lib.free(s, 5000, 0, nullptr);
  CHECK(lib.stat("allocated_bytes.all.current") == 0, "allocated bytes at the end");
  std::printf("badfree: %" PRIu64 " bad frees reported\n", reported);
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Scenario "hostile": sizes near SIZE_MAX and far beyond the device, the stream handle
// (void*)-1, and thousands of short-lived streams, from 4 threads at once. Every refusal must be
// PyTorch's out-of-memory exception; nothing may overlap; nothing may stay reserved that a live
// allocation does not hold. Expects sim_capacity_mb:1024 with backing.

int scenario_hostile(const Lib& lib) {
  lib.init(1);
  const size_t absurd[] = {SIZE_MAX,           SIZE_MAX - 1,        SIZE_MAX - 511,
                           SIZE_MAX - 512,     SIZE_MAX - (2u << 20), size_t{1} << 50,
                           size_t{1} << 63,    (size_t{1} << 30) + 1};
  const cudaStream_t minus_one = reinterpret_cast<cudaStream_t>(~uintptr_t{0});
  std::atomic<int> failures{0};
  std::mutex err_mu;
  std::string first_error;
  auto note = [&](const std::string& e) {
    std::lock_guard<std::mutex> g(err_mu);
    if (failures++ == 0) first_error = e;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::pair<void*, size_t>> live;
      for (int round = 0; round < 750; ++round) {
        // A stream used for a few requests and never again (thousands in all), or stream -1.
        cudaStream_t s = (round % 5 == 0)
                             ? minus_one
                             : reinterpret_cast<cudaStream_t>(uintptr_t{0x100000} + t * 0x10000 + round * 16);
        size_t size = (round % 3 == 0) ? 3000 : (3u << 20) + 512u * static_cast<unsigned>(round);
        void* p = nullptr;
        try {
          p = lib.alloc(size, 0, s);
        } catch (const std::exception& e) {
          note(std::string("alloc(") + std::to_string(size) + ") threw: " + e.what());
          continue;
        }
        std::memset(p, t + 1, size);
        live.emplace_back(p, size);
        for (size_t bad : absurd) {
          try {
            void* q = lib.alloc(bad, 0, s);
            note("alloc(" + std::to_string(bad) + ") returned " + hex(q) + " instead of throwing");
          } catch (const std::exception& e) {
            if (!starts_with(e.what(), kOomPrefix)) note(std::string("not an OOM: ") + e.what());
          }
        }
        for (auto& [q, n] : live) {
          const unsigned char* b = static_cast<const unsigned char*>(q);
          if (b[0] != t + 1 || b[n - 1] != t + 1) note("a live allocation was overwritten");
        }
        if (live.size() > 3) {
          auto [q, n] = live.front();
          live.erase(live.begin());
          lib.free(q, n, 0, s);
        }
      }
      for (auto& [q, n] : live) lib.free(q, n, 0, nullptr);
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures.load() == 0, std::to_string(failures.load()) + " failures; first: " + first_error);
  CHECK(lib.stat("allocated_bytes.all.current") == 0, "allocated bytes at the end");
  CHECK(lib.bad_free_count() == 0, "bad frees reported: " + lib.error());
  ReclaimReport r{};
  CHECK(lib.empty_cache_report(&r) == 0, "empty_cache: " + lib.error());
  CHECK(lib.stat("reserved_bytes.all.current") == 0,
        "reserved after empty_cache: " + std::to_string(lib.stat("reserved_bytes.all.current")));
  CHECK(lib.stat("num_ooms") >= 4 * 750 * 8, "num_ooms = " + std::to_string(lib.stat("num_ooms")));
  std::printf("hostile: %" PRId64 " refusals, all out-of-memory exceptions\n", lib.stat("num_ooms"));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <libtorch_arena.so> <threads|oom|hooks|badfree|hostile>\n", argv[0]);
    return 2;
  }
  g_scenario = argv[2];
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) fail(std::string("dlopen: ") + dlerror());
  Lib lib(h);
  int rc;
  if (g_scenario == "threads") {
    rc = scenario_threads(lib);
  } else if (g_scenario == "oom") {
    rc = scenario_oom(lib);
  } else if (g_scenario == "hooks") {
    rc = scenario_hooks(lib);
  } else if (g_scenario == "badfree") {
    rc = scenario_badfree(lib);
  } else if (g_scenario == "hostile") {
    rc = scenario_hostile(lib);
  } else {
    fail("unknown scenario");
  }
  if (rc == 0) std::printf("harness %s: ok\n", g_scenario.c_str());
  std::fflush(stdout);
  return rc;
}
