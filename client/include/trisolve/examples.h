// Example systems of each family, for the CLI's make-example, the tests and the benchmarks.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "trisolve/ndarray.h"
#include "trisolve/swc.h"

namespace trisolve::examples {

using Arrays = std::map<std::string, NdArray>;

// The thesis' experiment 1: cC = 4, every other coefficient (2i + k) / (2N + M) (1-based),
// f such that the exact solution is all ones. float64, arrays N x M.
Arrays ThesisExperiment1(int64_t N, int64_t M);
// The thesis' experiment 2 (Poisson-like): 4 inside, 5 on the first and last row of inner
// blocks, 3 inside the first and last block rows, 4 at the corners, couplings -1, f = 2 on the
// first and last row of every block; exact solution all ones for N, M >= 2. Unscaled: the
// thesis' Jacobi row scaling is the request's scale_rows option.
Arrays ThesisExperiment2(int64_t N, int64_t M);

// Random diagonally dominant tridiagonal systems (|b| >= |a| + |c| + 1), a b c d.
Arrays RandomTridiagonal(int64_t batch, int64_t n, bool interleaved, uint64_t seed,
                         DType dtype = DType::kFloat64);

// The implicit-Euler step of the passive cable equation on a morphology, for `cells` cells
// with slightly different membrane states: parent [n], lower/upper/diag/rhs [cells, n].
Arrays CableTree(const Morphology& m, int64_t cells, uint64_t seed);

// Random dense systems, well conditioned (diagonally weighted), optionally symmetric:
// a [batch, n, n], b [batch, n].
Arrays RandomDense(int64_t batch, int64_t n, bool symmetric, uint64_t seed);

}  // namespace trisolve::examples
