// The two entry points PyTorch calls through CUDAPluggableAllocator.
//
// They live in C++ because PyTorch never checks the pointer alloc_fn returns: an allocation that
// cannot be met must become a C++ exception, which PyTorch turns into a Python RuntimeError.
// Rust cannot throw one, so malloc calls the Rust side's status-returning torch_arena_try_malloc
// and throws here. No exception ever passes through a Rust frame, and nothing unwinds out of
// torch_arena_free (PyTorch frees from destructors).

#include "torch_arena.h"

#include <string>
#include <vector>

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

}  // namespace
}  // namespace torch_arena

extern "C" TORCH_ARENA_API void* torch_arena_malloc(size_t size, int device, void* stream) {
  void* ptr = nullptr;
  const int rc = torch_arena_try_malloc(size, device, stream, &ptr);
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
