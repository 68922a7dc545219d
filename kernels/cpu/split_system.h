// One tridiagonal system solved in parts, each part by a backend of its own (the devices of the
// multi-device backend): the parts are solved at once, then joined at their interfaces on the
// host. Internal to trisolve_kernels (placed_backend.cc); the tests reach it through
// MakePlacedBackend.
//
// The rows are cut into P consecutive parts (SPIKE's form). Part k (rows [s, e), m = e - s,
// matrix T, couplings alpha = a[s] to the row before it and gamma = c[e-1] to the row after) has
//   x_k = y - alpha x[s-1] v - gamma x[e] w,   T y = d_k,  T v = e_1,  T w = e_m,
// so the values on either side of each interface (x[e-1] and x[e]) solve a system of 2(P-1)
// unknowns, nonsingular where A and every part are. y is the backends' solve of the part; v
// and w are solved on the host (partial pivoting, double) in windows of the part's first and
// last K rows, and the interfaces' system in long double. Where K < m the windows drop what v
// and w hold past them, and the answer is then the exact solution of A x = d + r with r
// nonzero in one row per window: r = a[s+K] * (the correction at s+K-1), known exactly. Each
// such r must be within the unit roundoff of its row's terms (a backward error no solve does
// better than); where it is not, K grows (x8) until it is or the window is the part.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trisolve/tridiagonal.h"
#include "trisolve/types.h"

namespace trisolve {

// Solves part `k` (one system, flat) into out; out.status[0] reports its pivots.
template <typename T>
using SolvePartFn = std::function<absl::StatusOr<SolveInfo>(
    size_t k, const TridiagonalProblem<T>& part, TridiagonalOutput<T> out)>;

struct SplitOutcome {
  bool solved = false;  // false: x is partly written; `why` says why the parts cannot join
  std::string why;
  SolveInfo info;  // the parts' method, " (one system split over P devices)", longest times
};

// The largest window solved on the host (rows): past it, a part whose v and w do not decay is
// not joined (SplitOutcome::solved false) and the caller solves the system another way.
constexpr int64_t kSplitMaxWindow = int64_t{1} << 24;
constexpr int64_t kSplitFirstWindow = 8192;

// The rows of each part for a system of n rows over parts in proportion to `weights` (whole
// 16-row groups but the last, where parts hold 1024 rows or more). Empty where a part would
// hold fewer than 2 rows.
std::vector<int64_t> SplitRows(int64_t n, const std::vector<double>& weights);

// Gaussian elimination with partial pivoting on a small dense system (row-major q x q) in long
// double: rhs becomes the solution; false where a pivot is zero or a value not finite. (The
// interfaces' systems of both splits.)
bool SolveSmallDense(int q, std::vector<long double>& A, std::vector<long double>& rhs);

// p: one system (batch 1). rows: from SplitRows. Runs solve_part for every part at once (part 0
// on the calling thread). An error of a part is returned as it is.
template <typename T>
absl::StatusOr<SplitOutcome> SolveSystemSplit(const TridiagonalProblem<T>& p,
                                              const std::vector<int64_t>& rows,
                                              const SolvePartFn<T>& solve_part, T* x);

}  // namespace trisolve
