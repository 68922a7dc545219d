// The CUDA backend's certified partial pivoting (the fast kernel, pivoting.cu's sweep on every
// system not diagonally dominant: docs/kernels/tridiagonal.md) and auto's second solve,
// against the CPU reference and LAPACK: the 20 matrices of the stability suite in a batch, both
// layouts and precisions; zero diagonals (never SINGULAR); truly singular systems (SINGULAR,
// x = 0, per system); auto on batches mixing dominant and zero-diagonal systems. Skips, saying
// so, where no CUDA device is present; run on the lent GPU.
#include <lapacke.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_test_util.h"
#include "gtest/gtest.h"
#include "stability_matrices.h"
#include "tridiagonal/tridiagonal.h"
#include "trisolve/backend.h"
#include "trisolve/reference/tridiagonal.h"
#include "trisolve/tridiagonal.h"

namespace trisolve {
namespace {

using ::trisolve::testing::Cuda;
using namespace ::trisolve::stability;  // the suite, the reference, the error measures

template <typename T>
constexpr double Eps() {
  return std::is_same_v<T, float> ? double(FLT_EPSILON) : DBL_EPSILON;
}

// A batch of systems in `layout`, filled system by system.
template <typename T>
struct Batch {
  int64_t batch, n;
  Layout layout;
  std::vector<T> a, b, c, d;
  Batch(int64_t batch_, int64_t n_, Layout l)
      : batch(batch_), n(n_), layout(l), a(size_t(batch_ * n_)), b(a.size()), c(a.size()),
        d(a.size()) {}
  size_t At(int64_t s, int64_t k) const { return size_t(ElementIndex(layout, batch, n, s, k)); }
  void Set(int64_t s, const Tri& t, const std::vector<double>& rhs) {
    for (int64_t k = 0; k < n; ++k) {
      a[At(s, k)] = T(t.a[size_t(k)]);
      b[At(s, k)] = T(t.b[size_t(k)]);
      c[At(s, k)] = T(t.c[size_t(k)]);
      d[At(s, k)] = T(rhs[size_t(k)]);
    }
  }
  // System s as it is stored (rounded to T), and its right-hand side, in double.
  Tri Get(int64_t s, std::vector<double>* rhs) const {
    Tri t{"", std::vector<double>(size_t(n)), std::vector<double>(size_t(n)),
          std::vector<double>(size_t(n))};
    rhs->resize(size_t(n));
    for (int64_t k = 0; k < n; ++k) {
      t.a[size_t(k)] = k > 0 ? double(a[At(s, k)]) : 0.0;
      t.b[size_t(k)] = double(b[At(s, k)]);
      t.c[size_t(k)] = k + 1 < n ? double(c[At(s, k)]) : 0.0;
      (*rhs)[size_t(k)] = double(d[At(s, k)]);
    }
    return t;
  }
  std::vector<double> X(const std::vector<T>& x, int64_t s) const {
    std::vector<double> r(static_cast<size_t>(n));
    for (int64_t k = 0; k < n; ++k) r[size_t(k)] = double(x[At(s, k)]);
    return r;
  }
  TridiagonalProblem<T> P() const {
    return {batch, n, layout, a.data(), b.data(), c.data(), d.data()};
  }
  // Systems whose Thomas elimination, in T on the host, leaves some |c'| clearly over 1 (or
  // meets a zero pivot): not diagonally dominant, so not certified by any fast kernel (the
  // dominance test, or thomas-window's |c'| <= 1), and solved again by the certified
  // `pivoting` (and `auto`) at least.
  int64_t NotCertified() const {
    int64_t count = 0;
    for (int64_t s = 0; s < batch; ++s) {
      double cp = 0;
      for (int64_t k = 0; k < n; ++k) {
        const T ak = k > 0 ? a[At(s, k)] : T(0), ck = k + 1 < n ? c[At(s, k)] : T(0);
        const T den = T(b[At(s, k)] - ak * T(cp));
        cp = den == T(0) ? 2.0 : double(T(ck / den));
        if (!(std::abs(cp) <= 1 + 1e-3)) {
          ++count;
          break;
        }
      }
    }
    return count;
  }
};

// The systems solved again: the counts of " + pivoting-split (k ...)" (the device's split) and
// " + pivoting (k ...)" (the sweep, on the device or the host) summed.
int64_t Resolved(const std::string& method) {
  int64_t total = 0;
  for (const std::string key : {" + pivoting (", " + pivoting-split ("}) {
    const size_t at = method.find(key);
    if (at != std::string::npos) total += std::stoll(method.substr(at + key.size()));
  }
  return total;
}

// The backward error a GPU answer is held to against the CPU reference's sweep (cb): within 4x
// of max(cb, eps) where the device's sweep answered (the same elimination, other roundings);
// where pivoting-split answered, its own check's bound, cpu::kSplitPivotingTolerance eps, the
// CPU split's (an elimination inside parts of 32 rows, not the sweep's).
double Bound(double cb, double eps) {
  return std::max(4 * std::max(cb, eps), cpu::kSplitPivotingTolerance * eps);
}

struct Solved {
  std::vector<double> xs;  // all of x, in double
  std::vector<SystemStatus> status;
  std::string method;
};

template <typename T>
Solved SolveGpu(const Batch<T>& bt, TridiagonalMethod m) {
  std::vector<T> x(bt.a.size(), T(std::nan("")));
  std::vector<SystemStatus> st(size_t(bt.batch), SystemStatus::kDiverged);
  auto info = Cuda()->Solve(bt.P(), m, TridiagonalOutput<T>{x.data(), st.data()}, SolveControl{});
  EXPECT_TRUE(info.ok()) << info.status();
  Solved r;
  r.xs.assign(x.begin(), x.end());
  r.status = st;
  if (info.ok()) r.method = info->method;
  return r;
}

template <typename T>
Solved SolveCpu(const Batch<T>& bt, TridiagonalMethod m) {
  std::vector<T> x(bt.a.size());
  std::vector<SystemStatus> st(size_t(bt.batch));
  const SolveInfo info =
      cpu::SolveTridiagonal(bt.P(), m, TridiagonalOutput<T>{x.data(), st.data()});
  return {std::vector<double>(x.begin(), x.end()), st, info.method};
}

// LAPACK's gtsv (dgtsv or sgtsv) on system s as stored: x in double, whether it solved.
template <typename T>
bool Gtsv(const Batch<T>& bt, int64_t s, std::vector<double>* xo) {
  const int n = int(bt.n);
  std::vector<T> dl(static_cast<size_t>(std::max(n - 1, 1))), dd(static_cast<size_t>(n)),
      du(dl.size()), x(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) {
    dd[size_t(k)] = bt.b[bt.At(s, k)];
    x[size_t(k)] = bt.d[bt.At(s, k)];
    if (k + 1 < n) {
      du[size_t(k)] = bt.c[bt.At(s, k)];
      dl[size_t(k)] = bt.a[bt.At(s, k + 1)];
    }
  }
  lapack_int info;
  if constexpr (std::is_same_v<T, float>)
    info = LAPACKE_sgtsv(LAPACK_COL_MAJOR, n, 1, dl.data(), dd.data(), du.data(), x.data(), n);
  else
    info = LAPACKE_dgtsv(LAPACK_COL_MAJOR, n, 1, dl.data(), dd.data(), du.data(), x.data(), n);
  xo->assign(x.begin(), x.end());
  // (info 0 with an x that overflowed -- float32's zero diagonal at n = 2^14 -- is no answer:
  // the reference and the GPU call that SINGULAR)
  return info == 0 && std::all_of(x.begin(), x.end(), [](T v) { return std::isfinite(v); });
}

template <typename T>
std::vector<double> XOf(const Batch<T>& bt, const Solved& r, int64_t s) {
  std::vector<double> x(size_t(bt.n));
  for (int64_t k = 0; k < bt.n; ++k) x[size_t(k)] = r.xs[bt.At(s, k)];
  return x;
}

std::string Sci(double v, bool ok = true) {
  if (!ok) return "SINGULAR";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1e", v);
  return buf;
}

// The 20 matrices, each twice in a batch of 40 (two right-hand sides; 40 >= the device's
// threshold, so the kernel runs), solved by `pivoting` on the GPU: every system OK where LAPACK
// solves it, its backward error within 10x of LAPACK's (floor eps) and within 4x of the CPU
// reference's (the same elimination: the two differ by rounding, fused multiply-adds on the
// GPU; or, where pivoting-split answered, within its check's bound: Bound); the same status
// as the CPU reference everywhere. Prints the table docs/stability.md
// quotes.
template <typename T>
void TwentyMatrices(int n, Layout layout) {
  const std::vector<Tri> suite = Suite(n, 2021 + n);
  ASSERT_EQ(suite.size(), 20u);
  const int64_t batch = 40;
  Batch<T> bt(batch, n, layout);
  std::mt19937_64 rng(7 + n);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int64_t s = 0; s < batch; ++s) {
    std::vector<double> rhs(static_cast<size_t>(n));
    for (double& v : rhs) v = u(rng);
    bt.Set(s, suite[size_t(s % 20)], rhs);
  }
  // (certified: the systems not certified by the sweep, the others the fast kernel's answer)
  const Solved g = SolveGpu(bt, TridiagonalMethod::kPivoting);
  EXPECT_GE(Resolved(g.method), bt.NotCertified()) << g.method;
  const Solved c = SolveCpu(bt, TridiagonalMethod::kPivoting);
  const char* type = std::is_same_v<T, float> ? "float32" : "float64";
  std::printf("\n#### GPU pivoting, %s, %s, n = %d (backward error; forward error)\n\n"
              "| # | matrix | GPU | CPU pivoting | %s | GPU fwd | %s fwd |\n"
              "|---|---|---|---|---|---|---|\n",
              type, layout == Layout::kFlat ? "flat" : "interleaved", n,
              std::is_same_v<T, float> ? "sgtsv" : "dgtsv",
              std::is_same_v<T, float> ? "sgtsv" : "dgtsv");
  double worst_ratio = 0;
  for (int64_t s = 0; s < batch; ++s) {
    std::vector<double> rhs, xl;
    const Tri t = bt.Get(s, &rhs);
    const bool lok = Gtsv(bt, s, &xl);
    const bool gok = g.status[size_t(s)] == SystemStatus::kOk;
    const bool cok = c.status[size_t(s)] == SystemStatus::kOk;
    const double gb = BackwardError(t, rhs, XOf(bt, g, s), gok);
    const double cb = BackwardError(t, rhs, XOf(bt, c, s), cok);
    const double lb = BackwardError(t, rhs, xl, lok);
    const int idx = int(s % 20);
    if (!gok) {  // x = 0 exactly where SINGULAR
      for (int64_t k = 0; k < n; ++k) EXPECT_EQ(g.xs[bt.At(s, k)], 0.0) << idx + 1;
    }
    if (!lok) {
      // Singular to working precision (float32's randsvd 1e15): LAPACK met an exactly zero
      // pivot; the GPU's fused multiply-adds may leave that pivot a rounding error instead.
      // Either SINGULAR, or an answer that is backward stable.
      EXPECT_TRUE(!gok || gb <= 10 * Eps<T>()) << "matrix " << idx + 1 << ": " << gb;
    } else {
      EXPECT_EQ(g.status[size_t(s)], c.status[size_t(s)]) << "matrix " << idx + 1;
      EXPECT_TRUE(gok) << "matrix " << idx + 1 << " SINGULAR on the GPU, solved by LAPACK";
      const double bound = 10 * std::max(lb, Eps<T>());
      EXPECT_TRUE(gb <= bound) << "matrix " << idx + 1 << ": " << gb << " against LAPACK "
                               << lb;
      worst_ratio = std::max(worst_ratio, gb / std::max(lb, Eps<T>()));
    }
    if (cok) {
      EXPECT_TRUE(gb <= Bound(cb, Eps<T>()))
          << "matrix " << idx + 1 << ": " << gb << " against the CPU's " << cb;
    }
    if (s < 20) {
      // The forward error against the high-accuracy reference of the system as stored.
      const std::vector<Ld> ref = Reference(t, rhs);
      std::printf("| %d | %s | %s | %s | %s | %s | %s |\n", idx + 1, suite[size_t(idx)].name.c_str(),
                  Sci(gb, gok).c_str(), Sci(cb, cok).c_str(), Sci(lb, lok).c_str(),
                  Sci(ForwardError(XOf(bt, g, s), gok, ref), gok).c_str(),
                  Sci(ForwardError(xl, lok, ref), lok).c_str());
    }
  }
  std::printf("\nworst GPU backward error / max(LAPACK's, eps): %.2f\n", worst_ratio);
}

TEST(CudaPivoting, TwentyMatricesFloat64) {
  REQUIRE_GPU();
  for (int n : {512, 1 << 14})
    for (Layout l : {Layout::kFlat, Layout::kInterleaved}) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " layout " << int(l));
      TwentyMatrices<double>(n, l);
    }
}

TEST(CudaPivoting, TwentyMatricesFloat32) {
  REQUIRE_GPU();
  for (int n : {512, 1 << 14})
    for (Layout l : {Layout::kFlat, Layout::kInterleaved}) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " layout " << int(l));
      TwentyMatrices<float>(n, l);
    }
}

// Random systems that are not diagonally dominant at every n the kernel's blocks of 8 rows
// split differently (n below, at and past a block, odd and even), batches not a multiple of
// the warp: every system OK, its backward error within 4x of the CPU reference's (or, where
// pivoting-split answered, within its tolerance: Bound).
template <typename T>
void EveryN(Layout layout) {
  for (int64_t n : {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1000, 1025}) {
    const int64_t batch = 45;
    SCOPED_TRACE(::testing::Message() << "n " << n << " layout " << int(layout));
    Batch<T> bt(batch, n, layout);
    std::mt19937_64 rng(uint64_t(n) * 31 + uint64_t(layout));
    std::uniform_real_distribution<double> u(-1, 1);
    for (size_t e = 0; e < bt.a.size(); ++e)
      bt.a[e] = T(u(rng)), bt.b[e] = T(u(rng)), bt.c[e] = T(u(rng)), bt.d[e] = T(u(rng));
    const Solved g = SolveGpu(bt, TridiagonalMethod::kPivoting);
    const Solved c = SolveCpu(bt, TridiagonalMethod::kPivoting);
    EXPECT_GE(Resolved(g.method), bt.NotCertified()) << g.method;
    for (int64_t s = 0; s < batch; ++s) {
      ASSERT_EQ(c.status[size_t(s)], SystemStatus::kOk) << s;  // (random: nonsingular)
      EXPECT_EQ(g.status[size_t(s)], SystemStatus::kOk) << s;
      std::vector<double> rhs;
      const Tri t = bt.Get(s, &rhs);
      const double gb = BackwardError(t, rhs, XOf(bt, g, s), true);
      const double cb = BackwardError(t, rhs, XOf(bt, c, s), true);
      EXPECT_TRUE(gb <= Bound(cb, Eps<T>())) << s << ": " << gb << " against " << cb;
    }
  }
}

TEST(CudaPivoting, EveryNMatchesTheReference) {
  REQUIRE_GPU();
  for (Layout l : {Layout::kFlat, Layout::kInterleaved}) {
    EveryN<double>(l);
    EveryN<float>(l);
  }
}

// tridiag(1, 0, 1) with n even: condition 41 or so, every pivot of Thomas zero; partial
// pivoting solves it exactly (x = 1: d = a + c).
template <typename T>
void ZeroDiagonal(Layout layout, TridiagonalMethod m) {
  const int64_t n = 1000, batch = 64;
  Batch<T> bt(batch, n, layout);
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t k = 0; k < n; ++k) {
      bt.a[bt.At(s, k)] = T(1);
      bt.b[bt.At(s, k)] = T(0);
      bt.c[bt.At(s, k)] = T(1);
      bt.d[bt.At(s, k)] = T((k > 0 ? 1 : 0) + (k + 1 < n ? 1 : 0));
    }
  const Solved g = SolveGpu(bt, m);
  for (int64_t s = 0; s < batch; ++s) {
    EXPECT_EQ(g.status[size_t(s)], SystemStatus::kOk) << s;
    for (int64_t k = 0; k < n; ++k)
      ASSERT_EQ(g.xs[bt.At(s, k)], 1.0) << "system " << s << " row " << k;
  }
  // (both certified: no system here is diagonally dominant; flat: by pivoting-split)
  EXPECT_EQ(Resolved(g.method), 64) << g.method;
}

TEST(CudaPivoting, ZeroDiagonalIsNeverSingular) {
  REQUIRE_GPU();
  for (Layout l : {Layout::kFlat, Layout::kInterleaved})
    for (TridiagonalMethod m : {TridiagonalMethod::kPivoting, TridiagonalMethod::kAuto}) {
      SCOPED_TRACE(::testing::Message() << "layout " << int(l) << " method " << int(m));
      ZeroDiagonal<double>(l, m);
      ZeroDiagonal<float>(l, m);
    }
}

// Systems singular to working precision, one in a batch of otherwise random dominant ones:
// a zero row (system 5) and tridiag(1, 0, 1) of odd n (system 40): SINGULAR, x = 0 there;
// every other system OK and answered as the CPU answers it.
template <typename T>
void TrulySingular(Layout layout, TridiagonalMethod m) {
  const int64_t n = 257, batch = 64;
  Batch<T> bt(batch, n, layout);
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t k = 0; k < n; ++k) {
      const double a = u(rng), c = u(rng);
      bt.a[bt.At(s, k)] = T(a);
      bt.c[bt.At(s, k)] = T(c);
      bt.b[bt.At(s, k)] = T(std::abs(a) + std::abs(c) + 0.5);
      bt.d[bt.At(s, k)] = T(u(rng));
    }
  for (int64_t k = 0; k < n; ++k) {
    if (k == 100) bt.a[bt.At(5, k)] = bt.b[bt.At(5, k)] = bt.c[bt.At(5, k)] = T(0);
    bt.a[bt.At(40, k)] = T(1);
    bt.b[bt.At(40, k)] = T(0);
    bt.c[bt.At(40, k)] = T(1);
  }
  const Solved g = SolveGpu(bt, m);
  for (int64_t s = 0; s < batch; ++s) {
    const bool singular = s == 5 || s == 40;
    EXPECT_EQ(g.status[size_t(s)], singular ? SystemStatus::kSingular : SystemStatus::kOk) << s;
    if (singular) {
      for (int64_t k = 0; k < n; ++k) ASSERT_EQ(g.xs[bt.At(s, k)], 0.0) << s << " " << k;
    } else {
      std::vector<double> rhs;
      const Tri t = bt.Get(s, &rhs);
      EXPECT_TRUE(BackwardError(t, rhs, XOf(bt, g, s), true) <= 16 * Eps<T>()) << s;
    }
  }
  if (m == TridiagonalMethod::kAuto) {  // the two flagged, tried again by pivoting, still singular
    EXPECT_NE(g.method.find(" + pivoting (2 systems)"), std::string::npos) << g.method;
  }
}

TEST(CudaPivoting, TrulySingularSystemsAreReportedPerSystem) {
  REQUIRE_GPU();
  for (Layout l : {Layout::kFlat, Layout::kInterleaved})
    for (TridiagonalMethod m : {TridiagonalMethod::kPivoting, TridiagonalMethod::kAuto}) {
      SCOPED_TRACE(::testing::Message() << "layout " << int(l) << " method " << int(m));
      TrulySingular<double>(l, m);
      TrulySingular<float>(l, m);
    }
}

// auto on a batch mixing dominant systems and zero-diagonal ones (every 8th): each shape takes
// a different fast kernel (partitioned one-block, streamed, cluster, thomas-window, windows);
// every system comes back OK, the zero-diagonal ones solved again by pivoting on the device
// (the method says how many), and x is the CPU auto's to rounding.
template <typename T>
void AutoMixed(int64_t n, int64_t batch, Layout layout) {
  constexpr bool f32 = std::is_same_v<T, float>;
  SCOPED_TRACE(::testing::Message() << "n " << n << " batch " << batch << " layout "
                                    << int(layout) << " float32 " << f32);
  Batch<T> bt(batch, n, layout);
  std::mt19937_64 rng(uint64_t(n) + uint64_t(batch));
  std::uniform_real_distribution<double> u(-1, 1);
  int64_t zero = 0;
  for (int64_t s = 0; s < batch; ++s) {
    const bool z = s % 8 == 3;
    zero += z;
    for (int64_t k = 0; k < n; ++k) {
      const double a = u(rng), c = u(rng);
      bt.a[bt.At(s, k)] = T(z ? 1 : a);
      bt.c[bt.At(s, k)] = T(z ? 1 : c);
      bt.b[bt.At(s, k)] = T(z ? 0 : (std::abs(a) + std::abs(c) + 0.5) * (u(rng) < 0 ? -1 : 1));
      bt.d[bt.At(s, k)] = T(u(rng));
    }
  }
  const Solved g = SolveGpu(bt, TridiagonalMethod::kAuto);
  EXPECT_EQ(Resolved(g.method), zero) << g.method;
  EXPECT_EQ(g.method.find("host"), std::string::npos) << g.method;
  std::printf("auto, n %lld batch %lld %s %s: %s\n", (long long)n, (long long)batch,
              layout == Layout::kFlat ? "flat" : "interleaved",
              std::is_same_v<T, float> ? "float32" : "float64", g.method.c_str());
  for (int64_t s = 0; s < batch; ++s) {
    EXPECT_EQ(g.status[size_t(s)], SystemStatus::kOk) << s;
    std::vector<double> rhs;
    const Tri t = bt.Get(s, &rhs);
    // Zero-diagonal systems of odd n are singular; every n here is even.
    EXPECT_TRUE(BackwardError(t, rhs, XOf(bt, g, s), g.status[size_t(s)] == SystemStatus::kOk) <=
                16 * Eps<T>())
        << s;
  }
}

TEST(CudaPivoting, AutoSolvesFlaggedSystemsAgainOnTheDevice) {
  REQUIRE_GPU();
  for (Layout l : {Layout::kFlat, Layout::kInterleaved}) {
    for (int64_t n : {64, 512, 2048, 8192}) {
      AutoMixed<double>(n, 64, l);
      AutoMixed<float>(n, 64, l);
    }
  }
  AutoMixed<double>(1 << 14, 32, Layout::kFlat);
}

// Below a warp's worth of systems `pivoting` runs auto's fast kernel on the device and solves
// again on the host the systems it flagged (here the two not dominant of four), and says so.
TEST(CudaPivoting, SmallBatchesPivotFlaggedSystemsOnTheHost) {
  REQUIRE_GPU();
  Batch<double> bt(4, 10, Layout::kFlat);
  for (size_t e = 0; e < bt.a.size(); ++e) {
    const bool zero = e / 10 % 2 == 0;  // systems 0 and 2: zero diagonal (n even: nonsingular)
    bt.a[e] = 1, bt.b[e] = zero ? 0 : 4, bt.c[e] = 1, bt.d[e] = 1;
  }
  const Solved g = SolveGpu(bt, TridiagonalMethod::kPivoting);
  EXPECT_NE(g.method.find(" + pivoting (2 systems)"), std::string::npos) << g.method;
  for (SystemStatus s : g.status) EXPECT_EQ(s, SystemStatus::kOk);
  for (int64_t s = 0; s < bt.batch; ++s) {
    std::vector<double> rhs;
    const Tri t = bt.Get(s, &rhs);
    EXPECT_LE(BackwardError(t, rhs, XOf(bt, g, s), true), 4 * DBL_EPSILON) << s;
  }
}

}  // namespace
}  // namespace trisolve
