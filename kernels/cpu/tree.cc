// CPU reference for tree (Hines) systems: the backward sweep (leaves to root) eliminates
// each node's coupling into its parent, the forward sweep (root to leaves) substitutes back.
#include "trisolve/tree.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common.h"

namespace trisolve {

absl::Status ValidateParents(const int32_t* parent, int64_t n) {
  if (n <= 0) return absl::InvalidArgumentError("parent: empty tree");
  if (parent[0] != -1)
    return absl::InvalidArgumentError(
        absl::StrCat("parent[0] is ", parent[0], ", expected -1 (node 0 is the root)"));
  for (int64_t i = 1; i < n; ++i) {
    if (parent[i] < 0 || parent[i] >= i)
      return absl::InvalidArgumentError(absl::StrCat(
          "parent[", i, "] is ", parent[i], ", expected 0 <= parent[i] < ", i,
          " (nodes must be numbered depth-first from the root 0)"));
  }
  return absl::OkStatus();
}

namespace cpu {
namespace {

template <typename T>
bool HinesOne(int64_t n, int64_t s, const int32_t* parent, const T* lower, const T* upper,
              const T* diag, const T* rhs, T* x, T* D, T* S) {
  // D holds the eliminated diagonal, S the magnitude of the terms it was formed from (for
  // the vanishing-pivot test), x the eliminated right-hand side until the forward sweep.
  for (int64_t i = 0; i < n; ++i) {
    D[i] = diag[i * s];
    S[i] = std::abs(D[i]);
    x[i * s] = rhs[i * s];
  }
  for (int64_t i = n - 1; i >= 1; --i) {
    if (PivotVanishes(D[i], S[i])) return false;
    const T f = upper[i * s] / D[i];
    const int64_t p = parent[i];
    const T fl = f * lower[i * s];
    D[p] -= fl;
    S[p] += std::abs(fl);
    x[p * s] -= f * x[i * s];
  }
  if (PivotVanishes(D[0], S[0])) return false;
  x[0] = x[0] / D[0];
  for (int64_t i = 1; i < n; ++i)
    x[i * s] = (x[i * s] - lower[i * s] * x[int64_t(parent[i]) * s]) / D[i];
  return AllFinite(n, s, x);
}

}  // namespace

template <typename T>
SolveInfo SolveTree(const TreeProblem<T>& p, TreeMethod method, TreeOutput<T> out) {
  const int64_t stride = ElementStride(p.layout, p.batch);
#pragma omp parallel
  {
    std::vector<T> D(p.n), S(p.n);
#pragma omp for schedule(static)
    for (int64_t s = 0; s < p.batch; ++s) {
      const int64_t off = SystemOffset(p.layout, p.n, s);
      const int32_t* parent = p.parent + (p.parent_per_system ? s * p.n : 0);
      const bool ok = HinesOne(p.n, stride, parent, p.lower + off, p.upper + off,
                               p.diag + off, p.rhs + off, out.x + off, D.data(), S.data());
      if (!ok) ZeroStrided(p.n, stride, out.x + off);
      out.status[s] = ok ? SystemStatus::kOk : SystemStatus::kSingular;
    }
  }
  SolveInfo info;
  info.method = "hines";
  return info;
}
template SolveInfo SolveTree(const TreeProblem<double>&, TreeMethod, TreeOutput<double>);
template SolveInfo SolveTree(const TreeProblem<float>&, TreeMethod, TreeOutput<float>);

}  // namespace cpu

template <typename T>
double TreeBackwardError(const TreeProblem<T>& p, const T* x, const SystemStatus* status) {
  const int64_t st = ElementStride(p.layout, p.batch);
  double worst = 0;
#pragma omp parallel reduction(max : worst)
  {
    std::vector<double> ax(p.n), rowabs(p.n);
#pragma omp for schedule(static)
    for (int64_t s = 0; s < p.batch; ++s) {
      if (status && status[s] != SystemStatus::kOk) continue;
      const int64_t off = SystemOffset(p.layout, p.n, s);
      const int32_t* parent = p.parent + (p.parent_per_system ? s * p.n : 0);
      for (int64_t i = 0; i < p.n; ++i) {
        ax[i] = double(p.diag[off + i * st]) * x[off + i * st];
        rowabs[i] = std::abs(double(p.diag[off + i * st]));
      }
      double xmax = 0, bmax = 0;
      for (int64_t i = 0; i < p.n; ++i) {
        const int64_t e = off + i * st;
        xmax = std::max(xmax, std::abs(double(x[e])));
        bmax = std::max(bmax, std::abs(double(p.rhs[e])));
        if (i == 0) continue;
        const int64_t q = parent[i], eq = off + q * st;
        ax[i] += double(p.lower[e]) * x[eq];
        rowabs[i] += std::abs(double(p.lower[e]));
        ax[q] += double(p.upper[e]) * x[e];
        rowabs[q] += std::abs(double(p.upper[e]));
      }
      double rmax = 0, amax = 0;
      for (int64_t i = 0; i < p.n; ++i) {
        rmax = std::max(rmax, std::abs(double(p.rhs[off + i * st]) - ax[i]));
        amax = std::max(amax, rowabs[i]);
      }
      const double denom = amax * xmax + bmax;
      worst = std::max(worst, denom > 0 ? rmax / denom : 0.0);
    }
  }
  return worst;
}
template double TreeBackwardError(const TreeProblem<double>&, const double*,
                                  const SystemStatus*);
template double TreeBackwardError(const TreeProblem<float>&, const float*,
                                  const SystemStatus*);

}  // namespace trisolve
