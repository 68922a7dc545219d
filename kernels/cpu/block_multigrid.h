// The CPU reference's multigrid V-cycle for the block family (multigrid-cg, multigrid-bicgstab,
// auto's BiCGStab fallback): the hierarchy of 5-point levels and the red-black point smoother.
// Internal to cpu/ (block_tridiagonal.cc); the CUDA backend's is cuda/block/multigrid.cuh, which
// follows this arithmetic.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "trisolve/block_tridiagonal.h"

namespace trisolve::cpu {

// One 5-point grid level of the multigrid hierarchy (trisolve/block_tridiagonal.h): couplings
// to the west (k - 1), east (k + 1), north (i - 1) and south (i + 1) neighbours, zero where
// the neighbour does not exist.
template <typename T>
struct MgLevel {
  int64_t N, M;
  std::vector<T> w, c, e, n, s;
};

template <typename T>
std::vector<MgLevel<T>> BuildMultigrid(const BlockTridiagonalProblem<T>& p) {
  std::vector<MgLevel<T>> L;
  MgLevel<T> f{p.N, p.M};
  const int64_t size = p.N * p.M;
  for (auto* v : {&f.w, &f.c, &f.e, &f.n, &f.s}) v->resize(size);
  for (int64_t i = 0; i < p.N; ++i)
    for (int64_t k = 0; k < p.M; ++k) {
      const int64_t q = i * p.M + k;
      f.w[q] = k > 0 ? p.aC[q] : T(0);
      f.e[q] = k + 1 < p.M ? p.bC[q] : T(0);
      f.n[q] = i > 0 ? p.cA[q] : T(0);
      f.s[q] = i + 1 < p.N ? p.cB[q] : T(0);
      f.c[q] = p.cC[q];
    }
  L.push_back(std::move(f));
  while (L.back().N * L.back().M > kMgCoarsest && L.size() < 32) {
    const MgLevel<T>& a = L.back();
    MgLevel<T> b{(a.N + 1) / 2, (a.M + 1) / 2};
    for (auto* v : {&b.w, &b.c, &b.e, &b.n, &b.s}) v->assign(b.N * b.M, T(0));
    for (int64_t i = 0; i < a.N; ++i)
      for (int64_t k = 0; k < a.M; ++k) {
        const int64_t q = i * a.M + k, Q = (i / 2) * b.M + k / 2;
        const bool west_in = k & 1, east_in = !(k & 1), north_in = i & 1, south_in = !(i & 1);
        b.c[Q] += a.c[q] + (west_in ? a.w[q] : T(0)) + (east_in ? a.e[q] : T(0)) +
                  (north_in ? a.n[q] : T(0)) + (south_in ? a.s[q] : T(0));
        if (!west_in) b.w[Q] += a.w[q];
        if (!east_in) b.e[Q] += a.e[q];
        if (!north_in) b.n[Q] += a.n[q];
        if (!south_in) b.s[Q] += a.s[q];
      }
    L.push_back(std::move(b));
  }
  return L;
}

// One red-black half-sweep of point Gauss-Seidel on level a: cells with (i + k) % 2 == colour.
template <typename T>
void MgHalfSweep(const MgLevel<T>& a, const T* r, T* z, int colour) {
  const int64_t N = a.N, M = a.M;
#pragma omp parallel for schedule(static) if (N * M > 65536)
  for (int64_t i = 0; i < N; ++i)
    for (int64_t k = (i + colour) & 1; k < M; k += 2) {
      const int64_t q = i * M + k;
      T v = r[q];
      if (k > 0) v -= a.w[q] * z[q - 1];
      if (k + 1 < M) v -= a.e[q] * z[q + 1];
      if (i > 0) v -= a.n[q] * z[q - M];
      if (i + 1 < N) v -= a.s[q] * z[q + M];
      z[q] = v / a.c[q];
    }
}

// z = V(r) on level l: z = 0, red then black half-sweep, the residual restricted to level
// l + 1 (sums over the 2 x 2 aggregates), the coarse correction added back (constant over
// each aggregate, times kMgCorrection), black then red. A symmetric operator, as CG needs. The coarsest level
// runs kMgCoarseSweeps sweeps forward and as many backward.
template <typename T>
void VCycle(const std::vector<MgLevel<T>>& L, size_t l, const T* r, T* z,
            std::vector<std::vector<T>>& tmp, double factor = kMgCorrection) {
  const MgLevel<T>& a = L[l];
  const int64_t N = a.N, M = a.M;
  std::fill(z, z + N * M, T(0));
  if (l + 1 == L.size()) {
    for (int q = 0; q < kMgCoarseSweeps; ++q) {
      MgHalfSweep(a, r, z, 0);
      MgHalfSweep(a, r, z, 1);
    }
    for (int q = 0; q < kMgCoarseSweeps; ++q) {
      MgHalfSweep(a, r, z, 1);
      MgHalfSweep(a, r, z, 0);
    }
    return;
  }
  MgHalfSweep(a, r, z, 0);
  MgHalfSweep(a, r, z, 1);
  const MgLevel<T>& b = L[l + 1];
  std::vector<T>& rc = tmp[2 * l];
  std::vector<T>& zc = tmp[2 * l + 1];
  rc.assign(b.N * b.M, T(0));
  zc.resize(b.N * b.M);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t k = 0; k < M; ++k) {
      const int64_t q = i * M + k;
      T v = r[q] - a.c[q] * z[q];
      if (k > 0) v -= a.w[q] * z[q - 1];
      if (k + 1 < M) v -= a.e[q] * z[q + 1];
      if (i > 0) v -= a.n[q] * z[q - M];
      if (i + 1 < N) v -= a.s[q] * z[q + M];
      rc[(i / 2) * b.M + k / 2] += v;
    }
  VCycle(L, l + 1, rc.data(), zc.data(), tmp, factor);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t k = 0; k < M; ++k) z[i * M + k] += T(factor) * zc[(i / 2) * b.M + k / 2];
  MgHalfSweep(a, r, z, 1);
  MgHalfSweep(a, r, z, 0);
}

// The sign the diagonals share on every level: +1 all positive, -1 all negative, 0 neither
// (both signs, a zero or a value that is not finite). A symmetric definite matrix has
// diagonals of one sign, and so have its Galerkin coarse matrices (P^T A P is definite with
// A): a hierarchy whose diagonals do not share one sign belongs to an indefinite matrix.
template <typename T>
int DiagonalSign(const std::vector<MgLevel<T>>& levels) {
  bool pos = true, neg = true;
  for (const auto& lv : levels)
    for (T v : lv.c) {
      pos &= v > T(0) && std::isfinite(v);
      neg &= v < T(0) && std::isfinite(v);
    }
  return pos ? 1 : neg ? -1 : 0;
}
// Point Gauss-Seidel divides by the diagonals: the V-cycle runs where none is zero.
template <typename T>
bool MgDiagonalsNonzero(const std::vector<MgLevel<T>>& levels) {
  for (const auto& lv : levels)
    for (T v : lv.c)
      if (v == T(0) || !std::isfinite(v)) return false;
  return true;
}

}  // namespace trisolve::cpu
