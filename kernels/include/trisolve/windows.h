// Overlapping windows of long tridiagonal systems: the plan and the accuracy bound of the CUDA
// backend's "partitioned-window" kernel (kernels/cuda/tridiagonal.cu), here so that the CPU
// tests check them.
//
// A system of n rows is cut into windows of at most `rows` rows. Window w solves for its core,
// rows [c0, c1) (the cores tile the system, each row in exactly one), and reads `halo` more rows
// on each side that has a neighbour: rows [lo, hi). It solves the rows it read on their own,
// the couplings a[lo] x[lo - 1] and c[hi - 1] x[hi] dropped, and keeps x on its core only.
//
// Why the core is then exact to rounding: let rho < 1 bound (|a_i| + |c_i|) / |b_i| over the
// window's rows (the dropped couplings included). The error e of the window's solution solves
// the window's matrix against -a[lo] x[lo - 1] at its first row (and the mirror term at its last).
// Strict row dominance gives |e_1| <= rho |x[lo - 1]| and max_{i >= k} |e_i| <= rho max_{i >= k-1}
// |e_i| (take the largest |e_i| of the tail: its row's equation bounds it by rho times its
// neighbours'), so at the core, halo + 1 rows in, |e| <= rho^(halo + 1) |x[lo - 1]|; with the
// mirror term, |e| <= 2 rho^(halo + 1) max |x|. WindowDominanceLimit gives the rho at which that
// bound is the unit roundoff of the type (digits: 53 for float64, 24 for float32): a window
// whose rows are not all that dominant is not used (the kernel falls back to the exact
// two-pass path).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define TRISOLVE_HD __host__ __device__
#else
#define TRISOLVE_HD
#endif

namespace trisolve {

struct WindowPlan {
  int64_t per_system = 0;  // windows a system
  int64_t core = 0;        // rows a core (the last of a system: the rest)
  int64_t halo = 0;        // rows read beyond the core on each side that has a neighbour
};

struct WindowRows {
  int64_t lo = 0, hi = 0;  // rows read
  int64_t c0 = 0, c1 = 0;  // rows solved for
};

// Windows of at most `rows` rows for a system of n: the fewest that hold it with `halo` rows
// each side, cores of equal size rounded up to a multiple of `align` (rows and halo multiples of
// it too). n <= rows: one window, the whole system. Returns per_system == 0 where rows <= 2 halo.
inline WindowPlan PlanWindows(int64_t n, int64_t rows, int64_t halo, int64_t align) {
  WindowPlan w;
  w.halo = halo;
  if (n <= rows) {
    w.per_system = 1;
    w.core = n;
    return w;
  }
  const int64_t most = rows - 2 * halo;
  if (most <= 0) return w;
  w.per_system = (n + most - 1) / most;
  const int64_t even = (n + w.per_system - 1) / w.per_system;
  w.core = (even + align - 1) / align * align;  // <= most: most is a multiple of align
  w.per_system = (n + w.core - 1) / w.core;
  return w;
}

TRISOLVE_HD inline WindowRows WindowAt(const WindowPlan& w, int64_t n, int64_t k) {
  WindowRows r;
  r.c0 = k * w.core;
  r.c1 = r.c0 + w.core < n ? r.c0 + w.core : n;
  r.lo = r.c0 > w.halo ? r.c0 - w.halo : 0;
  r.hi = r.c1 + w.halo < n ? r.c1 + w.halo : n;
  return r;
}

// The largest rho (see above) for which 2 rho^(halo + 1) <= 2^-digits.
inline double WindowDominanceLimit(int64_t halo, int digits) {
  return std::exp2(-double(digits + 1) / double(halo + 1));
}

}  // namespace trisolve
