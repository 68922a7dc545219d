// Dense systems on the GPU, on device arrays.
//
// "gauss-jordan-warp": one warp per system for n <= 32. Lane r holds row r of [A | b] in
// registers; each step of the report's Gauss-Jordan is a warp operation: the pivot search (task
// A) an arg-max over lanes by shuffles, the row exchange (B) and the broadcast of the pivot row
// shuffles, the multipliers and subtractions (C, D, F) one fused multiply-add a lane, the
// normalisation (E) on the pivot lane; then the elimination above the diagonal, on b alone.
// A system whose pivot vanishes (|p| <= n eps max|column|, as the CPU reference) is flagged.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "trisolve/dense.h"

namespace trisolve::cuda {

// 32 < n <= 64: "gauss-jordan-smem", one warp a system with [A | b] in shared memory.
constexpr int64_t kDenseWarpMaxN = 32;
constexpr int64_t kDenseGpuMaxN = 64;

template <typename T>
absl::Status SolveDenseWarpDevice(const DenseProblem<T>& p, T* x, uint8_t* status_flags,
                                  cudaStream_t stream);

}  // namespace trisolve::cuda
