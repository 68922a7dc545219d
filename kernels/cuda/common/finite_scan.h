// The finiteness check of a request's inputs where they already are: on the device, after the
// copy in, instead of a pass over every value on the host before it (a 2^24-unknown system's
// four arrays are 537 MB: the host pass took longer than copying them to the device).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"

namespace trisolve::cuda {

// Queues a scan of v[0, n) on `stream` that sets *found to 1 where a value is NaN or Inf and
// leaves it alone otherwise (the caller zeroes it first). Reads each value once, at the
// device's copy rate; which value it was is left to the host check that makes the message.
template <typename T>
absl::Status ScanNonFinite(const T* v, int64_t n, uint8_t* found, cudaStream_t stream);

}  // namespace trisolve::cuda
