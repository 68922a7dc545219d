// The CUDA backend's injected sticky error (trisolve/fault_injection.h): a kernel that traps.
#include <cuda_runtime.h>

#include "runtime/check.h"
#include "runtime/fault_injection.h"

namespace trisolve::cuda {
namespace {

__global__ void trap_for_fault_injection() { __trap(); }

}  // namespace

absl::Status LaunchTrap(cudaStream_t stream) {
  trap_for_fault_injection<<<1, 1, 0, stream>>>();
  return CudaStatus(cudaGetLastError(), "launching the fault injection's trap");
}

}  // namespace trisolve::cuda
