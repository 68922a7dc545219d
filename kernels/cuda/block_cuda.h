// The thesis' block iterations on the GPU, on device arrays.
//
// Rows are kept colour-major on the device (block rows 0, 2, 4, ... then 1, 3, 5, ...), so that
// the rows one half of a red-black sweep updates are a contiguous batch of tridiagonal systems.
// Each half-sweep is one fused kernel forming F_i - A_i Y_{i-1} - B_i Y_{i+1} for those rows and
// one batched tridiagonal solve (the partitioned kernel). Jacobi solves every row from the
// previous iterate into a second buffer; lexicographic Gauss-Seidel solves one row at a time
// (sequential over rows by nature, parallel inside each row's solve). The relative residual is
// computed on the device from the original arrays. cg: conjugate gradients preconditioned by
// the line solves, one batched partitioned tridiagonal solve over every block row.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/statusor.h"
#include "memory_pool.h"
#include "trisolve/block_tridiagonal.h"

namespace trisolve::cuda {

// p's arrays and y (in: the initial guess, out: the iterate) are device arrays in the natural
// layout (row i at i * M). Fills status like the CPU reference.
template <typename T>
absl::StatusOr<SolveInfo> SolveBlockTridiagonalDevice(const BlockTridiagonalProblem<T>& p,
                                                      BlockMethod method,
                                                      const BlockOptions& options, T* y,
                                                      SystemStatus* status, Pool& pool,
                                                      const SolveControl& control,
                                                      cudaStream_t stream);

}  // namespace trisolve::cuda
