// Overlapping windows of long tridiagonal systems: the plan and the accuracy bound of the CUDA
// backend's "partitioned-window" kernel (kernels/cuda/tridiagonal/tridiagonal.cu), here so that the CPU
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

#include "trisolve/host_device.h"

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

// One long system as a chain of windows, `lanes` consecutive windows a warp (the CUDA
// backend's thomas-window, kernels/cuda/tridiagonal/thomas_window.cu): each warp a task, `warps` of them at
// once. The cores tile the system in at most two parts, each of equal cores (a tensor map views
// a part as windows x core): the first part's cores `core` rows, the second's `core + align`,
// so that the largest core, which sets how long the slowest task takes, is as short as `warps`
// tasks allow (2^24 rows on 528 warps of 32: 496 tasks of 992-row windows and 32 of 1008, where
// windows of 1024 would leave 16 warps idle and make every task 1.6% longer). Where there are
// two parts the first is whole tasks, and the second holds a window at least, whose first rows
// the first part's last window reads past its core (and the second's first window the first's
// last rows, as its halo). Cores are multiples of `align`, at least `min_core`; parts == 0
// where n is not a multiple of `align` or shorter than one task of `min_core` windows.
// `one_part`: equal cores only (mirrored windows take every other window of one view).
struct ChainPart {
  int64_t start = 0;    // its first row
  int64_t core = 0;     // rows a window
  int64_t windows = 0;  // its windows
};
struct ChainPlan {
  int parts = 0;
  ChainPart part[2];
  int64_t tasks = 0;  // warps of `lanes` windows: the first part's ceil(windows / lanes), then the
                      // second's
};

inline ChainPlan PlanChain(int64_t n, int64_t warps, int64_t lanes, int64_t align,
                           int64_t min_core, bool one_part = false) {
  ChainPlan plan;
  if (n <= 0 || warps <= 0 || lanes <= 0 || align <= 0 || n % align != 0 ||
      n < lanes * min_core)
    return plan;
  const int64_t units = n / align;  // rows in units of align
  const int64_t per = lanes * warps;
  // By the largest core m (in units): one part of m, else m - 1 then m.
  for (int64_t m = std::max((min_core + align - 1) / align, (units + per - 1) / per);
       m <= units; ++m) {
    if (units % m == 0 && (units / m + lanes - 1) / lanes <= warps) {
      plan.parts = 1;
      plan.part[0] = ChainPart{0, m * align, units / m};
      plan.tasks = (units / m + lanes - 1) / lanes;
      return plan;
    }
    const int64_t c = m - 1;  // the first part's core
    if (one_part || c * align < min_core) continue;
    // The fewest windows of m: the most whole tasks of c first.
    for (int64_t ta = (units - m) / (lanes * c); ta >= 1; --ta) {
      const int64_t rest = units - lanes * ta * c;
      if (rest % m != 0) continue;
      const int64_t tasks = ta + (rest / m + lanes - 1) / lanes;
      if (tasks > warps) continue;  // (fewer of c: as many tasks or fewer)
      plan.parts = 2;
      plan.part[0] = ChainPart{0, c * align, lanes * ta};
      plan.part[1] = ChainPart{lanes * ta * c * align, m * align, rest / m};
      plan.tasks = tasks;
      return plan;
    }
  }
  return plan;
}

// The largest rho (see above) for which 2 rho^(halo + 1) <= 2^-digits.
inline double WindowDominanceLimit(int64_t halo, int digits) {
  return std::exp2(-double(digits + 1) / double(halo + 1));
}

}  // namespace trisolve
