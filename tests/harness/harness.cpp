// A stand-in for PyTorch: loads libtorch_arena.so with dlopen and calls it exactly as
// CUDAPluggableAllocator does, through raw function pointers of PyTorch's types, never checking
// for NULL, and catching failures as `const std::exception&` (the concrete exception type is not
// visible across the dlopen boundary, and PyTorch does not know it anyway).
//
// usage: torch_arena_harness <path/to/libtorch_arena.so>
//            <threads|oom|hooks|badfree|hostile|graph|graph_cuda|mixed|mixed_one_stream|bench_threads>
// The library reads its configuration from TORCH_ARENA_CONF (the test sets a simulated device;
// graph_cuda sets device:cuda and FAKE_LIBCUDA, the fake driver the harness loads first).
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
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
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
// The pool hooks, as PyTorch declares them (CUDAPluggableAllocator.h): MempoolId_t is
// std::pair<unsigned long long, unsigned long long>; the filter a std::function, by value.
using MempoolId = std::pair<unsigned long long, unsigned long long>;
using StreamFilter = std::function<bool(cudaStream_t)>;
using BeginPoolFn = void (*)(int, MempoolId, StreamFilter);
using PoolFn = void (*)(int, MempoolId);
struct PoolInfo {
  uint32_t use_count, recording, released, states;
  uint64_t mapped_pages, used_pages;
};
using PoolInfoFn = int (*)(int, uint64_t, uint64_t, PoolInfo*);
using PoolOfFn = int (*)(void*, int, uint64_t*, uint64_t*);

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


// ---------------------------------------------------------------------------------------------
// Scenarios "graph" (sim) and "graph_cuda" (fake driver): the hooks driven exactly as
// torch.cuda.graph drives them (CUDAGraph.cpp): empty_cache at __enter__; begin_allocate_to_pool
// with a filter, *then* the stream capture begins; allocations and frees on the capturing stream
// (routed to the pool by the filter) and on another stream (general memory); the capture ends,
// *then* end_allocate_to_pool; frees after capture; a second capture sharing the pool
// (graph2.capture_begin(pool=graph1.pool())); a graph's reset calls release_pool.
//
// Oracle: every allocation carries a pattern; pool blocks freed during or after capture stay in a
// "graph memory" shadow (a replay would read and write them), which only a later allocation of
// the same pool may take. No general allocation may land in pool memory or overlap the shadow,
// and every pattern (live blocks and shadow) must survive everything until the release. Before
// the last release, a general request that needs the pool's pages fails with an out-of-memory
// exception; after it, the same request succeeds.

void* g_fake = nullptr;  // the fake driver's handle (graph_cuda)

const size_t kPage = 2u << 20;
const size_t kGraphCapacity = 256u << 20;  // the tests configure the device with this capacity

// How a stream is put in capture: the sim has no way in through the ABI (the filter alone decides
// what goes to the pool there); the fake driver has cuStreamBeginCapture.
struct Capturer {
  std::function<void(cudaStream_t)> begin;
  std::function<bool(cudaStream_t)> end;  // false: the capture was invalidated
  std::function<bool(cudaStream_t)> is_capturing;
};

struct PoolHooks {
  BeginPoolFn begin;
  PoolFn end;
  PoolFn release;
  PoolInfoFn info;
  PoolOfFn pool_of;

  explicit PoolHooks(void* h)
      : begin(sym<BeginPoolFn>(h, "torch_arena_begin_allocate_to_pool")),
        end(sym<PoolFn>(h, "torch_arena_end_allocate_to_pool")),
        release(sym<PoolFn>(h, "torch_arena_release_pool")),
        info(sym<PoolInfoFn>(h, "torch_arena_pool_info")),
        pool_of(sym<PoolOfFn>(h, "torch_arena_pool_of")) {}

  // 0 for general memory, else the pool's first id.
  unsigned long long owner(void* p) const {
    uint64_t a = 0, b = 0;
    int rc = pool_of(p, 0, &a, &b);
    CHECK(rc >= 0, "torch_arena_pool_of failed: " + std::to_string(rc));
    return rc == 1 ? a : 0;
  }
};

struct Tagged {
  void* ptr;
  size_t size;
  uint64_t tag;
  unsigned long long pool;  // 0 = general
};

bool overlap(const Tagged& a, void* p, size_t size) {
  const uintptr_t x = reinterpret_cast<uintptr_t>(a.ptr), y = reinterpret_cast<uintptr_t>(p);
  return x < y + size && y < x + a.size;
}

struct GraphRun {
  const Lib& lib;
  const PoolHooks& hooks;
  std::vector<Tagged> general, pooled, shadow;  // live general, live pool, freed pool memory
  uint64_t next_tag = 1000;

  void check_all(const char* when) {
    std::string why;
    for (const auto* set : {&general, &pooled, &shadow}) {
      for (const Tagged& b : *set) {
        if (!check_pattern(b.ptr, b.size, b.tag, &why)) fail(std::string(when) + ": " + why);
      }
    }
  }

  void* alloc(size_t size, cudaStream_t s, unsigned long long want_pool) {
    void* p = must_alloc(lib, size, s);
    const unsigned long long got = hooks.owner(p);
    CHECK(got == want_pool, "allocation " + hex(p) + " on stream " + hex(s) + " is in pool " +
                                std::to_string(got) + ", expected " + std::to_string(want_pool));
    for (const Tagged& b : general) CHECK(!overlap(b, p, size), "overlaps live general " + hex(b.ptr));
    for (const Tagged& b : pooled) CHECK(!overlap(b, p, size), "overlaps live pool block " + hex(b.ptr));
    std::vector<Tagged> kept;
    for (const Tagged& b : shadow) {
      if (!overlap(b, p, size)) {
        kept.push_back(b);
        continue;
      }
      // Only the pool that handed the memory out may reuse it (a replay orders that reuse).
      CHECK(want_pool != 0 && b.pool == want_pool,
            "allocation " + hex(p) + " (pool " + std::to_string(want_pool) +
                ") takes graph memory of pool " + std::to_string(b.pool) + " at " + hex(b.ptr));
    }
    shadow.swap(kept);
    const Tagged t{p, size, next_tag++, want_pool};
    write_pattern(p, size, t.tag);
    (want_pool ? pooled : general).push_back(t);
    return p;
  }

  // Free the i-th live block of `set`; a pool block's memory joins the shadow.
  void free_at(std::vector<Tagged>& set, size_t i, cudaStream_t s) {
    const Tagged t = set[i];
    set.erase(set.begin() + static_cast<long>(i));
    lib.free(t.ptr, t.size, 0, s);
    if (t.pool != 0) shadow.push_back(t);
  }

  void expect_oom(size_t size, cudaStream_t s, const char* why, const char* mention = nullptr) {
    try {
      void* p = lib.alloc(size, 0, s);
      PoolInfo info{};
      hooks.info(0, 1, 0, &info);
      fail(std::string(why) + ": alloc(" + std::to_string(size) + ") succeeded at " + hex(p) +
           "; reserved now " + std::to_string(lib.stat("reserved_bytes.all.current")) + ", pool 1 maps " +
           std::to_string(info.mapped_pages) + " pages");
    } catch (const std::exception& e) {
      CHECK(starts_with(e.what(), kOomPrefix), std::string("not an OOM: ") + e.what());
      CHECK(mention == nullptr || std::strstr(e.what(), mention) != nullptr,
            std::string("the message does not mention ") + mention + ": " + e.what());
    }
  }

  uint64_t pool_pages(MempoolId id) {
    PoolInfo info{};
    CHECK(hooks.info(0, id.first, id.second, &info) == 0, "pool info: " + lib.error());
    return info.mapped_pages;
  }

  uint32_t use_count(MempoolId id) {
    PoolInfo info{};
    int rc = hooks.info(0, id.first, id.second, &info);
    return rc == 0 ? info.use_count : 0;
  }
};

int scenario_graph(const Lib& lib, void* h, const Capturer& cap) {
  const PoolHooks hooks(h);
  GraphRun g{lib, hooks, {}, {}, {}};
  const cudaStream_t C = stream_of(0x5100), O = stream_of(0x5200), C2 = stream_of(0x5300);
  const cudaStream_t Cs = stream_of(0x5500);  // a side stream of the first capture
  const MempoolId pool{1, 0}, pool2{2, 0};
  const size_t sizes[] = {512, 4000, 70000, 700u << 10, 3u << 20, 5u << 20, 9u << 20, 1u << 20};
  lib.init(1);

  // Static inputs, allocated before the capture.
  for (size_t sz : sizes) {
    g.alloc(sz, C, 0);
    g.alloc(sz, O, 0);
  }
  // torch.cuda.graph.__enter__: synchronize, gc, empty_cache.
  lib.reset();
  g.check_all("after empty_cache before capture");
  // Temporaries of the capturing stream die just before the capture: their pages sit idle on C,
  // not yet proven unused, when allocations during the capture look for pages to take. Proving
  // them must not record an event on C (it would be captured) or synchronise it.
  for (size_t i = g.general.size(); i-- > 0;) {
    if (g.general[i].size >= (1u << 20) && i % 2 == 0) g.free_at(g.general, i, C);
  }

  // capture_begin: the pool first (PyTorch: "beginAllocateStreamToPool is now called before
  // cudaStreamBeginCapture"), with PyTorch's kind of filter (is this stream in our capture?).
  hooks.begin(0, pool, [&](cudaStream_t s) { return (s == C || s == Cs) && cap.is_capturing(s); });
  cap.begin(C);
  cap.begin(Cs);
  CHECK(g.use_count(pool) == 1, "pool use count after begin");
  // Beginning a pool that is recording fails as in PyTorch (an exception, so that capture never
  // starts) and leaves the recording one as it was.
  try {
    hooks.begin(0, pool, [](cudaStream_t) { return true; });
    fail("begin_allocate_to_pool on a recording pool did not throw");
  } catch (const std::exception& e) {
    CHECK(std::strstr(e.what(), "already recording") != nullptr, e.what());
  }
  CHECK(g.use_count(pool) == 1, "pool use count after a refused begin");
  // The side stream's blocks die during capture and nothing on it allocates again: their pages
  // are the pool's cache, and every replay reads and writes them.
  for (int i = 0; i < 3; ++i) g.alloc(10u << 20, Cs, pool.first);
  while (g.pooled.size() > 0) g.free_at(g.pooled, 0, Cs);
  const uint64_t side_pages = g.pool_pages(pool);
  for (int i = 0; i < 32; ++i) {
    const size_t sz = sizes[static_cast<size_t>(i) % 8] + static_cast<size_t>(i) * 512;
    g.alloc(sz, C, pool.first);                       // captured work's memory: the pool
    if (i % 3 == 2) g.free_at(g.pooled, g.pooled.size() / 2, C);  // freed during capture
    g.alloc(sz / 2 + 1, O, 0);                        // another stream: general memory
    if (i % 2 == 1) g.free_at(g.general, g.general.size() - 1, O);
    if (i % 8 == 7) g.check_all("during capture");
  }
  // A tensor allocated before the capture dies during it (its block stays general memory, as
  // in PyTorch); a pool block used on another stream (record_stream) dies during capture.
  g.free_at(g.general, 0, C);
  void* rs = g.alloc(6u << 20, C, pool.first);
  lib.record_stream(rs, O);
  g.free_at(g.pooled, g.pooled.size() - 1, C);
  // Someone empties the cache mid-capture: nothing of the pool may go, nothing may synchronise
  // the capturing stream or the device.
  lib.reset();
  g.check_all("after empty_cache during capture");
  CHECK(g.pool_pages(pool) >= side_pages, "empty_cache during capture took pool pages");

  // A second capture at once, on its own stream and pool (several pools at once).
  hooks.begin(0, pool2, [&](cudaStream_t s) { return s == C2 && cap.is_capturing(s); });
  cap.begin(C2);
  for (int i = 0; i < 6; ++i) g.alloc(sizes[static_cast<size_t>(i)] + 512, C2, pool2.first);
  g.free_at(g.pooled, g.pooled.size() - 1, C2);
  CHECK(cap.end(C2), "the capture on C2 was invalidated");
  hooks.end(0, pool2);

  // capture_end: the capture first, then end_allocate_to_pool.
  CHECK(cap.end(Cs), "the capture on the side stream was invalidated");
  CHECK(cap.end(C), "the capture on C was invalidated");
  hooks.end(0, pool);
  g.check_all("after capture end");

  // After capture: C serves general memory again; graph outputs die.
  for (size_t sz : sizes) g.alloc(sz + 4096, C, 0);
  for (size_t i = 0; i < 6 && !g.pooled.empty(); ++i) g.free_at(g.pooled, 0, C);
  for (size_t sz : sizes) g.alloc(sz * 2, O, 0);
  g.check_all("after frees after capture");

  // A second graph captured into the same pool (pool=graph1.pool()): it may reuse what the
  // first graph's capture freed (replays run in capture order), nothing else may.
  hooks.begin(0, pool, [&](cudaStream_t s) { return (s == C || s == Cs) && cap.is_capturing(s); });
  cap.begin(C);
  CHECK(g.use_count(pool) == 2, "shared pool use count: " + std::to_string(g.use_count(pool)));
  for (int i = 0; i < 8; ++i) g.alloc(sizes[static_cast<size_t>(i)], C, pool.first);
  CHECK(cap.end(C), "the second capture was invalidated");
  hooks.end(0, pool);
  g.check_all("after the second capture");

  // The pool keeps its pages until its last release: a general request that needs them fails.
  while (!g.general.empty()) g.free_at(g.general, g.general.size() - 1, O);
  hooks.release(0, pool2);  // graph on C2 reset: its pool goes, and so do its pages
  for (size_t i = 0; i < g.pooled.size();) {
    if (g.pooled[i].pool == pool2.first) {
      g.free_at(g.pooled, i, C2);
    } else {
      ++i;
    }
  }
  // No graph of pool 2 is left to replay: its memory may go (and is unmapped by empty_cache).
  std::vector<Tagged> kept;
  for (const Tagged& b : g.shadow) {
    if (b.pool != pool2.first) kept.push_back(b);
  }
  g.shadow.swap(kept);
  const uint64_t before_reset = g.pool_pages(pool);
  lib.reset();
  CHECK(g.pool_pages(pool) == before_reset, "empty_cache took pages of a live pool");
  g.check_all("after empty_cache with a live pool");
  const auto reserved = static_cast<size_t>(lib.stat("reserved_bytes.all.current"));
  CHECK(reserved < kGraphCapacity, "reserved " + std::to_string(reserved));
  PoolInfo info{};
  CHECK(hooks.info(0, pool.first, pool.second, &info) == 0, "pool 1 info: " + lib.error());
  CHECK(info.mapped_pages >= 4, "pool 1 holds only " + std::to_string(info.mapped_pages) + " pages");
  const size_t big = kGraphCapacity - reserved + 2 * kPage;
  g.expect_oom(big, O, "before any release", "private pool");
  g.check_all("after the refused request");
  hooks.release(0, pool);  // graph 2 reset: pool 1 still used by graph 1
  CHECK(g.use_count(pool) == 1, "use count after one release");
  g.expect_oom(big, O, "after one of two releases");
  g.check_all("after one release");

  // Graph 1 reset: the last release. Its outputs die afterwards; then the memory serves again.
  hooks.release(0, pool);
  while (!g.pooled.empty()) g.free_at(g.pooled, g.pooled.size() - 1, C);
  g.shadow.clear();  // no graph left to replay
  void* p = g.alloc(big, O, 0);
  g.check_all("after the request that needed the pool's pages");
  g.free_at(g.general, g.general.size() - 1, O);
  (void)p;
  lib.reset();
  CHECK(hooks.info(0, pool.first, pool.second, &info) != 0, "pool 1 still exists after empty_cache");
  CHECK(lib.stat("reserved_bytes.all.current") == 0,
        "reserved after the end: " + std::to_string(lib.stat("reserved_bytes.all.current")));
  std::printf("graph: %zu-byte request refused while the pool held %" PRIu64 " pages, served after release\n",
              big, info.mapped_pages);
  return 0;
}

int scenario_graph_sim(const Lib& lib, void* h) {
  CHECK(sim_backing(), "the graph scenario needs sim_backing:True");
  // The sim has no capture through the ABI: the filter's "capturing" is this flag.
  auto capturing = std::make_shared<std::map<uintptr_t, bool>>();
  Capturer cap{
      [capturing](cudaStream_t s) { (*capturing)[reinterpret_cast<uintptr_t>(s)] = true; },
      [capturing](cudaStream_t s) {
        capturing->erase(reinterpret_cast<uintptr_t>(s));
        return true;
      },
      [capturing](cudaStream_t s) { return capturing->count(reinterpret_cast<uintptr_t>(s)) != 0; }};
  return scenario_graph(lib, h, cap);
}

int scenario_graph_cuda(const Lib& lib, void* h) {
  using CuInit = int (*)(unsigned);
  using CuRetain = int (*)(void**, int);
  using CuSetCurrent = int (*)(void*);
  using CuBeginCapture = int (*)(void*, int);
  using CuEndCapture = int (*)(void*, void**);
  using CuIsCapturing = int (*)(void*, int*);
  using CuStreamSync = int (*)(void*);
  using CuMemAlloc = int (*)(unsigned long long*, size_t);
  using Count = long long (*)(const char*);
  using Violations = long long (*)();
  using LastViolation = size_t (*)(char*, size_t);
  using SetCapacity = void (*)(unsigned long long);
  auto cu_init = sym<CuInit>(g_fake, "cuInit");
  auto retain = sym<CuRetain>(g_fake, "cuDevicePrimaryCtxRetain");
  auto set_current = sym<CuSetCurrent>(g_fake, "cuCtxSetCurrent");
  auto begin = sym<CuBeginCapture>(g_fake, "cuStreamBeginCapture_v2");
  auto end = sym<CuEndCapture>(g_fake, "cuStreamEndCapture");
  auto is_capturing = sym<CuIsCapturing>(g_fake, "cuStreamIsCapturing");
  auto stream_sync = sym<CuStreamSync>(g_fake, "cuStreamSynchronize");
  auto mem_alloc = sym<CuMemAlloc>(g_fake, "cuMemAlloc_v2");
  auto count = sym<Count>(g_fake, "fake_cuda_count");
  auto violations = sym<Violations>(g_fake, "fake_cuda_capture_violations");
  auto captured_records = sym<Violations>(g_fake, "fake_cuda_captured_records");
  auto last_violation = sym<LastViolation>(g_fake, "fake_cuda_last_capture_violation");
  sym<SetCapacity>(g_fake, "fake_cuda_set_capacity")(kGraphCapacity);

  // This thread plays PyTorch's: the device's primary context is current, as the CUDA runtime
  // makes it.
  CHECK(cu_init(0) == 0, "cuInit");
  void* ctx = nullptr;
  CHECK(retain(&ctx, 0) == 0 && set_current(ctx) == 0, "primary context");
  auto why = [&] {
    char buf[256];
    last_violation(buf, sizeof buf);
    return std::string(buf);
  };
  const long long creates_before = count("cuMemCreate");
  Capturer cap{
      // torch.cuda.graph's default capture_error_mode is "global".
      [&](cudaStream_t s) { CHECK(begin(s, 0) == 0, "cuStreamBeginCapture_v2"); },
      [&](cudaStream_t s) {
        void* graph = nullptr;
        const int rc = end(s, &graph);
        if (rc != 0) std::printf("cuStreamEndCapture: %d (%s)\n", rc, why().c_str());
        return rc == 0;
      },
      [&](cudaStream_t s) {
        int status = 0;
        CHECK(is_capturing(s, &status) == 0, "cuStreamIsCapturing");
        return status == 1;
      }};
  int rc = scenario_graph(lib, h, cap);
  if (rc != 0) return rc;
  CHECK(count("cuInit") > 0 && count("cuMemCreate") > creates_before,
        "the library did not run on the fake driver");
  CHECK(violations() == 0, "a call forbidden during capture reached the driver: " + why());
  CHECK(captured_records() == 0,
        "an event was recorded on a capturing stream: " + std::to_string(captured_records()));
  CHECK(count("cuThreadExchangeStreamCaptureMode") > 0, "the library never relaxed the capture mode");

  // The fake does refuse what it must (so the zero above means something): in global mode a
  // cudaMalloc-like call during capture, and a capturing stream's synchronisation.
  const cudaStream_t X = stream_of(0x5400);
  CHECK(begin(X, 0) == 0, "cuStreamBeginCapture_v2(X)");
  unsigned long long dptr = 0;
  CHECK(mem_alloc(&dptr, 1 << 20) == 900, "cuMemAlloc during a global capture was not refused");
  CHECK(stream_sync(X) == 900, "cuStreamSynchronize of a capturing stream was not refused");
  CHECK(violations() == 2, "violations: " + std::to_string(violations()));
  void* graph = nullptr;
  CHECK(end(X, &graph) == 901, "an invalidated capture ended without CUDA_ERROR_STREAM_CAPTURE_INVALIDATED");
  std::printf("graph_cuda: %lld cuMemCreate, %lld capture-mode switches, no forbidden call\n",
              count("cuMemCreate") - creates_before, count("cuThreadExchangeStreamCaptureMode"));
  return 0;
}
// ---------------------------------------------------------------------------------------------
// Scenarios "mixed" and "mixed_one_stream": everything PyTorch may do at once, from many threads.
// General workers allocate and free (on a stream each, or all on one stream as the main thread and
// the autograd engine share one); graph threads record private pools on their own capture streams
// (begin, allocations routed by the filter, frees during and after the recording, end, release),
// a fresh pool per round as PyTorch's graphs have; an admin thread empties the cache, defragments,
// reads statistics and summaries, resets peaks and queries pools, all the while.
//
// Oracle: no two live allocations overlap; every live allocation keeps its pattern (sim backing);
// memory a pool freed is taken by no other pool and no general request before that pool's
// release; at the end, with every pool released and the cache emptied, nothing is allocated or
// reserved and no free was reported bad.

struct Shadow {
  std::mutex mu;
  std::map<uintptr_t, std::pair<size_t, unsigned long long>> freed;  // start -> (size, pool)

  void add(void* p, size_t size, unsigned long long pool) {
    std::lock_guard<std::mutex> g(mu);
    freed[reinterpret_cast<uintptr_t>(p)] = {size, pool};
  }

  // Before the pool's release: its memory may serve anyone afterwards.
  void forget(unsigned long long pool) {
    std::lock_guard<std::mutex> g(mu);
    for (auto it = freed.begin(); it != freed.end();) {
      it = it->second.second == pool ? freed.erase(it) : std::next(it);
    }
  }

  // "" or why an allocation of `pool` (0: general) at [p, p+size) takes another pool's memory.
  // An entry that a later allocation of its own pool took is dropped.
  std::string take(void* p, size_t size, unsigned long long pool) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> g(mu);
    auto it = freed.lower_bound(a);
    if (it != freed.begin()) --it;
    while (it != freed.end() && it->first < a + size) {
      if (it->first + it->second.first <= a) {
        ++it;
        continue;
      }
      if (it->second.second != pool) {
        return "allocation " + hex(p) + "+" + std::to_string(size) + " (pool " + std::to_string(pool) +
               ") takes memory pool " + std::to_string(it->second.second) + " freed at " +
               hex(reinterpret_cast<void*>(it->first)) + " before its release";
      }
      it = freed.erase(it);
    }
    return "";
  }
};

int scenario_mixed(const Lib& lib, void* h, bool one_stream) {
  const PoolHooks hooks(h);
  lib.init(1);
  const bool backing = sim_backing();
  constexpr int kWorkers = 4, kGraphs = 2, kOps = 3000, kRounds = 150;
  constexpr size_t kMaxLive = 16;
  LiveSet set;
  Shadow shadow;
  std::atomic<bool> failed{false};
  std::atomic<int> running{kWorkers + kGraphs};
  std::atomic<uint64_t> next_tag{1};
  std::atomic<int64_t> admin_calls{0}, pool_blocks{0};
  std::mutex why_mu;
  std::string why;
  auto report = [&](const std::string& w) {
    std::lock_guard<std::mutex> g(why_mu);
    if (!failed.exchange(true)) why = w;
  };
  // Records a new allocation in the oracle; false (and reported) when it breaks it.
  auto admit = [&](void* p, size_t size, unsigned long long pool, uint64_t tag) {
    std::string w = set.insert(p, size);
    if (w.empty()) w = shadow.take(p, size, pool);
    if (!w.empty()) {
      report(w);
      return false;
    }
    if (backing) write_pattern(p, size, tag);
    return true;
  };
  auto retire = [&](const Block& b) {
    std::string w;
    if (backing && !check_pattern(b.ptr, b.size, b.tag, &w)) report(w);
    set.erase(b.ptr);  // before free: once freed, another thread may get this address
  };

  auto worker = [&](int tid) {
    std::mt19937_64 rng(static_cast<uint64_t>(tid) * 104729 + 5);
    const cudaStream_t own = one_stream ? stream_of(0x7000) : stream_of(0x7000 + 16 * static_cast<uintptr_t>(tid));
    std::vector<Block> live;
    auto release = [&](size_t i) {
      Block b = live[i];
      live[i] = live.back();
      live.pop_back();
      retire(b);
      lib.free(b.ptr, b.size, 0, b.stream);
    };
    for (int op = 0; op < kOps && !failed.load(); ++op) {
      if (!live.empty() && (live.size() >= kMaxLive || rng() % 2 == 0)) {
        release(static_cast<size_t>(rng() % live.size()));
        continue;
      }
      const size_t size = 1 + random_size(rng);
      void* p = nullptr;
      try {
        p = lib.alloc(size, 0, own);
      } catch (const std::exception& e) {
        report("worker " + std::to_string(tid) + ": alloc(" + std::to_string(size) + ") threw: " + e.what());
        break;
      }
      const unsigned long long owner = hooks.owner(p);
      if (owner != 0) report("general allocation " + hex(p) + " landed in pool " + std::to_string(owner));
      const uint64_t tag = next_tag.fetch_add(1);
      if (!admit(p, size, 0, tag)) break;
      live.push_back(Block{p, size, own, tag});
    }
    while (!live.empty()) release(live.size() - 1);
    running.fetch_sub(1);
  };

  auto graph = [&](int gid) {
    std::mt19937_64 rng(static_cast<uint64_t>(gid) * 7727 + 3);
    const cudaStream_t cs = stream_of(0x9000 + 16 * static_cast<uintptr_t>(gid));
    for (int round = 0; round < kRounds && !failed.load(); ++round) {
      const MempoolId id{1000 + static_cast<unsigned long long>(gid) * 100000 + round, 0};
      try {
        hooks.begin(0, id, [cs](cudaStream_t s) { return s == cs; });
      } catch (const std::exception& e) {
        report("begin_allocate_to_pool " + std::to_string(id.first) + " threw: " + e.what());
        break;
      }
      std::vector<Block> live;
      const int n = 2 + static_cast<int>(rng() % 8);
      for (int i = 0; i < n && !failed.load(); ++i) {
        const size_t size = 1 + random_size(rng) / 4;
        void* p = nullptr;
        try {
          p = lib.alloc(size, 0, cs);
        } catch (const std::exception& e) {
          report("graph " + std::to_string(gid) + ": alloc(" + std::to_string(size) + ") threw: " + e.what());
          break;
        }
        const unsigned long long owner = hooks.owner(p);
        if (owner != id.first) {
          report("a recording's allocation " + hex(p) + " is in pool " + std::to_string(owner) + ", expected " +
                 std::to_string(id.first));
        }
        const uint64_t tag = next_tag.fetch_add(1);
        if (!admit(p, size, id.first, tag)) break;
        pool_blocks.fetch_add(1);
        live.push_back(Block{p, size, cs, tag});
        if (rng() % 3 == 0) {  // freed during the recording: the pool's memory still
          const Block b = live.front();
          live.erase(live.begin());
          retire(b);
          shadow.add(b.ptr, b.size, id.first);
          lib.free(b.ptr, b.size, 0, cs);
        }
      }
      hooks.end(0, id);
      for (const Block& b : live) {  // graph outputs die after the recording
        retire(b);
        shadow.add(b.ptr, b.size, id.first);
        lib.free(b.ptr, b.size, 0, cs);
      }
      shadow.forget(id.first);
      hooks.release(0, id);  // the graph is reset
    }
    running.fetch_sub(1);
  };

  auto admin = [&]() {
    const int64_t count = lib.stats_count();
    std::vector<int64_t> values(static_cast<size_t>(count > 0 ? count : 1));
    ReclaimReport r{};
    PoolInfo info{};
    for (uint64_t i = 0; running.load() > 0 && !failed.load(); ++i) {
      switch (i % 6) {
        case 0: lib.reset(); break;
        case 1:
          if (lib.defragment(0, &r) != 0) report("torch_arena_defragment failed: " + lib.error());
          break;
        case 2:
          if (lib.stats(0, values.data(), values.size()) != 0) report("torch_arena_stats failed: " + lib.error());
          break;
        case 3: lib.summary(0, 0, nullptr, 0); break;
        case 4:
          if (lib.reset_peak(0) != 0) report("torch_arena_reset_peak_stats failed: " + lib.error());
          break;
        default: hooks.info(0, 1000 + i % 300, 0, &info); break;
      }
      admin_calls.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  };

  std::vector<std::thread> threads;
  for (int t = 0; t < kWorkers; ++t) threads.emplace_back(worker, t);
  for (int g = 0; g < kGraphs; ++g) threads.emplace_back(graph, g);
  std::thread a(admin);
  for (auto& t : threads) t.join();
  a.join();
  if (failed.load()) fail(why);
  CHECK(set.live.empty(), "allocations still live after every thread freed its own");
  CHECK(admin_calls.load() > 0 && pool_blocks.load() > 0, "the admin thread or the pools never ran");

  lib.reset();
  CHECK(lib.stat("allocated_bytes.all.current") == 0,
        "allocated_bytes.all.current = " + std::to_string(lib.stat("allocated_bytes.all.current")));
  CHECK(lib.stat("active_bytes.all.current") == 0,
        "active_bytes.all.current = " + std::to_string(lib.stat("active_bytes.all.current")));
  CHECK(lib.stat("reserved_bytes.all.current") == 0,
        "reserved after every pool's release and empty_cache: " +
            std::to_string(lib.stat("reserved_bytes.all.current")));
  CHECK(lib.bad_free_count() == 0, "bad frees reported: " + lib.error());
  std::printf("%s: %d workers x %d ops, %d graphs x %d pools (%" PRId64 " pool blocks), %" PRId64
              " admin calls, backing=%d\n",
              one_stream ? "mixed_one_stream" : "mixed", kWorkers, kOps, kGraphs, kRounds, pool_blocks.load(),
              admin_calls.load(), backing ? 1 : 0);
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Scenario "bench_threads": not a test, the threads issue's benchmark through the C ABI
// (bench/abi-threads runs it). BENCH_THREADS threads (default 1), each with BENCH_LIVE live
// blocks (default 1000) on its own stream, or all on stream 1 with BENCH_ONE_STREAM=1, replace a
// random live block with a new one of a size drawn from the mix in TORCH_ARENA_SIZE_MIX (the
// `size<TAB>count` file bench/run writes) for BENCH_SECONDS (default 3) after filling, or, with
// BENCH_PAIRS, for that many pairs per thread (rounded up to a multiple of 1,024: the same work
// on every run, for counting instructions). Sizes and victims are drawn before the clock starts.
// Prints the pairs of all threads per second.

long env_long(const char* name, long dflt) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return dflt;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n <= 0) fail(std::string(name) + " must be a positive whole number, not '" + v + "'");
  return n;
}

int scenario_bench_threads(const Lib& lib) {
  lib.init(1);
  const int threads = static_cast<int>(env_long("BENCH_THREADS", 1));
  const size_t live_n = static_cast<size_t>(env_long("BENCH_LIVE", 1000));
  const double seconds = static_cast<double>(env_long("BENCH_SECONDS", 3));
  const uint64_t max_pairs = std::getenv("BENCH_PAIRS") == nullptr ? 0 : static_cast<uint64_t>(env_long("BENCH_PAIRS", 1));
  const char* one = std::getenv("BENCH_ONE_STREAM");
  const bool one_stream = one != nullptr && std::strcmp(one, "1") == 0;
  const char* mix_path = std::getenv("TORCH_ARENA_SIZE_MIX");
  if (mix_path == nullptr) fail("TORCH_ARENA_SIZE_MIX is not set (bench/run writes target/size-mix.tsv)");
  std::FILE* f = std::fopen(mix_path, "r");
  if (f == nullptr) fail(std::string("cannot open ") + mix_path);
  std::vector<size_t> sizes;
  std::vector<double> cumulative;
  double total = 0;
  char line[256];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (line[0] == '#') continue;
    unsigned long long size = 0, count = 0;
    if (std::sscanf(line, "%llu %llu", &size, &count) != 2 || size == 0 || count == 0) continue;
    total += static_cast<double>(count);
    sizes.push_back(static_cast<size_t>(size));
    cumulative.push_back(total);
  }
  std::fclose(f);
  if (sizes.empty()) fail(std::string("no sizes in ") + mix_path);

  constexpr size_t kDrawn = 1 << 16;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false}, stop{false}, failed{false};
  std::vector<uint64_t> pairs(static_cast<size_t>(threads), 0);
  auto worker = [&](int tid) {
    std::mt19937_64 rng(static_cast<uint64_t>(tid) * 7919 + 17);
    std::uniform_real_distribution<double> u(0, total);
    auto draw = [&]() {
      const size_t i = static_cast<size_t>(std::lower_bound(cumulative.begin(), cumulative.end(), u(rng)) - cumulative.begin());
      return sizes[std::min(i, sizes.size() - 1)];
    };
    const cudaStream_t stream = stream_of(one_stream ? 1 : static_cast<uintptr_t>(tid) + 1);
    std::vector<std::pair<void*, size_t>> live;
    std::vector<size_t> drawn(kDrawn), victims(kDrawn);
    try {
      for (size_t i = 0; i < live_n; ++i) {
        const size_t size = draw();
        live.emplace_back(lib.alloc(size, 0, stream), size);
      }
      for (size_t i = 0; i < kDrawn; ++i) {
        drawn[i] = draw();
        victims[i] = static_cast<size_t>(rng() % live_n);
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "thread %d: %s\n", tid, e.what());
      failed = true;
    }
    ready.fetch_add(1);
    while (!go.load()) std::this_thread::yield();
    uint64_t n = 0;
    try {
      while (!failed.load() && !stop.load(std::memory_order_relaxed) && (max_pairs == 0 || n < max_pairs)) {
        for (size_t k = 0; k < 1024; ++k, ++n) {
          const size_t i = n % kDrawn;
          void* p = lib.alloc(drawn[i], 0, stream);
          auto& slot = live[victims[i]];
          lib.free(slot.first, slot.second, 0, stream);
          slot = {p, drawn[i]};
        }
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "thread %d: %s\n", tid, e.what());
      failed = true;
    }
    pairs[static_cast<size_t>(tid)] = n;
    for (auto& b : live) lib.free(b.first, b.second, 0, stream);
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) ts.emplace_back(worker, t);
  while (ready.load() < threads) std::this_thread::yield();
  const auto t0 = std::chrono::steady_clock::now();
  go = true;
  if (max_pairs == 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    stop = true;
  }
  // With BENCH_PAIRS the threads' last frees of their live blocks are timed too (a few µs).
  const double elapsed = max_pairs == 0 ? std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() : 0;
  for (auto& t : ts) t.join();
  const double took = max_pairs == 0 ? elapsed : std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (failed.load()) fail("a thread failed (above)");
  uint64_t all = 0;
  for (uint64_t n : pairs) all += n;
  std::printf("bench_threads: threads %d, %s, %zu live each, %llu pairs in %.3f s, %.0f pairs/s, %.1f ns per pair\n",
              threads, one_stream ? "one stream" : "a stream each", live_n, static_cast<unsigned long long>(all), took,
              static_cast<double>(all) / took, took * 1e9 / static_cast<double>(all));
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr,
                 "usage: %s <libtorch_arena.so> "
                 "<threads|oom|hooks|badfree|hostile|graph|graph_cuda|mixed|mixed_one_stream|bench_threads>\n",
                 argv[0]);
    return 2;
  }
  g_scenario = argv[2];
  const char* conf = std::getenv("TORCH_ARENA_CONF");
  if (g_scenario == "graph_cuda" || (conf != nullptr && std::strstr(conf, "device:cuda") != nullptr)) {
    // The fake driver first, RTLD_GLOBAL: the library's dlopen("libcuda.so.1") then finds it by
    // its SONAME, as in tests/fixtures/fakecuda.rs.
    const char* fake = std::getenv("FAKE_LIBCUDA");
    if (fake == nullptr) fail("FAKE_LIBCUDA is not set");
    g_fake = dlopen(fake, RTLD_NOW | RTLD_GLOBAL);
    if (g_fake == nullptr) fail(std::string("dlopen(FAKE_LIBCUDA): ") + dlerror());
  }
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
  } else if (g_scenario == "graph") {
    rc = scenario_graph_sim(lib, h);
  } else if (g_scenario == "graph_cuda") {
    rc = scenario_graph_cuda(lib, h);
  } else if (g_scenario == "mixed") {
    rc = scenario_mixed(lib, h, false);
  } else if (g_scenario == "mixed_one_stream") {
    rc = scenario_mixed(lib, h, true);
  } else if (g_scenario == "bench_threads") {
    rc = scenario_bench_threads(lib);
  } else {
    fail("unknown scenario");
  }
  if (rc == 0) std::printf("harness %s: ok\n", g_scenario.c_str());
  std::fflush(stdout);
  return rc;
}
