// Pooled memory for the CUDA backend: device buffers and pinned host staging buffers kept in
// size classes and reused across requests, so that a warm server makes no cudaMalloc,
// cudaFree or cudaHostAlloc on the hot path. A cap bounds what the pool holds; idle buffers
// are evicted (largest first) when a new one would pass it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"

namespace trisolve::cuda {

struct PoolStats {
  int64_t cap_bytes = 0;
  int64_t cached_bytes = 0;  // idle, ready for reuse
  int64_t in_use_bytes = 0;
  int64_t peak_bytes = 0;    // of cached + in use
  int64_t hits = 0, misses = 0, evictions = 0;
};

class Pool {
 public:
  enum class Kind { kDevice, kPinnedHost };
  Pool(Kind kind, int device, int64_t cap_bytes);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  class Buffer {
   public:
    Buffer() = default;
    Buffer(Buffer&& o) noexcept { *this = std::move(o); }
    Buffer& operator=(Buffer&& o) noexcept;
    ~Buffer() { Release(); }
    void* get() const { return ptr_; }
    template <typename T>
    T* as() const { return static_cast<T*>(ptr_); }
    int64_t size() const { return size_; }
    void Release();

   private:
    friend class Pool;
    Pool* pool_ = nullptr;
    void* ptr_ = nullptr;
    int64_t size_ = 0;  // the size class
  };

  // At least `bytes` (rounded up to a size class: 2^k or 1.5 * 2^k, 256 B at least).
  absl::StatusOr<Buffer> Get(int64_t bytes);
  PoolStats Stats() const;
  // Frees every idle buffer.
  void Trim();

  static int64_t SizeClass(int64_t bytes);

 private:
  void Put(void* p, int64_t size);
  absl::Status Allocate(int64_t size, void** p);
  void Free(void* p);
  void EvictLocked(int64_t need);

  const Kind kind_;
  const int device_;
  const int64_t cap_;
  mutable std::mutex mu_;
  std::multimap<int64_t, void*> idle_;
  PoolStats stats_;
};

}  // namespace trisolve::cuda
