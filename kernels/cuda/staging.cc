#include "staging.h"

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"
#include "runtime/host_registration.h"

namespace trisolve::cuda {

int PipelinePieces() {
  static const int pieces = [] {
    const char* v = std::getenv("TRISOLVE_STAGING_PIECES");
    const int n = v != nullptr ? std::atoi(v) : 0;
    return n >= 2 && n <= kMaxPieces ? n : 8;
  }();
  return pieces;
}

int PipelineTaper() {
  static const int taper = [] {
    const char* v = std::getenv("TRISOLVE_STAGING_TAPER");
    const int n = v != nullptr ? std::atoi(v) : 0;
    return n >= 1 && n <= 8 ? n : 1;
  }();
  return taper;
}

Stager::Stager(int device, int streams, Pool& device_pool, Pool& pinned_pool)
    : device_(device), device_pool_(device_pool), pinned_pool_(pinned_pool) {
  cudaSetDevice(device);
  for (int i = 0; i < std::max(1, streams); ++i) {
    Lane lane;
    cudaStreamCreateWithFlags(&lane.stream, cudaStreamNonBlocking);
    for (auto* e : {&lane.e0, &lane.e1, &lane.e2, &lane.e3}) cudaEventCreate(e);
    for (auto& e : lane.staged) cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    cudaStreamCreateWithFlags(&lane.in, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&lane.out, cudaStreamNonBlocking);
    for (int p = 0; p < kMaxPieces; ++p)
      for (auto* e : {&lane.piece_in[p], &lane.piece_start[p], &lane.piece_done[p]})
        cudaEventCreate(e);
    lanes_.push_back(lane);
    free_.push_back(i);
  }
}

Stager::~Stager() {
  for (auto& l : lanes_) {
    for (auto s : {l.stream, l.in, l.out}) cudaStreamDestroy(s);
    for (auto e : {l.e0, l.e1, l.e2, l.e3, l.staged[0], l.staged[1]}) cudaEventDestroy(e);
    for (int p = 0; p < kMaxPieces; ++p)
      for (auto e : {l.piece_in[p], l.piece_start[p], l.piece_done[p]}) cudaEventDestroy(e);
  }
}

absl::StatusOr<bool> Stager::Pin(void* p, int64_t bytes) {
  const cudaError_t e = RegisterHostMemory(device_, p, size_t(bytes));
  // Registered already, portably, by another device's backend of this process: usable here.
  const bool owner = e == cudaSuccess;
  if (e == cudaErrorHostMemoryAlreadyRegistered) (void)cudaGetLastError();
  if (e != cudaSuccess && e != cudaErrorHostMemoryAlreadyRegistered) {
    (void)cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cudaHostRegister of ", bytes, " bytes: ", cudaGetErrorString(e)));
  }
  std::unique_lock<std::shared_mutex> lock(pinned_mu_);
  pinned_ranges_[static_cast<const std::byte*>(p)] = {bytes, owner};
  return true;
}

void Stager::Unpin(void* p) {
  {
    std::unique_lock<std::shared_mutex> lock(pinned_mu_);
    auto it = pinned_ranges_.find(static_cast<const std::byte*>(p));
    if (it == pinned_ranges_.end()) return;
    const bool owner = it->second.second;
    pinned_ranges_.erase(it);
    if (!owner) return;
  }
  if (UnregisterHostMemory(device_, p) != cudaSuccess) (void)cudaGetLastError();
}

// Whether [p, p + bytes) lies in memory PinHostMemory page-locked: the device copies straight
// from and into it.
bool Stager::Pinned(const void* p, int64_t bytes) const {
  const auto* b = static_cast<const std::byte*>(p);
  std::shared_lock<std::shared_mutex> lock(pinned_mu_);
  auto it = pinned_ranges_.upper_bound(b);
  if (it == pinned_ranges_.begin()) return false;
  --it;
  return b >= it->first && b + bytes <= it->first + it->second.first;
}

namespace {

// cuMemGetAddressRange, through the runtime: the allocation's extent, which the handle does
// not carry (linking the driver library itself would stop the binaries loading on hosts
// without one).
absl::StatusOr<int64_t> AllocationBytes(const void* p) {
  using Fn = CUresult(CUDAAPI*)(CUdeviceptr*, size_t*, CUdeviceptr);
  static const Fn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<Fn>(f);
  }();
  if (fn == nullptr) return absl::InternalError("cuMemGetAddressRange is not available");
  CUdeviceptr base = 0;
  size_t size = 0;
  if (const CUresult r = fn(&base, &size, CUdeviceptr(reinterpret_cast<uintptr_t>(p)));
      r != CUDA_SUCCESS)
    return absl::InternalError(
        absl::StrCat("cuMemGetAddressRange failed on an opened IPC handle (CUresult ", int(r), ")"));
  return int64_t(size) - int64_t(CUdeviceptr(reinterpret_cast<uintptr_t>(p)) - base);
}

}  // namespace

absl::StatusOr<void*> Stager::OpenIpc(const std::string& handle, int64_t offset, int64_t bytes) {
  if (handle.size() != sizeof(cudaIpcMemHandle_t))
    return absl::InvalidArgumentError(absl::StrCat("handle: ", handle.size(), " bytes, expected ",
                                                   sizeof(cudaIpcMemHandle_t),
                                                   " (a cudaIpcMemHandle_t)"));
  if (offset < 0 || bytes <= 0 || offset > std::numeric_limits<int64_t>::max() - bytes)
    return absl::InvalidArgumentError(
        absl::StrCat("offset, bytes: ", offset, ", ", bytes, " (expected offset >= 0, bytes >= 1)"));
  cudaSetDevice(device_);
  std::unique_lock<std::shared_mutex> lock(pinned_mu_);
  auto it = std::find_if(ipc_.begin(), ipc_.end(),
                         [&](const auto& m) { return m.second.handle == handle; });
  bool opened = false;
  if (it == ipc_.end()) {
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data(), sizeof(h));
    void* p = nullptr;
    const cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return absl::InvalidArgumentError(absl::StrCat(
          "handle: cudaIpcOpenMemHandle failed (", cudaGetErrorString(e),
          "): not the handle of live device memory of another process on this host"));
    }
    cudaPointerAttributes attr{};
    const cudaError_t ae = cudaPointerGetAttributes(&attr, p);
    auto size = AllocationBytes(p);
    if (ae != cudaSuccess || attr.device != device_ || !size.ok()) {
      (void)cudaGetLastError();
      (void)cudaIpcCloseMemHandle(p);
      if (ae == cudaSuccess && attr.device != device_)
        return absl::InvalidArgumentError(absl::StrCat(
            "device: the handle's memory lies on CUDA device ", attr.device,
            ", this server drives device ", device_));
      return size.ok() ? cuda::CudaStatus(ae, "cudaPointerGetAttributes") : size.status();
    }
    it = ipc_.emplace(static_cast<const std::byte*>(p), IpcMapping{*size, 0, handle}).first;
    opened = true;
  }
  if (offset > it->second.bytes || bytes > it->second.bytes - offset) {
    const int64_t have = it->second.bytes;
    if (opened) {
      (void)cudaIpcCloseMemHandle(const_cast<std::byte*>(it->first));
      ipc_.erase(it);
    }
    return absl::InvalidArgumentError(absl::StrCat("bytes: [", offset, ", ", offset + bytes,
                                                   ") lies outside the allocation of ", have,
                                                   " bytes that the handle names"));
  }
  ++it->second.regions;
  return const_cast<std::byte*>(it->first) + offset;
}

void Stager::CloseIpc(void* p) {
  std::unique_lock<std::shared_mutex> lock(pinned_mu_);
  const auto* b = static_cast<const std::byte*>(p);
  auto it = ipc_.upper_bound(b);
  if (it == ipc_.begin()) return;
  --it;
  if (b >= it->first + it->second.bytes || --it->second.regions > 0) return;
  cudaSetDevice(device_);
  if (cudaIpcCloseMemHandle(const_cast<std::byte*>(it->first)) != cudaSuccess)
    (void)cudaGetLastError();
  ipc_.erase(it);
}

bool Stager::OnDevice(const void* p, int64_t bytes) const {
  const auto* b = static_cast<const std::byte*>(p);
  std::shared_lock<std::shared_mutex> lock(pinned_mu_);
  if (ipc_.empty() || p == nullptr) return false;
  auto it = ipc_.upper_bound(b);
  if (it == ipc_.begin()) return false;
  --it;
  return b >= it->first && b + bytes <= it->first + it->second.bytes;
}

// Host to device through the pinned staging pieces, on a lane of its own; waits.
absl::Status Stager::CopyToDevice(const void* host, void* dev, int64_t bytes) {
  cudaSetDevice(device_);
  auto pinned = pinned_pool_.Get(2 * kStagingChunk);
  if (!pinned.ok()) return pinned.status();
  const LaneLease lease(this);
  Lane& l = lease.lane();
  if (auto st = StageIn(l, static_cast<std::byte*>(pinned->get()), host, dev, bytes); !st.ok())
    return st;
  return CudaStatus(cudaStreamSynchronize(l.stream), "cudaStreamSynchronize");
}

int Stager::AcquireLane() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !free_.empty(); });
  const int i = free_.back();
  free_.pop_back();
  return i;
}
void Stager::ReleaseLane(int i) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(i);
  cv_.notify_one();
}

// Host -> device through two pinned pieces in turn: the memcpy into one overlaps the DMA of
// the other (pageable copies run at a sixth of the pinned rate).
absl::Status Stager::StageIn(Lane& l, std::byte* pinned, const void* src, void* dst,
                             int64_t bytes) {
  if (Pinned(src, bytes))
    return CudaStatus(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyHostToDevice,
                                            l.stream),
                            "cudaMemcpyAsync");
  const auto* s = static_cast<const std::byte*>(src);
  auto* d = static_cast<std::byte*>(dst);
  int buf = 0;
  for (int64_t off = 0; off < bytes; off += kStagingChunk, buf ^= 1) {
    const int64_t len = std::min(kStagingChunk, bytes - off);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(l.staged[buf]));
    std::memcpy(pinned + buf * kStagingChunk, s + off, size_t(len));
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d + off, pinned + buf * kStagingChunk,
                                                  size_t(len), cudaMemcpyHostToDevice,
                                                  l.stream));
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(l.staged[buf], l.stream));
  }
  return absl::OkStatus();
}

absl::Status Stager::StageOut(Lane& l, std::byte* pinned, const void* src, void* dst,
                              int64_t bytes) {
  if (Pinned(dst, bytes))
    return CudaStatus(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToHost,
                                            l.stream),
                            "cudaMemcpyAsync");
  const auto* s = static_cast<const std::byte*>(src);
  auto* d = static_cast<std::byte*>(dst);
  const int64_t pieces = (bytes + kStagingChunk - 1) / kStagingChunk;
  auto issue = [&](int64_t i) -> absl::Status {
    const int64_t off = i * kStagingChunk, len = std::min(kStagingChunk, bytes - off);
    const int buf = int(i & 1);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pinned + buf * kStagingChunk, s + off,
                                                  size_t(len), cudaMemcpyDeviceToHost,
                                                  l.stream));
    return CudaStatus(cudaEventRecord(l.staged[buf], l.stream), "cudaEventRecord");
  };
  if (pieces > 0)
    if (auto st = issue(0); !st.ok()) return st;
  for (int64_t i = 0; i < pieces; ++i) {
    if (i + 1 < pieces)
      if (auto st = issue(i + 1); !st.ok()) return st;
    const int buf = int(i & 1);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(l.staged[buf]));
    const int64_t off = i * kStagingChunk, len = std::min(kStagingChunk, bytes - off);
    std::memcpy(d + off, pinned + buf * kStagingChunk, size_t(len));
  }
  return absl::OkStatus();
}

absl::Status ReplicateOnDevice(const std::byte* src, std::byte* dst, int64_t n, int64_t eb,
                               int64_t k, Layout layout, cudaStream_t stream) {
  if (layout == Layout::kFlat) {
    TRISOLVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, size_t(n * eb), cudaMemcpyDeviceToDevice, stream));
    for (int64_t have = 1; have < k; have *= 2) {
      const int64_t copy = std::min(have, k - have);
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst + have * n * eb, dst,
                                                    size_t(copy * n * eb),
                                                    cudaMemcpyDeviceToDevice, stream));
    }
  } else {
    // Column 0 of the [n, k] array, then columns [have, 2 have) from [0, have).
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst, size_t(k * eb), src, size_t(eb),
                                                    size_t(eb), size_t(n),
                                                    cudaMemcpyDeviceToDevice, stream));
    for (int64_t have = 1; have < k; have *= 2) {
      const int64_t copy = std::min(have, k - have);
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
          dst + have * eb, size_t(k * eb), dst, size_t(k * eb), size_t(copy * eb), size_t(n),
          cudaMemcpyDeviceToDevice, stream));
    }
  }
  return absl::OkStatus();
}

}  // namespace trisolve::cuda
