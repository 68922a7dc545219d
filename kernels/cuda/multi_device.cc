// Every GPU of a node behind one Backend: a CUDA backend a listed device, each with its own
// pools, streams and host threads, behind the placement of placed_backend.cc.
#include <cuda_runtime.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/check.h"
#include "trisolve/backend.h"

namespace trisolve {

absl::StatusOr<std::unique_ptr<Backend>> MakeMultiDeviceCudaBackend(
    std::vector<int> devices, const CudaOptions& options, const PlacementOptions& placement) {
  if (devices.empty()) return absl::InvalidArgumentError("no CUDA device listed");
  // Read when CUDA initializes, which cudaGetDeviceCount does if nothing in the process has yet.
  if (options.load_eagerly) setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
  const int count = CudaDeviceCount();
  if (count == 0) return MakeCudaBackend(options);  // says why there is none
  std::map<int, int> listed;                        // device -> workers on it
  for (int d : devices) {
    if (d < 0 || d >= count)
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA device ", d, " does not exist (", count, " present)"));
    ++listed[d];
  }
  std::map<int, int> made;
  std::vector<std::unique_ptr<Backend>> workers;
  std::vector<std::string> tags;
  for (int d : devices) {
    CudaOptions o = options;
    o.device = d;
    // Workers sharing a device share its memory: the pool cap (given or 80% of the device) is
    // split between them.
    if (listed[d] > 1) {
      cudaDeviceProp prop;
      if (auto st = cuda::CudaStatus(cudaGetDeviceProperties(&prop, d), "cudaGetDeviceProperties");
          !st.ok())
        return st;
      const int64_t cap = options.device_pool_cap_bytes > 0
                              ? options.device_pool_cap_bytes
                              : int64_t(double(prop.totalGlobalMem) * 0.8);
      o.device_pool_cap_bytes = cap / listed[d];
    }
    auto backend = MakeCudaBackend(o);
    if (!backend.ok()) return backend.status();
    const int nth = ++made[d];
    tags.push_back(nth == 1 ? absl::StrCat(d) : absl::StrCat(d, "/", nth));
    workers.push_back(*std::move(backend));
  }
  return MakePlacedBackend(std::move(workers), std::move(tags), placement);
}

}  // namespace trisolve
