// A batch of diagonally dominant tridiagonal systems (float64, flat) with the CPU reference's
// answer, and the distance of an answer from it: what the multi-device benchmarks solve and
// check (bench_multi_device, bench_registration).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "trisolve/backend.h"

namespace trisolve::bench {

struct TridiagonalCase {
  int64_t batch, n;
  std::vector<double> a, b, c, d, want;
};

// Couplings in (-1, 1), diagonals in (3, 5), right-hand sides in (-1, 1), seeded by the shape.
inline TridiagonalCase MakeTridiagonalCase(int64_t batch, int64_t n) {
  TridiagonalCase k{batch, n, {}, {}, {}, {}, {}};
  std::mt19937_64 rng(uint64_t(batch * 31 + n));
  std::uniform_real_distribution<double> u(-1, 1);
  const int64_t e = batch * n;
  for (auto* v : {&k.a, &k.b, &k.c, &k.d}) v->resize(size_t(e));
  for (int64_t i = 0; i < e; ++i) {
    k.a[size_t(i)] = u(rng);
    k.c[size_t(i)] = u(rng);
    k.b[size_t(i)] = 4 + u(rng);
    k.d[size_t(i)] = u(rng);
  }
  k.want.resize(size_t(e));
  std::vector<SystemStatus> st(static_cast<size_t>(batch));
  auto cpu = MakeCpuBackend();
  const TridiagonalProblem<double> p{batch,      n,          Layout::kFlat, k.a.data(),
                                     k.b.data(), k.c.data(), k.d.data()};
  if (!cpu->Solve(p, TridiagonalMethod::kAuto, {k.want.data(), st.data()}, {}).ok()) std::exit(1);
  return k;
}

// max |x - want| / max |want|; infinity where x is not finite.
inline double Distance(const std::vector<double>& x, const std::vector<double>& want) {
  double d = 0, m = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) return INFINITY;
    d = std::max(d, std::abs(x[i] - want[i]));
    m = std::max(m, std::abs(want[i]));
  }
  return d / m;
}

}  // namespace trisolve::bench
