// Built when the CUDA toolkit is absent: the CUDA backend says so instead of existing.
#include "trisolve/backend.h"

namespace trisolve {

bool CudaBackendCompiledIn() { return false; }

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaOptions&) {
  return absl::UnavailableError(
      "the CUDA backend is not compiled into this build (no CUDA toolkit at build time)");
}

int CudaDeviceCount() { return 0; }

absl::StatusOr<std::unique_ptr<Backend>> MakeMultiDeviceCudaBackend(std::vector<int>,
                                                                    const CudaOptions& options,
                                                                    const PlacementOptions&) {
  return MakeCudaBackend(options);
}

}  // namespace trisolve
