// The CPU reference for small dense systems
// (kernels/cpu/dense.cc): the solvers the CPU backend runs, the GPU tests compare with and the CUDA
// backend falls back on. Not part of the public API (trisolve/dense.h); reached through the
// trisolve_reference target.
#pragma once

#include <cstdint>
#include <vector>

#include "trisolve/dense.h"

namespace trisolve {

namespace cpu {
template <typename T>
SolveInfo SolveDense(const DenseProblem<T>& p, DenseMethod method, DenseOutput<T> out);

// The elimination of every matrix of a batch kept, so that each further right-hand side costs
// O(n^2) instead of O(n^3): Gauss-Jordan's (multipliers below the diagonal, the normalised
// pivot rows above it, the pivots' inverses) or LU's (L and U, as getrf leaves them), with the
// row interchanges. SolveFactored then applies to b exactly the operations SolveDense applies
// to it, in the same order: the same x, bit for bit. auto factors as Gauss-Jordan (SolveDense's
// choice); householder-pcr is not factored (Factorable false).
template <typename T>
struct DenseFactors {
  DenseMethod method = DenseMethod::kGaussJordan;
  int64_t batch = 0, n = 0;
  std::vector<T> f;            // batch x n x n
  std::vector<T> inv;          // Gauss-Jordan: batch x n, 1 / pivot
  std::vector<int64_t> pivot;  // batch x n, the row exchanged with row i at step i
  std::vector<uint8_t> ok;     // batch: a pivot vanished (SINGULAR)
};
bool Factorable(DenseMethod method);
template <typename T>
DenseFactors<T> FactorDense(int64_t batch, int64_t n, const T* A, DenseMethod method);
// b: batch x n; x and status as SolveDense's (a singular matrix: x = 0, SINGULAR).
template <typename T>
void SolveFactored(const DenseFactors<T>& f, const T* b, T* x, SystemStatus* status);
}  // namespace cpu

}  // namespace trisolve
