// CUDA calls checked into absl::Status: every launch and copy is checked where it is made.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/device_health.h"

namespace trisolve::cuda {

inline absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  // A sticky error: the device is lost to the process (device_health.h), UNAVAILABLE.
  const bool sticky = IsStickyError(e);
  if (sticky) NoteStickyError(e, what);
  const auto code = e == cudaErrorMemoryAllocation ? absl::StatusCode::kResourceExhausted
                    : sticky                       ? absl::StatusCode::kUnavailable
                                                   : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(what, ": ", cudaGetErrorName(e), " (",
                                         cudaGetErrorString(e), ")"));
}

}  // namespace trisolve::cuda

#define TRISOLVE_CUDA_RETURN_IF_ERROR(expr)                                         \
  do {                                                                              \
    if (auto _st = ::trisolve::cuda::CudaStatus((expr), #expr); !_st.ok()) return _st; \
  } while (0)
