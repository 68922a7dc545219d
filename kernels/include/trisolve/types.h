// Shared vocabulary of the trisolve kernels: layouts, per-system status, what a solve reports.
// The kernels library knows nothing of gRPC; the server translates to and from these types.
#pragma once

#include "absl/strings/string_view.h"
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace trisolve {

enum class Precision : uint8_t { kFloat64, kFloat32 };

// Where element k of system s lives in a batch of `batch` systems of size n.
//  kFlat:        each system contiguous, s * n + k
//  kInterleaved: element k of all systems together, k * batch + s (cuThomasBatch's
//                "Full-Interleaved": consecutive GPU threads read consecutive words).
enum class Layout : uint8_t { kFlat, kInterleaved };

inline int64_t ElementIndex(Layout layout, int64_t batch, int64_t n, int64_t s,
                            int64_t k) {
  return layout == Layout::kFlat ? s * n + k : k * batch + s;
}
// Distance between consecutive elements of one system, and the offset of its first.
inline int64_t ElementStride(Layout layout, int64_t batch) {
  return layout == Layout::kFlat ? 1 : batch;
}
inline int64_t SystemOffset(Layout layout, int64_t n, int64_t s) {
  return layout == Layout::kFlat ? s * n : s;
}

// What became of one system of a batch. A system that is not kOk has its solution
// set to zero: a NaN is never handed back as a solution.
enum class SystemStatus : uint8_t {
  kOk = 0,
  kSingular = 1,      // a pivot vanished (exact zero, or cancelled to rounding level)
  kNotConverged = 2,  // an iterative method stopped at its iteration limit above tolerance
  kDiverged = 3,      // an iterative method produced non-finite values
};
absl::string_view StatusName(SystemStatus s);

// One point of an iterative solve's residual history: the relative residual after
// `iteration` iterations (sweeps).
struct ResidualPoint {
  int64_t iteration = 0;
  double residual = 0;
};

// What a solve reports besides the solution.
struct SolveInfo {
  std::string method;      // the method actually run (what `auto` picked)
  int64_t iterations = 0;  // iterative methods: sweeps done; direct methods: 0
  double residual = std::numeric_limits<double>::quiet_NaN();  // iterative: ||f-Ay||/||f||
  // Device backends: where the time went (microseconds); zero on the CPU.
  double h2d_us = 0;
  double kernel_us = 0;
  double d2h_us = 0;
  // Iterative methods, when SolveControl::history_limit asks: the residual at the checks the
  // method makes anyway, ending at (iterations, residual) (block_tridiagonal.h says which).
  std::vector<ResidualPoint> residual_history;
  // SolveControl::check_finite was honoured: every input the call read from the host was
  // checked for NaN and Inf where it lay anyway (on the device, after the copy in).
  bool inputs_checked = false;
};

// Lets a long solve stop early when its caller has gone (deadline, cancellation).
// Iterative methods also report to it, where they already know their residual: `progress`
// (iterations done, relative residual) when set, and a residual history of at most
// history_limit points when that is > 0. Neither costs a solve that asks for neither.
struct SolveControl {
  std::function<bool()> cancelled;
  std::function<void(int64_t iteration, double residual)> progress;
  int64_t history_limit = 0;
  // The caller left the inputs' finiteness unchecked (a large request: the pass over every
  // value on the host cost more than the copies). A backend that can check them where it
  // reads them anyway does, sets SolveInfo::inputs_checked, and fails the call with
  // NonFiniteInputError() if one is NaN or Inf; the caller checks whatever was not.
  bool check_finite = false;
  bool Cancelled() const { return cancelled && cancelled(); }
};

// A pivot "vanishes" when it is zero, not finite, or cancelled below the rounding level of
// the terms it was formed from: |p| <= eps * scale, scale = sum of |terms|.
template <typename T>
inline bool PivotVanishes(T pivot, T scale) {
  const T mag = pivot < T(0) ? -pivot : pivot;
  if (!(mag < std::numeric_limits<T>::infinity())) return true;  // NaN or Inf
  return mag <= std::numeric_limits<T>::epsilon() * scale || mag == T(0);
}

}  // namespace trisolve
