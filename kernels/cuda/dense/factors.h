// A batch of dense systems' elimination kept on the device: a persistent system's factors.
// Made once (FactorDense*Device) and applied to each right-hand side (SolveDense*Factored*) in
// O(n^2) a system, x bit for bit the one-shot solve's on [A | b]: the factorisation runs the
// one-shot kernels' arithmetic on A, and the solve repeats, on b alone, what those kernels do to
// b's column.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dense/dense.h"
#include "dense/dispatch.h"
#include "trisolve/dense.h"

namespace trisolve::cuda {

enum class DenseFactorsKind : uint8_t {
  kGaussJordan,  // n <= kDenseGpuMaxN: gauss-jordan-warp, -2warps, -block
  kLu,           // "lu": cuBLAS getrfBatched / cuSOLVER getrf
};

// The path whose factors a prepared system keeps, if any: Gauss-Jordan a warp, two warps or a
// block a system, and LU; not the blocked Gauss-Jordan (its panels' updates of b are cuBLAS
// calls over [A | b] whose results on b alone need not be the same bits) nor householder-pcr.
bool DenseKeepsFactors(DensePath path);

// The factors' layout in one device buffer of DenseFactorsBytes, every part 256-byte aligned.
// kGaussJordan: for each system, step and row, the row's multiplier at that step (the pivot
// row's slot: 1 / pivot) [batch][n][n], and the row each step took as its pivot [batch][n]
// (uint8). kLu: the column-major LU factors [batch][n][n], interchanges [batch][n] (int) and
// the permutation they make [batch][n] (int), and each system's LU address (the batched calls). Both: a byte a system, set where a pivot vanished.
template <typename T>
struct DenseFactorsDevice {
  DenseFactorsKind kind = DenseFactorsKind::kGaussJordan;
  int64_t batch = 0, n = 0;
  T* values = nullptr;           // multipliers, or LU
  uint8_t* pivot_row = nullptr;  // kGaussJordan
  int* ipiv = nullptr;           // kLu
  int* perm = nullptr;           // kLu: the interchanges as one permutation, (P b)[i] = b[perm[i]]
  T** lu_ptrs = nullptr;         // kLu
  uint8_t* flags = nullptr;
  std::string name;  // the one-shot path's name: "gauss-jordan-warp", "lu (cublas getrfBatched)"
};
int64_t DenseFactorsBytes(DenseFactorsKind kind, int64_t batch, int64_t n, int elem_bytes);
// The parts' addresses in a buffer of DenseFactorsBytes at `base`.
template <typename T>
DenseFactorsDevice<T> DenseFactorsAt(DenseFactorsKind kind, int64_t batch, int64_t n, void* base);

// Gauss-Jordan: records the elimination of every A of p (p.b is not read) into f (n <= 128).
template <typename T>
absl::Status FactorDenseGaussJordanDevice(const DenseProblem<T>& p, DenseFactorsDevice<T>& f,
                                          cudaStream_t stream);
// k right-hand sides a system: b and x [k][batch][n]; flags [k * batch] (0 on entry).
template <typename T>
absl::Status SolveDenseGaussJordanFactoredDevice(const DenseFactorsDevice<T>& f, int64_t k,
                                                 const T* b, T* x, uint8_t* flags,
                                                 cudaStream_t stream);

// LU: getrf(Batched) on the transposed copies of every A of p, the vanishing pivots flagged.
template <typename T>
absl::Status FactorDenseLuDevice(const DenseProblem<T>& p, DenseFactorsDevice<T>& f,
                                 DenseLibs& libs, Pool& pool, cudaStream_t stream);
template <typename T>
absl::Status SolveDenseLuFactoredDevice(const DenseFactorsDevice<T>& f, int64_t k, const T* b,
                                        T* x, uint8_t* flags, DenseLibs& libs, Pool& pool,
                                        cudaStream_t stream);

}  // namespace trisolve::cuda
