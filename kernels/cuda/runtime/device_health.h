// Whether this process can still use its CUDA devices. Some errors are sticky: a kernel that
// read an illegal address or executed a trap, an uncorrectable ECC error, and the context is
// left unusable (every later call of the process on it returns the same error); only a new
// process can use the device again. The first one seen is recorded, and the backend reports it
// (Backend::Health), so that the server stops and is restarted rather than failing every call.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace trisolve::cuda {

// Whether `e` leaves the context unusable for the rest of the process (the runtime's
// documentation: "the process must be terminated and relaunched"; the uncorrectable ECC and
// NVLink errors too).
bool IsStickyError(cudaError_t e);
// Records the first sticky error (what failed, on which device); ContextHealth reports it.
void NoteStickyError(cudaError_t e, const char* what);
// OK, or UNAVAILABLE naming the first sticky error.
absl::Status ContextHealth();
// ContextHealth, after asking the driver about `device` without waiting for its work
// (cudaMemGetInfo answers a sticky error that no checked call has met yet: cuBLAS and cuSOLVER
// report theirs in codes of their own).
absl::Status ProbeDevice(int device);

}  // namespace trisolve::cuda
