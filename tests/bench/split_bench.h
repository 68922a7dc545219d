// What the benches of one system split over devices share (bench_split_system,
// bench_split_tree): host threads, the distance of two answers, the median of a backend call
// timed end to end, and their table's cells.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "trisolve/types.h"

namespace trisolve::bench {

using Clock = std::chrono::steady_clock;

inline int Threads() { return int(std::max(1u, std::thread::hardware_concurrency())); }

template <typename F>
void ParallelFor(int64_t n, F f) {  // f(begin, end, thread)
  const int t = Threads();
  std::vector<std::thread> pool;
  for (int k = 0; k < t; ++k) pool.emplace_back([=] { f(n * k / t, n * (k + 1) / t, k); });
  for (auto& th : pool) th.join();
}

// max |x - y| / max |y|; infinity where either holds a NaN or an infinity.
inline double Distance(int64_t n, const double* x, const double* y) {
  double d = 0, m = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i]) || !std::isfinite(y[i])) return INFINITY;
    d = std::max(d, std::abs(x[i] - y[i]));
    m = std::max(m, std::abs(y[i]));
  }
  return d / m;
}

struct Timed {
  bool ok = false;
  std::string what;  // method, or the error
  double median_ms = 0;
};

// The median of `reps` calls of solve(&status) -> StatusOr<SolveInfo> after one that warms
// pools, staging and plan caches; the first error or a status other than OK ends it.
template <typename Solve>
Timed MedianSolve(int reps, const Solve& solve) {
  Timed t;
  std::vector<double> ms;
  for (int r = 0; r <= reps; ++r) {
    SystemStatus st = SystemStatus::kOk;
    const auto t0 = Clock::now();
    absl::StatusOr<SolveInfo> got = solve(&st);
    const double dt = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (!got.ok()) {
      t.what = std::string(got.status().message()).substr(0, 200);
      return t;
    }
    if (st != SystemStatus::kOk) {
      t.what = "status not OK";
      return t;
    }
    t.what = got->method;
    if (r > 0) ms.push_back(dt);
  }
  std::sort(ms.begin(), ms.end());
  t.ok = true;
  t.median_ms = ms.empty() ? 0 : ms[ms.size() / 2];
  return t;
}

inline std::string Cell(const Timed& t) {
  if (!t.ok) return t.what;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f ms", t.median_ms);
  return buf;
}

// "24,26,28" -> {24, 26, 28}
inline std::vector<int> Ints(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p;) {
    out.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return out;
}

}  // namespace trisolve::bench
