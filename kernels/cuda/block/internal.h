// The block family's pieces, for its dispatch (dispatch.cu): the Krylov methods (krylov.cu: the
// device's step kernels for the iterations of trisolve/driver/block_krylov.h) and the sweeps
// (sweeps.cu). p's arrays and y are device arrays in the natural layout.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/statusor.h"
#include "runtime/memory_pool.h"
#include "trisolve/block_tridiagonal.h"

namespace trisolve::cuda {

template <typename T>
struct BlockDeviceSetup;  // block.h

// Conjugate gradients preconditioned by the line solves, or (multigrid) by the V-cycle.
template <typename T>
absl::StatusOr<SolveInfo> CgDevice(const BlockTridiagonalProblem<T>& p, const BlockOptions& o,
                                   T* y, SystemStatus* status, Pool& pool,
                                   const SolveControl& control, BlockMonitor& mon,
                                   cudaStream_t stream, bool multigrid,
                                   const BlockDeviceSetup<T>* kept);

// BiCGStab right-preconditioned by the V-cycle.
template <typename T>
absl::StatusOr<SolveInfo> BicgstabDevice(const BlockTridiagonalProblem<T>& p,
                                         const BlockOptions& o, T* y, SystemStatus* status,
                                         Pool& pool, const SolveControl& control,
                                         BlockMonitor& mon, cudaStream_t stream,
                                         const BlockDeviceSetup<T>* kept);

// Each feeds `mon` (BlockMonitor) where it reads its residual back anyway; the dispatch
// finishes it.
// red-black, jacobi or gauss-seidel sweeps (method one of those three).
template <typename T>
absl::StatusOr<SolveInfo> SweepsDevice(const BlockTridiagonalProblem<T>& p, BlockMethod method,
                                       const BlockOptions& o, T* y, SystemStatus* status,
                                       Pool& pool, const SolveControl& control,
                                       BlockMonitor& mon, cudaStream_t stream);

}  // namespace trisolve::cuda
