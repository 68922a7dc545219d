// One large tridiagonal system by partial pivoting on every core (cpu::PivotingSplit): the 20
// stability matrices against LAPACK dgtsv with the split forced, the fallbacks (a block that
// does not factor, a truly singular system), float32, and the batch entry points that use it
// for fewer large systems than threads (pivoting, and auto's second solve).
#include <lapacke.h>
#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "stability_matrices.h"
#include "trisolve/reference/tridiagonal.h"
#include "trisolve/tridiagonal.h"

namespace trisolve {
namespace {

using namespace ::trisolve::stability;

double DgtsvBackwardError(const Tri& t, const std::vector<double>& d) {
  const int n = int(d.size());
  std::vector<double> dl(t.a.begin() + 1, t.a.end()), dd = t.b, du(t.c.begin(), t.c.end() - 1),
      x = d;
  const lapack_int info =
      LAPACKE_dgtsv(LAPACK_COL_MAJOR, n, 1, dl.data(), dd.data(), du.data(), x.data(), n);
  return BackwardError(t, d, x, info == 0);
}

// The twenty matrices, in 16 and 64 parts: every answer within 10x of max(dgtsv's backward
// error, eps), split or not.
TEST(PivotingSplit, TwentyMatricesWithinTenTimesDgtsv) {
  for (int n : {1 << 14, 1 << 16}) {
    const std::vector<Tri> suite = Suite(n, 2021 + n);
    std::mt19937_64 rng(11 + n);
    std::uniform_real_distribution<double> u(-1, 1);
    for (int64_t parts : {int64_t(16), int64_t(64)}) {
      int split = 0;
      for (size_t m = 0; m < suite.size(); ++m) {
        const Tri& t = suite[m];
        std::vector<double> d(n);
        for (double& v : d) v = u(rng);
        std::vector<double> x(n, std::nan(""));
        const cpu::SplitPivoting r = cpu::PivotingSplit<double>(
            n, 1, t.a.data(), t.b.data(), t.c.data(), d.data(), x.data(), parts);
        const double lb = DgtsvBackwardError(t, d);
        const double gb = BackwardError(t, d, x, r.ok);
        split += r.split;
        std::printf("n %d in %lld parts #%zu %-44s %s, backward error %.1e (dgtsv %.1e)\n", n,
                    (long long)parts, m + 1, t.name.c_str(),
                    !r.split            ? "sweep"
                    : r.refinements > 0 ? "split, refined"
                                        : "split",
                    gb, lb);
        if (std::isfinite(lb)) {
          EXPECT_TRUE(r.ok) << "#" << m + 1 << " " << t.name;
          EXPECT_LE(gb, 10 * std::max(lb, DBL_EPSILON))
              << "#" << m + 1 << " " << t.name << " n " << n << " in " << parts << " parts"
              << (r.split ? " (split)" : " (serial)") << ": " << gb << " against dgtsv's " << lb;
        }
        if (r.split) {
          EXPECT_LE(r.backward_error, cpu::kSplitPivotingTolerance * DBL_EPSILON);
        }
      }
      std::printf("n %d in %lld parts: %d of 20 answered split\n", n, (long long)parts, split);
      // All of the suite but the singular #15 (diagonal 0, n even, random) and at some part
      // counts dorr's matrix (whose refinement stalls) is split.
      EXPECT_GE(split, 18);
    }
  }
}

// A zero diagonal (a = c = 1, b = 0, n even: nonsingular; every block of an even length, so
// every block factors). The split answers it at every part count, without refinement, within
// 10x of dgtsv's backward error: before the spikes were kept, the interface rows carried the
// forward error of each part's second solve (45 eps at 17 parts of 2^20 rows, 6 eps at 4097
// parts, always over the bound at the library's part counts), the check failed and the sweep
// ran after the whole split. For n odd the matrix is singular, and is reported so.
TEST(PivotingSplit, ZeroDiagonalSplitsAndItsOddFormIsSingular) {
  for (int n : {1 << 16, (1 << 16) + 1, 1 << 20}) {
    Tri t{"zero diagonal", std::vector<double>(n, 1), std::vector<double>(n, 0),
          std::vector<double>(n, 1)};
    t.a[0] = 0, t.c[n - 1] = 0;
    std::vector<double> d(n);
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<double> u(-1, 1);
    for (double& v : d) v = u(rng);
    const double lb = n % 2 == 0 ? DgtsvBackwardError(t, d) : INFINITY;
    for (int64_t parts : {int64_t(15), int64_t(16), int64_t(64), int64_t(257),
                          cpu::SplitPivotingPartsFor(n, 16)}) {
      std::vector<double> x(n);
      const cpu::SplitPivoting r = cpu::PivotingSplit<double>(
          n, 1, t.a.data(), t.b.data(), t.c.data(), d.data(), x.data(), parts);
      if (n % 2 == 1) {
        EXPECT_FALSE(r.ok) << n << " " << parts;
        continue;
      }
      ASSERT_TRUE(r.ok) << parts;
      EXPECT_TRUE(r.split) << n << " in " << parts << " parts";
      EXPECT_EQ(r.refinements, 0) << n << " in " << parts << " parts";
      const double be = BackwardError(t, d, x, r.ok);
      EXPECT_LE(be, 10 * std::max(lb, DBL_EPSILON)) << n << " in " << parts << " parts";
      EXPECT_LE(be, cpu::kSplitPivotingTolerance * DBL_EPSILON);
    }
  }
  // float32 the same (sgtsv's bound: the check's 8 eps of float).
  const int n = 1 << 18;
  std::vector<float> a(n, 1.f), b(n, 0.f), c(n, 1.f), d(n), x(n);
  a[0] = 0, c[n - 1] = 0;
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& v : d) v = u(rng);
  const cpu::SplitPivoting r = cpu::PivotingSplit<float>(n, 1, a.data(), b.data(), c.data(),
                                                         d.data(), x.data(), 64);
  ASSERT_TRUE(r.ok);
  EXPECT_TRUE(r.split);
  EXPECT_LE(r.backward_error, cpu::kSplitPivotingTolerance * FLT_EPSILON);
}

// Each part's block is factored once for the answer: the count the split reports is its part
// count (twice that before: once to reduce, once to substitute back), on random rows, a zero
// diagonal and a dominant matrix; a refinement step factors them once more, and the count
// says so (tridiag(1, 1e-8, 1) at 2^20 rows in 16 parts takes one step).
TEST(PivotingSplit, FactorsEachBlockOncePerSolve) {
  const int n = 1 << 18;
  std::mt19937_64 rng(21);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int kind = 0; kind < 3; ++kind) {
    std::vector<double> a(n), b(n), c(n), d(n), x(n);
    for (int k = 0; k < n; ++k) {
      a[k] = kind == 1 ? 1 : u(rng), c[k] = kind == 1 ? 1 : u(rng), d[k] = u(rng);
      b[k] = kind == 0 ? u(rng) : kind == 1 ? 0 : 4;
    }
    a[0] = 0, c[n - 1] = 0;
    const cpu::SplitPivoting r =
        cpu::PivotingSplit<double>(n, 1, a.data(), b.data(), c.data(), d.data(), x.data(), 64);
    ASSERT_TRUE(r.ok && r.split) << kind;
    EXPECT_EQ(r.refinements, 0) << kind;
    EXPECT_EQ(r.factorizations, r.parts) << kind;
  }
  const int big = 1 << 20;
  std::vector<double> a(big, 1), b(big, 1e-8), c(big, 1), d(big), x(big);
  a[0] = 0, c[big - 1] = 0;
  for (double& v : d) v = u(rng);
  const cpu::SplitPivoting r =
      cpu::PivotingSplit<double>(big, 1, a.data(), b.data(), c.data(), d.data(), x.data(), 16);
  ASSERT_TRUE(r.ok && r.split);
  EXPECT_GE(r.refinements, 1);
  EXPECT_EQ(r.factorizations, r.parts * (1 + r.refinements));
  EXPECT_LE(r.backward_error, cpu::kSplitPivotingTolerance * DBL_EPSILON);
}

// A block that does not factor in a nonsingular matrix (the first two rows of a part's
// interior equal once the coupling to the interface before them is dropped): the serial
// sweep answers, as well.
TEST(PivotingSplit, ABlockThatDoesNotFactorFallsBackToTheSweep) {
  const int n = 1 << 16;
  const cpu::SplitLayout l = cpu::SplitPivotingLayout(n, 16);
  ASSERT_GE(l.parts, 3);
  Tri t{"", std::vector<double>(n, 1), std::vector<double>(n, 4), std::vector<double>(n, 1)};
  t.a[0] = 0, t.c[n - 1] = 0;
  const int r0 = int(l.rows);  // part 1's first row, after interface row rows - 1
  t.a[r0] = 1, t.b[r0] = 1, t.c[r0] = 1;
  t.a[r0 + 1] = 1, t.b[r0 + 1] = 1, t.c[r0 + 1] = 0;
  std::vector<double> d(n, 1.0), x(n);
  const cpu::SplitPivoting r = cpu::PivotingSplit<double>(n, 1, t.a.data(), t.b.data(),
                                                          t.c.data(), d.data(), x.data(), 16);
  ASSERT_TRUE(r.ok);
  EXPECT_FALSE(r.split);
  EXPECT_LE(BackwardError(t, d, x, r.ok), 10 * std::max(DgtsvBackwardError(t, d), DBL_EPSILON));
  // The parts not yet started when the block failed are skipped: with the failing block the
  // second of 64, a handful are factored, not 64. On one thread, so that the order is fixed (on
  // two, a loaded host once held the failing block's thread while the other factored all the
  // rest: 65 factorizations in CI).
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const cpu::SplitLayout l64 = cpu::SplitPivotingLayout(n, 64);
  Tri t64{"", std::vector<double>(n, 1), std::vector<double>(n, 4), std::vector<double>(n, 1)};
  t64.a[0] = 0, t64.c[n - 1] = 0;
  const int s0 = int(l64.rows);
  t64.a[s0] = 1, t64.b[s0] = 1, t64.c[s0] = 1;
  t64.a[s0 + 1] = 1, t64.b[s0 + 1] = 1, t64.c[s0 + 1] = 0;
  const cpu::SplitPivoting r64 = cpu::PivotingSplit<double>(
      n, 1, t64.a.data(), t64.b.data(), t64.c.data(), d.data(), x.data(), 64);
  omp_set_num_threads(saved);
  ASSERT_TRUE(r64.ok);
  EXPECT_FALSE(r64.split);
  EXPECT_LT(r64.factorizations, l64.parts / 2);
}

// Singular to working precision (two equal rows): not OK, as the serial sweep says.
TEST(PivotingSplit, ASingularSystemIsReportedNotAnswered) {
  const int n = 1 << 16;
  std::vector<double> a(n, 1), b(n, 4), c(n, 1), d(n, 1), x(n);
  a[0] = 0, c[n - 1] = 0;
  // Rows 5000 and 5001 the same: [.. 0 2 2 0 ..].
  a[5000] = 0, b[5000] = 2, c[5000] = 2;
  a[5001] = 2, b[5001] = 2, c[5001] = 0;
  a[5002] = 0;
  const cpu::SplitPivoting r =
      cpu::PivotingSplit<double>(n, 1, a.data(), b.data(), c.data(), d.data(), x.data(), 64);
  EXPECT_FALSE(r.ok);
}

TEST(PivotingSplit, Float32AndAStridedSystem) {
  const int n = 1 << 16, stride = 3;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> a(size_t(n) * stride), b(a.size()), c(a.size()), d(a.size()),
      x(a.size(), 0.f);
  for (size_t i = 0; i < a.size(); ++i) a[i] = u(rng), b[i] = u(rng), c[i] = u(rng), d[i] = u(rng);
  const cpu::SplitPivoting r =
      cpu::PivotingSplit<float>(n, stride, a.data(), b.data(), c.data(), d.data(), x.data(), 128);
  ASSERT_TRUE(r.ok);
  // The residual of the strided system (its first column), from the original arrays.
  double rm = 0, am = 0, xm = 0, dm = 0;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = k * stride;
    double ax = double(b[i]) * x[i], row = std::abs(b[i]);
    if (k > 0) ax += double(a[i]) * x[i - stride], row += std::abs(a[i]);
    if (k + 1 < n) ax += double(c[i]) * x[i + stride], row += std::abs(c[i]);
    rm = std::max(rm, std::abs(double(d[i]) - ax));
    am = std::max(am, row), xm = std::max(xm, double(std::abs(x[i]))),
    dm = std::max(dm, double(std::abs(d[i])));
  }
  EXPECT_LE(rm / (am * xm + dm), 64 * FLT_EPSILON) << (r.split ? "split" : "serial");
}

// Through the batch solver with four threads: one system of 2^17 rows by pivoting, and by auto
// on a zero diagonal (Thomas fails, the second solve splits): both as the serial sweep answers.
TEST(PivotingSplit, TheBatchSolverSplitsFewLargeSystems) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(4);
  ASSERT_GT(cpu::SplitPivotingParts<double>(1 << 17), 0);
  const int n = 1 << 17;
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<double> u(-1, 1);
  for (bool zero_diagonal : {false, true}) {
    Tri t{"", std::vector<double>(n), std::vector<double>(n), std::vector<double>(n)};
    for (int k = 0; k < n; ++k)
      t.a[k] = u(rng), t.b[k] = zero_diagonal ? 0 : u(rng), t.c[k] = u(rng);
    if (zero_diagonal) std::fill(t.a.begin(), t.a.end(), 1.0), std::fill(t.c.begin(), t.c.end(), 1.0);
    t.a[0] = 0, t.c[n - 1] = 0;
    std::vector<double> d(n);
    for (double& v : d) v = u(rng);
    const double lb = DgtsvBackwardError(t, d);
    for (TridiagonalMethod m : {TridiagonalMethod::kPivoting, TridiagonalMethod::kAuto}) {
      std::vector<double> x(n, std::nan(""));
      SystemStatus st = SystemStatus::kDiverged;
      TridiagonalProblem<double> p{1, n, Layout::kFlat, t.a.data(), t.b.data(), t.c.data(),
                                   d.data()};
      const SolveInfo info = cpu::SolveTridiagonal(p, m, TridiagonalOutput<double>{x.data(), &st});
      ASSERT_EQ(st, SystemStatus::kOk) << MethodName(m) << " " << info.method;
      EXPECT_LE(BackwardError(t, d, x, true), 10 * std::max(lb, DBL_EPSILON))
          << MethodName(m) << " " << info.method;
      if (m == TridiagonalMethod::kAuto && zero_diagonal) {
        EXPECT_EQ(info.method, "thomas + pivoting (1 systems)");
      }
    }
  }
  omp_set_num_threads(saved);
}


// ---- The device's split (kernels/cuda/tridiagonal/pivoting_split.cu), its layout and its
// arithmetic modelled on the host, so that CI judges the method the GPU runs: parts of
// cuda's kPivotingSplitPartRows (33) rows, each interior's ends by a forward and a reversed
// elimination with dgtsv's interchanges, the interfaces' system by the same method until it
// has 64 rows or fewer (then the sweep), each interior solved again with the interfaces'
// values, kept where the backward error is within kSplitPivotingTolerance eps. (The GPU's
// fused multiply-adds differ from these products in the last bit.)
constexpr int64_t kDevicePartRows = 33, kDeviceSweepRows = 64;

TEST(PivotingSplitDevice, LayoutOfShortParts) {
  for (int64_t n = 0; n < 5000; ++n) {
    const cpu::SplitLayout l = cpu::SplitPivotingLayoutOfRows(n, kDevicePartRows);
    if (l.parts == 0) {
      EXPECT_LT(n, 4 * kDevicePartRows) << n;  // too few rows for 3 parts of an even last
      continue;
    }
    ASSERT_GE(l.parts, 3) << n;
    ASSERT_EQ(l.rows, kDevicePartRows) << n;
    const int64_t last = n - (l.parts - 1) * l.rows;
    EXPECT_EQ(last % 2, 0) << n;                // interiors of even length
    EXPECT_GE(last, l.rows + 1) << n;           // the last part no shorter than the others
    EXPECT_LT(last, 3 * l.rows) << n;           // nor much longer (one thread runs it)
  }
  EXPECT_EQ(cpu::SplitPivotingLayoutOfRows(1 << 20, 32).parts, 0);  // even rows: refused
  EXPECT_EQ(cpu::SplitPivotingLayoutOfRows(int64_t(1) << 24, 33).parts, 508399);
}

// dgtsv's elimination of rows [0, len) (a, b, c of those rows; a[0] and c[len - 1] dropped) for
// three right-hand sides, the last entries of the three solutions (the device's EliminateEnds;
// `reverse` runs it on the block reversed, giving the first entries).
template <typename T>
bool Ends(int64_t len, const T* a, const T* b, const T* c, const T* y, T w0, T vl, bool reverse,
          T out[3]) {
  auto A = [&](int64_t k) { return reverse ? c[len - 1 - k] : a[k]; };
  auto B = [&](int64_t k) { return reverse ? b[len - 1 - k] : b[k]; };
  auto C = [&](int64_t k) { return reverse ? a[len - 1 - k] : c[k]; };
  auto Y = [&](int64_t k) { return reverse ? y[len - 1 - k] : y[k]; };
  // w: w0 at the original row 0; v: vl at the original row len - 1.
  auto W = [&](int64_t k) { return (reverse ? k == len - 1 : k == 0) ? w0 : T(0); };
  auto V = [&](int64_t k) { return (reverse ? k == 0 : k == len - 1) ? vl : T(0); };
  bool ok = true;
  T d = B(0), u = C(0), r[3] = {Y(0), W(0), V(0)};
  for (int64_t k = 1; k < len; ++k) {
    const T ak = A(k), bk = B(k), ck = k + 1 < len ? C(k) : T(0);
    const T in[3] = {Y(k), W(k), V(k)};
    if (std::abs(d) >= std::abs(ak)) {
      ok = ok && d != T(0) && std::isfinite(d);
      const T f = ak / d;
      d = bk - f * u;
      u = ck;
      for (int q = 0; q < 3; ++q) r[q] = in[q] - f * r[q];
    } else {
      ok = ok && std::isfinite(ak);
      const T f = d / ak;
      d = u - f * bk;
      u = -f * ck;
      for (int q = 0; q < 3; ++q) r[q] = r[q] - f * in[q];
    }
  }
  ok = ok && d != T(0) && std::isfinite(d);
  for (int q = 0; q < 3; ++q) out[q] = r[q] / d;
  return ok;
}

// The device's levels on one system (x its answer): false where a block did not factor or the
// bottom sweep failed (the device gives the system up).
template <typename T>
bool DeviceLevels(int64_t n, const T* a, const T* b, const T* c, const T* d, T* x) {
  const cpu::SplitLayout l = cpu::SplitPivotingLayoutOfRows(n, kDevicePartRows);
  const int64_t P = l.parts, m = l.rows, R = P - 1;
  std::vector<T> e(size_t(6 * P));  // yf, wf, vf, yl, wl, vl a part
  for (int64_t k = 0; k < P; ++k) {
    const int64_t r0 = k * m, len = k + 1 < P ? m - 1 : n - r0;
    const T w0 = k > 0 ? a[r0] : T(0), vl = k + 1 < P ? c[r0 + len - 1] : T(0);
    T last[3], first[3];
    if (!Ends(len, a + r0, b + r0, c + r0, d + r0, w0, vl, false, last) ||
        !Ends(len, a + r0, b + r0, c + r0, d + r0, w0, vl, true, first))
      return false;
    for (int q = 0; q < 3; ++q) e[size_t(6 * k + q)] = first[q], e[size_t(6 * k + 3 + q)] = last[q];
  }
  std::vector<T> ra(static_cast<size_t>(R)), rb(ra.size()), rc(ra.size()), rd(ra.size()),
      z(ra.size());
  for (int64_t k = 0; k < R; ++k) {
    const int64_t i = (k + 1) * m - 1;
    const T* lo = &e[size_t(6 * k)];
    const T* hi = &e[size_t(6 * (k + 1))];
    ra[size_t(k)] = -a[i] * lo[4];
    rb[size_t(k)] = b[i] - a[i] * lo[5] - c[i] * hi[1];
    rc[size_t(k)] = -c[i] * hi[2];
    rd[size_t(k)] = d[i] - a[i] * lo[3] - c[i] * hi[0];
  }
  if (R <= kDeviceSweepRows || cpu::SplitPivotingLayoutOfRows(R, kDevicePartRows).parts == 0) {
    std::vector<T> work(static_cast<size_t>(3 * R));
    if (!cpu::PivotingStrided(R, 1, ra.data(), rb.data(), rc.data(), rd.data(), z.data(),
                              work.data()))
      return false;
  } else if (!DeviceLevels(R, ra.data(), rb.data(), rc.data(), rd.data(), z.data())) {
    return false;
  }
  for (int64_t k = 0; k < P; ++k) {
    const int64_t r0 = k * m, len = k + 1 < P ? m - 1 : n - r0;
    std::vector<T> aa(a + r0, a + r0 + len), rhs(d + r0, d + r0 + len), work(size_t(3 * len));
    if (k > 0) rhs[0] -= a[r0] * z[size_t(k - 1)];
    if (k + 1 < P) {
      rhs[size_t(len - 1)] -= c[r0 + len - 1] * z[size_t(k)];
      x[r0 + len] = z[size_t(k)];
    }
    std::vector<T> cc(c + r0, c + r0 + len);
    cc[size_t(len - 1)] = T(0);
    aa[0] = T(0);
    if (!cpu::PivotingStrided(len, 1, aa.data(), b + r0, cc.data(), rhs.data(), x + r0,
                              work.data()))
      return false;
  }
  return true;
}

// The device's answer: the levels, kept where the backward error is within tolerance, else
// up to two steps of iterative refinement (the residual carried exactly, rounded to T; the
// correction by the levels again), each followed by the check. Returns the backward error of what the device
// keeps (infinite where it gives the system up) and whether it refined.
template <typename T>
double DeviceSplit(const Tri& t, int64_t n, const T* a, const T* b, const T* c, const T* d,
                   T* x, bool* refined) {
  const double tol = cpu::kSplitPivotingTolerance * double(std::numeric_limits<T>::epsilon());
  const std::vector<double> dd(d, d + n);
  auto be = [&](bool ok) {
    return BackwardError(t, dd, std::vector<double>(x, x + n), ok);
  };
  *refined = false;
  if (!DeviceLevels<T>(n, a, b, c, d, x)) return INFINITY;
  double e = be(true);
  for (int step = 0; step < 2 && !(e <= tol); ++step) {  // (the device's kRefineSteps)
    *refined = true;
    std::vector<T> r(static_cast<size_t>(n)), dx(static_cast<size_t>(n));
    for (int64_t k = 0; k < n; ++k) {
      long double v = (long double)d[k] - (long double)b[k] * x[k];
      if (k > 0) v -= (long double)a[k] * x[k - 1];
      if (k + 1 < n) v -= (long double)c[k] * x[k + 1];
      r[size_t(k)] = T(v);
    }
    if (!DeviceLevels<T>(n, a, b, c, r.data(), dx.data())) return INFINITY;
    for (int64_t k = 0; k < n; ++k) x[k] += dx[size_t(k)];
    e = be(true);
  }
  return e <= tol ? e : INFINITY;
}

// The twenty matrices at 2^14 and 2^16 rows, float64, and random and zero-diagonal float32: the
// device's method answers the random ones (after a step of refinement: the parts alone leave
// 3e-15 and 9e-14) and the zero diagonal; every answer it keeps is within 10x of max(dgtsv's,
// eps).
TEST(PivotingSplitDevice, TheDeviceMethodOnTheTwentyMatrices) {
  for (int n : {1 << 14, 1 << 16}) {
    const std::vector<Tri> suite = Suite(n, 2021 + n);
    std::mt19937_64 rng(13 + n);
    std::uniform_real_distribution<double> u(-1, 1);
    int answered = 0;
    for (size_t i = 0; i < suite.size(); ++i) {
      const Tri& t = suite[i];
      std::vector<double> d(static_cast<size_t>(n)), x(static_cast<size_t>(n));
      for (double& v : d) v = u(rng);
      bool refined = false;
      const double be =
          DeviceSplit<double>(t, n, t.a.data(), t.b.data(), t.c.data(), d.data(), x.data(),
                              &refined);
      const bool kept = std::isfinite(be);
      answered += kept;
      const double lb = DgtsvBackwardError(t, d);
      std::printf("n %d #%zu %-36s device split %s%s, backward error %.1e (dgtsv %.1e)\n", n,
                  i + 1, t.name.c_str(), kept ? "kept" : "given up",
                  refined ? " (refined)" : "", be, lb);
      if (kept) {
        EXPECT_LE(be, 10 * std::max(lb, DBL_EPSILON)) << t.name;
      }
      if (t.name.rfind("tridiag(1, 0, 1)", 0) == 0 || i == 0 || i == 4) {
        EXPECT_TRUE(kept) << t.name << ": " << be;
      }
    }
    EXPECT_GE(answered, 17) << n;
  }
  for (bool zero : {false, true}) {
    const int n = 1 << 16;
    std::mt19937_64 rng(17);
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> a(n), b(n), c(n), d(n), x(n);
    for (int k = 0; k < n; ++k)
      a[k] = zero ? 1.f : u(rng), b[k] = zero ? 0.f : u(rng), c[k] = zero ? 1.f : u(rng),
      d[k] = u(rng);
    Tri t{"", std::vector<double>(a.begin(), a.end()), std::vector<double>(b.begin(), b.end()),
          std::vector<double>(c.begin(), c.end())};
    t.a[0] = 0, t.c[n - 1] = 0;
    bool refined = false;
    const double be =
        DeviceSplit<float>(t, n, a.data(), b.data(), c.data(), d.data(), x.data(), &refined);
    std::printf("float32 %s: device split backward error %.1e%s\n",
                zero ? "zero diagonal" : "random", be, refined ? " (refined)" : "");
    EXPECT_TRUE(std::isfinite(be)) << (zero ? "zero diagonal" : "random");
  }
}

}  // namespace
}  // namespace trisolve
