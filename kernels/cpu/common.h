// Helpers shared by the CPU reference kernels.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

namespace trisolve::cpu {

template <typename T>
inline bool AllFinite(int64_t n, int64_t stride, const T* x) {
  for (int64_t k = 0; k < n; ++k)
    if (!std::isfinite(x[k * stride])) return false;
  return true;
}

template <typename T>
inline void ZeroStrided(int64_t n, int64_t stride, T* x) {
  for (int64_t k = 0; k < n; ++k) x[k * stride] = T(0);
}

// Sums over i in [0, n) of what add(i, s) adds into s (K doubles), computed in chunks of
// `chunk` indices (in parallel) and added chunk by chunk in order: the same bits whatever the
// number of threads or the order in which they finish. An OpenMP reduction(+) combines the
// threads' sums in the order they finish, so a reference iteration (cg, bicgstab) could take a
// different number of steps from one run to the next.
template <int K, typename Add>
std::array<double, K> OrderedSum(int64_t n, int64_t chunk, Add add) {
  chunk = std::max<int64_t>(chunk, 1);
  const int64_t chunks = (n + chunk - 1) / chunk;
  std::vector<std::array<double, K>> part(static_cast<size_t>(chunks), std::array<double, K>{});
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c)
    for (int64_t i = c * chunk; i < std::min(n, (c + 1) * chunk); ++i) add(i, part[c]);
  std::array<double, K> s{};
  for (const auto& p : part)
    for (int k = 0; k < K; ++k) s[k] += p[k];
  return s;
}

}  // namespace trisolve::cpu
