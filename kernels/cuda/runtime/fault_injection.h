// The CUDA side of the test-only fault injection (trisolve/fault_injection.h).
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace trisolve::cuda {

// Launches, on `stream`, a kernel that executes __trap(): after it the context is lost
// (cudaErrorLaunchFailure from every call), as after a kernel's illegal address. Only the
// launch's own error is returned; the trap's comes with the stream's next synchronisation.
absl::Status LaunchTrap(cudaStream_t stream);

}  // namespace trisolve::cuda
