// Kernel launch configurations shared by the tridiagonal and block-tridiagonal kernels: a grid in
// thread-block clusters (sm_90) or plain, and the size of a persistent grid.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>

#include "absl/status/statusor.h"
#include "runtime/check.h"

namespace trisolve::cuda {

// Lets `kernel` take `bytes` of dynamic shared memory on the current device: raises the kernel's
// limit there to at least `bytes` and never lowers it. Launches of one kernel with different
// needs run at once (two requests on one device, overlapped launches); setting each launch's
// exact need would let one launch lower the limit between another's setting and its launch,
// which then fails. The limit only bounds what a launch may ask: a launch's occupancy follows
// what it asks.
absl::Status AllowSharedBytes(const void* kernel, size_t bytes);
template <typename... Params>
absl::Status AllowSharedBytes(void (*kernel)(Params...), size_t bytes) {
  return AllowSharedBytes(reinterpret_cast<const void*>(kernel), bytes);
}

// A launch of `blocks` blocks of `threads` with `smem` bytes of dynamic shared memory on `stream`,
// in clusters of `cluster` blocks when cluster > 1. Not copyable: cfg points at attr.
struct LaunchConfig {
  LaunchConfig(int64_t blocks, int threads, size_t smem, cudaStream_t stream, int cluster = 1) {
    cfg.gridDim = dim3(unsigned(blocks));
    cfg.blockDim = dim3(unsigned(threads));
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = unsigned(std::max(cluster, 1));
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = cluster > 1 ? 1 : 0;
  }
  LaunchConfig(const LaunchConfig&) = delete;
  LaunchConfig& operator=(const LaunchConfig&) = delete;

  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1] = {};
};

// How many blocks of `kernel` -- clusters of them, where `launch` asks for clusters -- run on the
// device at once with `launch`'s block size and shared memory: the grid of a persistent kernel.
// 0 where not one fits. Lets the kernel take `launch`'s dynamic shared memory first (the launch
// needs it too).
template <typename... Params>
absl::StatusOr<int64_t> ResidentGroups(void (*kernel)(Params...), LaunchConfig& launch) {
  if (auto st = AllowSharedBytes(kernel, launch.cfg.dynamicSmemBytes); !st.ok()) return st;
  const unsigned cluster = launch.cfg.numAttrs > 0 ? launch.attr[0].val.clusterDim.x : 1;
  if (cluster > 1) {
    const dim3 grid = launch.cfg.gridDim;
    launch.cfg.gridDim = dim3(cluster);  // the query wants a grid of whole clusters
    int n = 0;
    const cudaError_t e = cudaOccupancyMaxActiveClusters(&n, kernel, &launch.cfg);
    launch.cfg.gridDim = grid;
    TRISOLVE_CUDA_RETURN_IF_ERROR(e);
    return int64_t{n};
  }
  int dev = 0, sms = 0, per_sm = 0;
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  TRISOLVE_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, kernel, int(launch.cfg.blockDim.x), launch.cfg.dynamicSmemBytes));
  return int64_t(sms) * per_sm;
}

// A kernel's ResidentGroups, asked once a device (not at every launch: a solve to a tolerance
// launches one sweep at a time): the shared-memory attribute it sets is the current device's,
// and a kernel launched on a device that was never asked fails (cudaErrorInvalidValue, as the
// windows did on device 1 of the lent 2 x H100 machine). `f` computes it; one cache a kernel.
class PerDevice {
 public:
  template <typename F>
  absl::StatusOr<int64_t> Get(F f) {
    int device = 0;
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_device_.find(device);
    if (it == by_device_.end()) it = by_device_.emplace(device, f()).first;
    return it->second;
  }

 private:
  std::mutex mu_;
  std::map<int, absl::StatusOr<int64_t>> by_device_;
};

}  // namespace trisolve::cuda
