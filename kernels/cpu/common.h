// Helpers shared by the CPU reference kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

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

}  // namespace trisolve::cpu
