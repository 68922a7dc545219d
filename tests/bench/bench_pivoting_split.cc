// One large tridiagonal system by partial pivoting: the serial sweep (dgtsv's algorithm, one
// core) against cpu::PivotingSplit on this process's OpenMP threads, on the same data, with
// both answers' backward errors. Random rows U(-1, 1) (not diagonally dominant: what reaches
// pivoting once auto's certificate fails) and tridiag(1, 0, 1) (a zero diagonal).
//   bench_pivoting_split [--sizes 1048576,16777216] [--reps 5]   (OMP_NUM_THREADS sets T;
//   PARTS=k asks for k parts instead of the library's choice)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "trisolve/reference/tridiagonal.h"

namespace {

double BackwardError(int64_t n, const std::vector<double>& a, const std::vector<double>& b,
                     const std::vector<double>& c, const std::vector<double>& d,
                     const std::vector<double>& x) {
  long double rm = 0;
  double am = 0, xm = 0, dm = 0;
  for (int64_t k = 0; k < n; ++k) {
    long double ax = (long double)b[k] * x[k];
    double row = std::abs(b[k]);
    if (k > 0) ax += (long double)a[k] * x[k - 1], row += std::abs(a[k]);
    if (k + 1 < n) ax += (long double)c[k] * x[k + 1], row += std::abs(c[k]);
    if (!std::isfinite(x[k])) return INFINITY;
    rm = std::max(rm, std::abs((long double)d[k] - ax));
    am = std::max(am, row), xm = std::max(xm, std::abs(x[k])), dm = std::max(dm, std::abs(d[k]));
  }
  return double(rm) / (am * xm + dm);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes = {int64_t(1) << 20, int64_t(1) << 22, int64_t(1) << 24};
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--sizes") {
      sizes.clear();
      std::stringstream ss(argv[i + 1]);
      for (std::string t; std::getline(ss, t, ',');) sizes.push_back(std::stoll(t));
    } else if (k == "--reps") {
      reps = std::max(1, std::atoi(argv[i + 1]));
    }
  }
  const int threads = omp_get_max_threads();
  std::printf("threads %d; parts asked: SplitPivotingPartsFor(n, threads), PARTS overrides\n",
              threads);
  std::printf("| matrix | n | serial sweep | split | speed-up | parts | split's backward error | sweep's |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const char* kind : {"U(-1,1)", "tridiag(1, 0, 1)"}) {
    for (int64_t n : sizes) {
      std::mt19937_64 rng(42 + n);
      std::uniform_real_distribution<double> u(-1, 1);
      std::vector<double> a(n), b(n), c(n), d(n), x(n), xs(n), work(3 * n);
      const bool zero = std::string(kind) != "U(-1,1)";
      for (int64_t k = 0; k < n; ++k)
        a[k] = zero ? 1 : u(rng), b[k] = zero ? 0 : u(rng), c[k] = zero ? 1 : u(rng), d[k] = u(rng);
      a[0] = 0, c[n - 1] = 0;
      const char* pe = std::getenv("PARTS");
      const int64_t parts =
          pe ? std::atoll(pe) : trisolve::cpu::SplitPivotingPartsFor(n, threads);
      std::vector<double> ts, tp;
      trisolve::cpu::SplitPivoting r;
      for (int rep = 0; rep < reps; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        trisolve::cpu::PivotingStrided<double>(n, 1, a.data(), b.data(), c.data(), d.data(),
                                               xs.data(), work.data());
        auto t1 = std::chrono::steady_clock::now();
        r = trisolve::cpu::PivotingSplit<double>(n, 1, a.data(), b.data(), c.data(), d.data(),
                                                 x.data(), parts);
        auto t2 = std::chrono::steady_clock::now();
        ts.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        tp.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
      }
      const double ms = Median(ts), mp = Median(tp);
      std::printf("| %s | %lld | %.1f ms | %.1f ms%s | %.2fx | %lld | %.1e | %.1e |\n", kind,
                  (long long)n, ms, mp,
                  !r.split           ? " (fell back)"
                  : r.refinements == 1 ? " (refined once)"
                  : r.refinements > 1  ? " (refined twice)"
                                       : "",
                  ms / mp,
                  (long long)r.parts, BackwardError(n, a, b, c, d, x),
                  BackwardError(n, a, b, c, d, xs));
    }
  }
  return 0;
}
