// Dense systems on the GPU, on device arrays.
//
// "gauss-jordan-warp" (n <= 32), "gauss-jordan-2warps" (32 < n <= 64) and, like them but with
// two threads a row, "gauss-jordan-block" (64 < n <= 128). W lanes a system
// (W = 8, 16, 32: 32 / W systems a warp; W = 64: two warps), lane r holding row r of [A | b] in
// registers. Each step of the report's Gauss-Jordan: the pivot search (task A) an arg-max over
// the lanes by shuffles (and through shared memory between two warps), the pivot row divided
// by the pivot (E) on its lane and put in shared memory, every other row -- above the pivot as
// well as below, the classic Gauss-Jordan -- subtracting its multiple of it (C, D, F), one
// fused multiply-add a column; pivoting is implicit (rows stay in their lanes; no exchanges, B)
// and the last column ends as x. A system whose pivot vanishes (|p| <= n eps max|column|, as
// the CPU reference) is flagged.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trisolve/dense.h"

namespace trisolve::cuda {

constexpr int64_t kDenseWarpMaxN = 32;
constexpr int64_t kDenseTwoWarpsMaxN = 64;
// 64 < n <= 128: "gauss-jordan-block", one block of 256 threads a system, two threads a row.
constexpr int64_t kDenseGpuMaxN = 128;

template <typename T>
absl::Status SolveDenseWarpDevice(const DenseProblem<T>& p, T* x, uint8_t* status_flags,
                                  cudaStream_t stream);

// "householder-pcr-block": batches of small symmetric systems (n <= 64), one thread block a
// system, thread i owning row i as the PCR notes map them: Householder tridiagonalisation
// with W and the reflectors in shared memory, Q^T b, PCR on T, x = Q y, then one step of
// iterative refinement with the same reduction -- the CPU reference's steps, its sums as block
// reductions.
constexpr int64_t kHouseholderBlockMaxN = 64;
template <typename T>
absl::Status SolveDenseHouseholderPcrBlockDevice(const DenseProblem<T>& p, T* x,
                                                 uint8_t* status_flags, cudaStream_t stream);

}  // namespace trisolve::cuda

#include <map>
#include <mutex>

#include <cublas_v2.h>
#include <cusolverDn.h>

#include "runtime/memory_pool.h"

namespace trisolve::cuda {

// cuSOLVER and cuBLAS handles, one of each per stream, made on first use (they are slow to
// create) and destroyed with this object.
class DenseLibs {
 public:
  DenseLibs() = default;
  ~DenseLibs() { Reset(); }
  void Reset();  // destroys every handle
  DenseLibs(const DenseLibs&) = delete;
  DenseLibs& operator=(const DenseLibs&) = delete;
  absl::StatusOr<cusolverDnHandle_t> Solver(cudaStream_t stream);
  absl::StatusOr<cublasHandle_t> Blas(cudaStream_t stream);

 private:
  std::mutex mu_;
  std::map<cudaStream_t, cusolverDnHandle_t> solver_;
  std::map<cudaStream_t, cublasHandle_t> blas_;
};

// n > kDenseGpuMaxN: "lu", LU with partial pivoting by CUDA's libraries on a column-major copy
// (the row-major A transposed on the device): cuBLAS getrfBatched + getrsBatched for
// n <= kDenseBatchedLuMaxN, else cuSOLVER getrf + getrs system by system. A pivot vanishes as
// in the CPU reference (|u_kk| <= n eps max|A[:, k]|, or not finite): those systems are
// flagged. Returns the name of what ran.
constexpr int64_t kDenseBatchedLuMaxN = 512;
template <typename T>
absl::StatusOr<std::string> SolveDenseLuDevice(const DenseProblem<T>& p, T* x,
                                               uint8_t* status_flags, DenseLibs& libs,
                                               Pool& pool, cudaStream_t stream);

// n > kDenseGpuMaxN: "gauss-jordan-blocked", Gauss-Jordan with partial pivoting on [A | b]
// (column-major, the row-major A transposed on the device), a panel of `panel` columns at a
// time (0: kGaussJordanPanel): the panel's rows k0 .. n-1 factorised by cuSOLVER getrf (the
// pivot search of each column on the device, the same pivots as the CPU reference's
// Gauss-Jordan), its row exchanges applied right of it (laswp), then the columns right of the
// panel eliminated below (trsm with L11, gemm with L21: LU's update) and above (trsm with U11
// normalises the pivot rows, gemm with the panel's rows above: the part LU does not do). The
// last column ends as x. n^3 flops against LU's 2n^3/3; vanishing pivots flagged as in "lu".
constexpr int kGaussJordanPanel = 512;  // measured: 128, 256, 512 (NOTES.md)
template <typename T>
absl::Status SolveDenseGaussJordanBlockedDevice(const DenseProblem<T>& p, T* x,
                                                uint8_t* status_flags, DenseLibs& libs,
                                                Pool& pool, cudaStream_t stream, int panel = 0);

// "householder-pcr" for symmetric A, system by system: cuSOLVER sytrd reduces A to T = Q^T A Q
// (Householder, blocked), ormtr applies Q^T to b, the tridiagonal kernels solve T y = Q^T b
// (the PCR notes' kernel for n <= 1024, else the partitioned kernel, whose reduced system is
// solved by PCR), and ormtr applies Q to y; then one step of iterative refinement with the same
// reduction (r = b - A x by gemv from the original arrays, x += Q T^-1 Q^T r), since PCR does
// not pivot and an indefinite T can meet a small pivot.
template <typename T>
absl::Status SolveDenseHouseholderPcrDevice(const DenseProblem<T>& p, T* x,
                                            uint8_t* status_flags, DenseLibs& libs, Pool& pool,
                                            cudaStream_t stream);

}  // namespace trisolve::cuda
