// The CUDA backend: requests are staged through pooled pinned buffers into pooled device
// buffers on one of several streams, solved by the family's kernels, and copied back. Families
// without CUDA kernels yet are solved by the CPU reference on the host, and the method name
// says so ("... (host)").
#include <cuda_runtime.h>

#include <cstdlib>
#include <memory>

#include "cuda_backend.h"
#include "runtime/check.h"
#include "trisolve/backend.h"
#include "trisolve/fault_injection.h"

namespace trisolve {

using cuda_backend::CudaBackend;

bool CudaBackendCompiledIn() { return true; }

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaOptions& o) {
  // Read when CUDA initializes, which the calls below do if nothing in the process has yet.
  if (o.load_eagerly) setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
  if (auto st = FaultInjection::ProcessStatus(); !st.ok()) return st;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    return absl::UnavailableError(absl::StrCat(
        "no CUDA device (", e == cudaSuccess ? "none present" : cudaGetErrorString(e), ")"));
  if (o.device < 0 || o.device >= count)
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", o.device, " does not exist (", count, " present)"));
  cudaDeviceProp prop;
  if (auto st = cuda::CudaStatus(cudaGetDeviceProperties(&prop, o.device), "cudaGetDeviceProperties");
      !st.ok())
    return st;
  // Threads waiting for the device yield their core: the server's waiting threads spin
  // otherwise (one context, many cores), taking cores from the gRPC threads and the clients
  // of the same host (docs/kernels/README.md, "Tuning evidence", cudaDeviceScheduleYield).
  // (Set on the device's primary context, active or not; where it cannot be, they spin.)
  if (auto st = cuda::CudaStatus(cudaSetDevice(o.device), "cudaSetDevice"); !st.ok()) return st;
  (void)cudaSetDeviceFlags(cudaDeviceScheduleYield);
  (void)cudaGetLastError();
  const int64_t cap = o.device_pool_cap_bytes > 0 ? o.device_pool_cap_bytes
                                                  : int64_t(double(prop.totalGlobalMem) * 0.8);
  return std::unique_ptr<Backend>(new CudaBackend(o, prop, cap));
}

}  // namespace trisolve
