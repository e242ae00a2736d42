// torch-arena's CPU allocator, for testing without a GPU (TORCH_ARENA_CONF=cpu_tensors:True).
//
// A c10::Allocator that takes every CPU tensor's storage from simulated device `device` of
// torch-arena (whose memory, with sim_backing:True, is real host memory), through the library's
// own status-returning exports: torch_arena_try_malloc / torch_arena_try_free, the calls the
// CUDA shim makes. The allocations are then tracked, counted and reported exactly as CUDA
// tensors' are. torch_arena/_cpu_tensors.py compiles this file against the running torch's
// headers (once, into a cache folder), loads it with ctypes and calls torch_arena_cpu_install,
// passing the library's function pointers: this file links only libc10, never the library.
//
// Invariants:
// - Every DataPtr allocate() returns carries `Deleter` and a context equal to its data pointer
//   (so raw_allocate/raw_deallocate and copy-on-write clones work: is_simple_data_ptr holds).
// - `g_sizes` holds the requested size of every live pointer this allocator returned, and only
//   those: torch_arena_try_free wants the size that was asked for, and the deleter gets only the
//   pointer. A pointer it does not hold was never ours: raw_deallocate of memory the previous
//   allocator's raw_allocate made before install goes back to that allocator.
// - The allocator, the size table and the previous allocator are never destroyed: c10's
//   registry and every live DataPtr point at them until the process ends (tensors are freed
//   during interpreter finalisation and by static destructors, in no order we control).
// - In a fork child (a DataLoader worker under the fork start method) the arena is never
//   called: the simulated device's pages are a MAP_SHARED memfd, so a block the child took or
//   gave back would be the parent's memory too. New storages come from the previous allocator,
//   and freeing an inherited one only forgets it. The size table's locks are held across
//   fork() by pthread_atfork handlers, so the child finds them free.

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/alignment.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <pthread.h>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

// The library's exports (cpp_shim/torch_arena.h), passed in as addresses.
using TryMalloc = int (*)(size_t size, int device, void* stream, void** out);
using TryFree = int (*)(void* ptr, size_t size, int device, void* stream);
using LastError = size_t (*)(char* buf, size_t cap);

constexpr int kOk = 0;   // TORCH_ARENA_OK
constexpr int kOom = 1;  // TORCH_ARENA_ERR_OOM

// Pointer -> requested size, sharded so that threads freeing different tensors rarely meet.
// Pointers are at least 512-byte aligned (the arena's granule), so the low bits carry nothing.
class SizeTable {
 public:
  void put(void* p, size_t n) {
    Shard& s = shard(p);
    std::lock_guard<std::mutex> g(s.mu);
    s.map[p] = n;
  }

  // Removes `p`; false when it was not there.
  bool take(void* p, size_t* n) {
    Shard& s = shard(p);
    std::lock_guard<std::mutex> g(s.mu);
    auto it = s.map.find(p);
    if (it == s.map.end()) {
      return false;
    }
    *n = it->second;
    s.map.erase(it);
    return true;
  }

  // Around fork(): every shard locked by the forking thread, then unlocked in both processes.
  void lock_all() {
    for (Shard& s : shards_) {
      s.mu.lock();
    }
  }
  void unlock_all() {
    for (Shard& s : shards_) {
      s.mu.unlock();
    }
  }

  size_t live() {
    size_t n = 0;
    for (Shard& s : shards_) {
      std::lock_guard<std::mutex> g(s.mu);
      n += s.map.size();
    }
    return n;
  }

 private:
  struct Shard {
    std::mutex mu;
    std::unordered_map<void*, size_t> map;
  };
  static constexpr size_t kShards = 64;

  Shard& shard(void* p) {
    const uint64_t a = reinterpret_cast<uintptr_t>(p) >> 9;
    return shards_[(a * 0x9E3779B97F4A7C15ull) >> 58];  // the top 6 bits: 64 shards
  }

  std::array<Shard, kShards> shards_;
};

void Deleter(void* ptr);

// Set in a fork child of the process that installed the allocator (see the top).
std::atomic<bool> g_forked_child{false};

class ArenaCpuAllocator final : public c10::Allocator {
 public:
  ArenaCpuAllocator(TryMalloc try_malloc, TryFree try_free, LastError last_error, int device,
                    c10::Allocator* previous)
      : try_malloc_(try_malloc),
        try_free_(try_free),
        last_error_(last_error),
        device_(device),
        previous_(previous) {}

  c10::DataPtr allocate(size_t n) override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) {
      // As c10's default CPU allocator: no memory, and the deleter ignores NULL.
      return {nullptr, nullptr, &Deleter, cpu};
    }
    if (g_forked_child.load(std::memory_order_relaxed) && previous_ != nullptr) {
      return previous_->allocate(n);  // with the previous allocator's deleter
    }
    void* p = nullptr;
    const int rc = try_malloc_(n, device_, nullptr, &p);
    if (rc != kOk || p == nullptr) {
      std::string what = last_error_text();
      if (what.empty()) {
        what = "torch-arena (cpu_tensors): allocating " + std::to_string(n) +
               " bytes on simulated device " + std::to_string(device_) + " failed with status " +
               std::to_string(rc);
      }
      // c10::OutOfMemoryError is torch.OutOfMemoryError in Python, as for a CUDA tensor.
      TORCH_CHECK_WITH(OutOfMemoryError, rc != kOom, what);
      TORCH_CHECK(false, what);
    }
    if (reinterpret_cast<uintptr_t>(p) % c10::gAlignment != 0) {
      try_free_(p, n, device_, nullptr);
      TORCH_CHECK(false, "torch-arena (cpu_tensors): the arena returned ", p, " for ", n,
                  " bytes, which is not ", c10::gAlignment, "-byte aligned as CPU tensors must be");
    }
    try {
      sizes_.put(p, n);
    } catch (...) {  // std::bad_alloc growing the table
      try_free_(p, n, device_, nullptr);
      throw;
    }
    return {p, p, &Deleter, cpu};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &Deleter; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  // Frees `ptr` if it is ours; otherwise hands it to the previous allocator (see the top).
  void release(void* ptr) noexcept {
    size_t n = 0;
    if (sizes_.take(ptr, &n)) {
      if (g_forked_child.load(std::memory_order_relaxed)) {
        return;  // the parent's memory: leave it alone (see the top)
      }
      // Failures are counted, logged and kept as the last error by the library; a deleter
      // cannot do more.
      (void)try_free_(ptr, n, device_, nullptr);
      return;
    }
    c10::DeleterFnPtr d = previous_ != nullptr ? previous_->raw_deleter() : nullptr;
    if (d != nullptr) {
      d(ptr);
    }
  }

  size_t live() { return sizes_.live(); }
  SizeTable& sizes() { return sizes_; }
  int device() const { return device_; }
  c10::Allocator* previous() const { return previous_; }

 private:
  std::string last_error_text() const {
    const size_t n = last_error_(nullptr, 0);
    if (n == 0) {
      return std::string();
    }
    std::vector<char> buf(n + 1, '\0');
    const size_t m = last_error_(buf.data(), buf.size());
    return std::string(buf.data(), m < n ? m : n);
  }

  TryMalloc try_malloc_;
  TryFree try_free_;
  LastError last_error_;
  int device_;
  c10::Allocator* previous_;
  SizeTable sizes_;
};

// Set once by torch_arena_cpu_install, under g_install, before c10 can hand the allocator to
// anyone; never destroyed (see the top).
std::atomic<ArenaCpuAllocator*> g_allocator{nullptr};
std::mutex g_install;

void Deleter(void* ptr) {
  ArenaCpuAllocator* a = g_allocator.load(std::memory_order_acquire);
  if (ptr != nullptr && a != nullptr) {
    a->release(ptr);
  }
}

// pthread_atfork handlers, registered once by the first install.
void BeforeFork() {
  if (ArenaCpuAllocator* a = g_allocator.load(std::memory_order_acquire)) {
    a->sizes().lock_all();
  }
}
void InParent() {
  if (ArenaCpuAllocator* a = g_allocator.load(std::memory_order_acquire)) {
    a->sizes().unlock_all();
  }
}
void InChild() {
  if (ArenaCpuAllocator* a = g_allocator.load(std::memory_order_acquire)) {
    a->sizes().unlock_all();
    g_forked_child.store(true, std::memory_order_relaxed);
  }
}

void set_error(char* err, size_t cap, const std::string& what) {
  if (err != nullptr && cap > 0) {
    const size_t n = what.size() < cap - 1 ? what.size() : cap - 1;
    what.copy(err, n);
    err[n] = '\0';
  }
}

}  // namespace

// Make the arena the CPU allocator: every CPU storage allocated from now on comes from
// `device`. Returns 0 on success (also when already installed for the same device), 1 with a
// message in `err` otherwise. Nothing is changed on failure.
extern "C" __attribute__((visibility("default"))) int torch_arena_cpu_install(
    void* try_malloc, void* try_free, void* last_error, int device, char* err, size_t cap) {
  try {
    std::lock_guard<std::mutex> g(g_install);
    ArenaCpuAllocator* a = g_allocator.load(std::memory_order_acquire);
    if (a != nullptr && a->device() != device) {
      set_error(err, cap,
                "torch-arena's CPU allocator was made for device " + std::to_string(a->device()));
      return 1;
    }
    if (a == nullptr) {
      if (try_malloc == nullptr || try_free == nullptr || last_error == nullptr) {
        set_error(err, cap, "torch_arena_cpu_install: a NULL function pointer");
        return 1;
      }
      a = new ArenaCpuAllocator(reinterpret_cast<TryMalloc>(try_malloc),
                                reinterpret_cast<TryFree>(try_free),
                                reinterpret_cast<LastError>(last_error), device,
                                c10::GetCPUAllocator());
      // Published before c10 can hand `a` out: a storage it allocates may be freed at once.
      // Under g_install, which no fork handler takes: a fork now locks the shards or not at all.
      g_allocator.store(a, std::memory_order_release);
      if (pthread_atfork(&BeforeFork, &InParent, &InChild) != 0) {
        // Without the handlers a fork child would use the arena: refuse rather than share.
        set_error(err, cap, "torch_arena_cpu_install: pthread_atfork failed");
        g_allocator.store(nullptr, std::memory_order_release);
        return 1;
      }
    }
    if (c10::GetCPUAllocator() == a) {
      return 0;
    }
    // The highest priority: in this test mode every CPU tensor is the arena's. c10 keeps the
    // allocator with the highest priority given so far (ties: the newest).
    c10::SetCPUAllocator(a, UINT8_MAX);
    if (c10::GetCPUAllocator() != a) {
      set_error(err, cap, "c10::SetCPUAllocator did not take torch-arena's CPU allocator");
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    set_error(err, cap, e.what());
    return 1;
  } catch (...) {
    set_error(err, cap, "torch_arena_cpu_install: unknown C++ exception");
    return 1;
  }
}

// Give c10 the CPU allocator that was in place before install back (enable() undoes an install
// when the CUDA allocator swap after it fails). The storages already made stay the arena's and
// are freed into it. Returns 0, or 1 when the allocator was never installed.
extern "C" __attribute__((visibility("default"))) int torch_arena_cpu_uninstall() noexcept {
  std::lock_guard<std::mutex> g(g_install);
  ArenaCpuAllocator* a = g_allocator.load(std::memory_order_acquire);
  if (a == nullptr) {
    return 1;
  }
  if (c10::GetCPUAllocator() == a) {
    c10::SetCPUAllocator(a->previous(), UINT8_MAX);
  }
  return 0;
}

// Live CPU storages this allocator made and has not freed (-1 before install).
extern "C" __attribute__((visibility("default"))) long long torch_arena_cpu_live() noexcept {
  try {
    ArenaCpuAllocator* a = g_allocator.load(std::memory_order_acquire);
    return a == nullptr ? -1 : static_cast<long long>(a->live());
  } catch (...) {
    return -1;
  }
}
