// The entry points PyTorch calls through CUDAPluggableAllocator that need C++.
//
// malloc and free live in C++ because PyTorch never checks the pointer alloc_fn returns: an
// allocation that cannot be met must become a C++ exception, which PyTorch turns into a Python
// RuntimeError. Rust cannot throw one, so malloc calls the Rust side's status-returning
// torch_arena_try_malloc and throws here. No exception ever passes through a Rust frame, and
// nothing unwinds out of torch_arena_free (PyTorch frees from destructors).
//
// The three pool hooks of CUDA graph capture live here because begin_allocate_to_pool takes a
// std::function: the shim keeps each recording pool's filter and asks them on every malloc
// (docs/cuda-graphs.md).

#include "torch_arena.h"

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// The pool hooks receive a std::function and a std::pair by value from PyTorch's compiled code, so
// their layouts must be the ones PyTorch's wheel uses. The wheels are built with GCC and
// libstdc++ (torch 2.11.0+cu130: "GCC: (GNU) 13.3.1", libtorch_cuda.so NEEDs libstdc++.so.6, and
// exports beginAllocateToPool(signed char, std::pair<unsigned long long, unsigned long long>,
// std::function<bool (CUstream_st*)>) mangled with libstdc++'s St8function, not libc++'s
// NSt3__18function). libstdc++'s std::function is {_Any_data (16 bytes), manager, invoker}, 32
// bytes, unchanged since GCC 4.x and independent of _GLIBCXX_USE_CXX11_ABI (which changes only
// std::string and std::list; both sides use 1); being non-trivially copyable, it is passed by
// invisible reference to a caller-owned temporary. A pair of two unsigned long longs has trivial
// copy/move constructors and destructor, so it travels in two integer registers. docs/cuda-graphs.md has the whole check.
#if !defined(__GLIBCXX__)
#error "torch-arena's pool hooks take a std::function from PyTorch, whose wheels use libstdc++: build cpp_shim with libstdc++"
#endif
static_assert(sizeof(torch_arena::StreamFilter) == 32,
              "libstdc++'s std::function<bool(CUstream_st*)> is 32 bytes, as in PyTorch's wheels");
// Itanium C++ ABI: a class is passed in registers unless its copy or move constructor or its
// destructor is non-trivial ("non-trivial for the purposes of calls").
static_assert(sizeof(torch_arena::MempoolId) == 16 &&
                  std::is_trivially_copy_constructible<torch_arena::MempoolId>::value &&
                  std::is_trivially_move_constructible<torch_arena::MempoolId>::value &&
                  std::is_trivially_destructible<torch_arena::MempoolId>::value,
              "MempoolId_t is two unsigned long longs, passed in registers");

namespace torch_arena {

OutOfMemoryError::OutOfMemoryError(const std::string& what) : std::runtime_error(what) {}

// Out of line: the key function, so the vtable and type information live in this object.
OutOfMemoryError::~OutOfMemoryError() = default;

namespace {

// The calling thread's last error (set by torch_arena_try_malloc on this same thread).
std::string last_error_text() {
  const size_t n = torch_arena_last_error(nullptr, 0);
  if (n == 0) {
    return std::string();
  }
  std::vector<char> buf(n + 1, '\0');
  const size_t m = torch_arena_last_error(buf.data(), buf.size());
  return std::string(buf.data(), m < n ? m : n);
}

// The recording pools of one device, in the order they began (PyTorch's captures_underway), each
// with the filter its begin hook passed. `count` lets every malloc outside capture skip the lock.
struct Recording {
  MempoolId id;
  std::shared_ptr<const StreamFilter> filter;
};

struct DeviceRecordings {
  std::mutex mu;
  std::vector<Recording> list;
  std::atomic<int> count{0};
};

constexpr int kMaxDevices = 64;  // MAX_DEVICES in src/allocator.rs
DeviceRecordings g_recordings[kMaxDevices];

// The pool the first recording filter that accepts `stream` names, as PyTorch picks one.
bool route_to_pool(int device, void* stream, MempoolId* pool) noexcept {
  if (device < 0 || device >= kMaxDevices) {
    return false;
  }
  DeviceRecordings& d = g_recordings[device];
  if (d.count.load(std::memory_order_acquire) == 0) {
    return false;
  }
  try {
    std::vector<Recording> list;
    {
      std::lock_guard<std::mutex> g(d.mu);
      list = d.list;
    }
    // Called without our lock: a filter (PyTorch's asks cudaStreamGetCaptureInfo) may take
    // its time, and another thread may begin or end a capture meanwhile.
    for (const Recording& r : list) {
      bool accepts = false;
      try {
        accepts = (*r.filter)(static_cast<CUstream_st*>(stream));
      } catch (...) {
        accepts = false;  // an empty or throwing filter refuses
      }
      if (accepts) {
        *pool = r.id;
        return true;
      }
    }
  } catch (...) {
    // std::bad_alloc copying the list: the general pool serves this one.
  }
  return false;
}

}  // namespace
}  // namespace torch_arena

extern "C" TORCH_ARENA_API void* torch_arena_malloc(size_t size, int device, void* stream) {
  void* ptr = nullptr;
  torch_arena::MempoolId pool;
  const int rc = torch_arena::route_to_pool(device, stream, &pool)
                     ? torch_arena_try_malloc_pool(size, device, stream, pool.first, pool.second, &ptr)
                     : torch_arena_try_malloc(size, device, stream, &ptr);
  if (rc == TORCH_ARENA_OK) {
    return ptr;
  }
  std::string what = torch_arena::last_error_text();
  if (rc == TORCH_ARENA_ERR_OOM) {
    if (what.empty()) {
      what = "CUDA out of memory. Tried to allocate " + std::to_string(size) + " bytes on device " +
             std::to_string(device) + " (torch-arena)";
    }
    throw torch_arena::OutOfMemoryError(what);
  }
  if (what.empty()) {
    what = "torch-arena: allocating " + std::to_string(size) + " bytes on device " + std::to_string(device) +
           " failed with status " + std::to_string(rc);
  }
  throw std::runtime_error(what);
}

extern "C" TORCH_ARENA_API void torch_arena_free(void* ptr, size_t size, int device, void* stream) noexcept {
  // Failures are recorded, counted and logged on the Rust side; a destructor cannot do more.
  (void)torch_arena_try_free(ptr, size, device, stream);
}

// PyTorch's pool hooks. begin throws std::runtime_error when the pool cannot record (PyTorch's
// own beginAllocateToPool raises "already recording to mempool_id" with TORCH_CHECK, and
// capture_begin then stops before the capture starts); end and release never throw, since
// PyTorch calls them from capture_end and from a graph's reset or destructor.

extern "C" TORCH_ARENA_API void torch_arena_begin_allocate_to_pool(int device, torch_arena::MempoolId id,
                                                                   torch_arena::StreamFilter filter) {
  if (torch_arena_pool_begin(device, id.first, id.second) != TORCH_ARENA_OK) {
    // Going on would let this capture's end remove the recording one's filter.
    std::string what = torch_arena::last_error_text();
    throw std::runtime_error(what.empty() ? "torch-arena: begin_allocate_to_pool failed" : what);
  }
  if (device < 0 || device >= torch_arena::kMaxDevices) {
    return;
  }
  try {
    auto f = std::make_shared<const torch_arena::StreamFilter>(std::move(filter));
    torch_arena::DeviceRecordings& d = torch_arena::g_recordings[device];
    std::lock_guard<std::mutex> g(d.mu);
    d.list.push_back(torch_arena::Recording{id, std::move(f)});
    d.count.fetch_add(1, std::memory_order_release);
  } catch (...) {
    // std::bad_alloc: the pool records but nothing is routed to it; end and release still work.
  }
}

extern "C" TORCH_ARENA_API void torch_arena_end_allocate_to_pool(int device, torch_arena::MempoolId id) noexcept {
  if (device >= 0 && device < torch_arena::kMaxDevices) {
    torch_arena::DeviceRecordings& d = torch_arena::g_recordings[device];
    std::lock_guard<std::mutex> g(d.mu);
    for (auto it = d.list.begin(); it != d.list.end(); ++it) {
      if (it->id == id) {
        d.list.erase(it);
        d.count.fetch_sub(1, std::memory_order_release);
        break;
      }
    }
  }
  (void)torch_arena_pool_end(device, id.first, id.second);
}

extern "C" TORCH_ARENA_API void torch_arena_release_pool(int device, torch_arena::MempoolId id) noexcept {
  (void)torch_arena_pool_release(device, id.first, id.second);
}
