#include "runtime/launch.h"

#include <map>
#include <shared_mutex>
#include <utility>

namespace trisolve::cuda {

absl::Status AllowSharedBytes(const void* kernel, size_t bytes) {
  // The limit each (device, kernel) has been raised to. Raises happen under the writer lock, so
  // the limits set on a kernel only grow, whatever the order of the callers.
  static std::shared_mutex mu;
  static auto* raised = new std::map<std::pair<int, const void*>, size_t>();
  int device = 0;
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  const std::pair<int, const void*> key{device, kernel};
  {
    std::shared_lock<std::shared_mutex> lock(mu);
    auto it = raised->find(key);
    if (it != raised->end() && it->second >= bytes) return absl::OkStatus();
  }
  std::unique_lock<std::shared_mutex> lock(mu);
  size_t& limit = (*raised)[key];
  if (limit >= bytes) return absl::OkStatus();
  TRISOLVE_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  limit = bytes;
  return absl::OkStatus();
}

}  // namespace trisolve::cuda
