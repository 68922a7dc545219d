#include "runtime/memory_pool.h"

#include <cuda_runtime.h>

#include "runtime/check.h"
#include "trisolve/backend.h"
#include "trisolve/fault_injection.h"

namespace trisolve::cuda {

Pool::Pool(Kind kind, int device, int64_t cap_bytes)
    : kind_(kind), device_(device), cap_(cap_bytes) {
  stats_.cap_bytes = cap_bytes;
}

Pool::~Pool() { Trim(); }

int64_t Pool::SizeClass(int64_t bytes) {
  int64_t c = 256;
  while (c < bytes) {
    if (c + c / 2 >= bytes && c >= 1024) return c + c / 2;
    c *= 2;
  }
  return c;
}

absl::Status Pool::Allocate(int64_t size, void** p) {
  cudaSetDevice(device_);
  if (kind_ == Kind::kDevice) return CudaStatus(cudaMalloc(p, size), "cudaMalloc");
  return CudaStatus(cudaHostAlloc(p, size, cudaHostAllocDefault), "cudaHostAlloc");
}

void Pool::Free(void* p) {
  cudaSetDevice(device_);
  if (kind_ == Kind::kDevice)
    cudaFree(p);
  else
    cudaFreeHost(p);
}

void Pool::EvictLocked(int64_t need) {
  // Largest idle buffers first: fewest frees for the room needed.
  while (!idle_.empty() && stats_.cached_bytes + stats_.in_use_bytes + need > cap_) {
    auto it = std::prev(idle_.end());
    Free(it->second);
    stats_.cached_bytes -= it->first;
    ++stats_.evictions;
    idle_.erase(it);
  }
}

absl::StatusOr<Pool::Buffer> Pool::Get(int64_t bytes) {
  const int64_t size = SizeClass(std::max<int64_t>(bytes, 1));
  // Test-only (fault_injection.h): this request goes the way of a cudaMalloc that fails.
  const bool inject = kind_ == Kind::kDevice && FaultInjection::Process().NextAllocationFails();
  Buffer b;
  b.pool_ = this;
  b.size_ = size;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = inject ? idle_.end() : idle_.find(size);
    if (it != idle_.end()) {
      b.ptr_ = it->second;
      idle_.erase(it);
      stats_.cached_bytes -= size;
      stats_.in_use_bytes += size;
      ++stats_.hits;
      return b;
    }
    ++stats_.misses;
    // (Both refusals below may be other calls' memory: MemoryHeldByOthers.)
    if (stats_.in_use_bytes + size > cap_)
      return MemoryHeldByOthers(absl::ResourceExhaustedError(absl::StrCat(
          kind_ == Kind::kDevice ? "device" : "pinned host", " memory pool: ", size,
          " more bytes would pass its cap of ", cap_, " (", stats_.in_use_bytes, " in use)")));
    EvictLocked(size);
    stats_.in_use_bytes += size;  // reserved before allocating outside the lock
  }
  void* p = nullptr;
  absl::Status st = inject ? CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc (fault injection)")
                           : Allocate(size, &p);
  if (!st.ok()) {
    // The device may be short because of our own idle buffers: free them and try once more.
    std::lock_guard<std::mutex> lock(mu_);
    EvictLocked(cap_);
    if (!inject) st = Allocate(size, &p);
    if (!st.ok()) {
      stats_.in_use_bytes -= size;
      return inject ? st : MemoryHeldByOthers(st);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  b.ptr_ = p;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.in_use_bytes + stats_.cached_bytes);
  return b;
}

void Pool::Put(void* p, int64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.in_use_bytes -= size;
  if (stats_.in_use_bytes + stats_.cached_bytes + size > cap_) {
    Free(p);
    ++stats_.evictions;
    return;
  }
  idle_.emplace(size, p);
  stats_.cached_bytes += size;
}

PoolStats Pool::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Pool::Trim() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [size, p] : idle_) Free(p);
  stats_.evictions += int64_t(idle_.size());
  idle_.clear();
  stats_.cached_bytes = 0;
}

Pool::Buffer& Pool::Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    Release();
    pool_ = o.pool_;
    ptr_ = o.ptr_;
    size_ = o.size_;
    o.pool_ = nullptr;
    o.ptr_ = nullptr;
  }
  return *this;
}

void Pool::Buffer::Release() {
  if (pool_ && ptr_) pool_->Put(ptr_, size_);
  pool_ = nullptr;
  ptr_ = nullptr;
}

}  // namespace trisolve::cuda
