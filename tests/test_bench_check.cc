// The check `trisolve bench` applies to every answer: it must agree with the plain definition of
// the backward error, and never let a wrong, NaN or infinite answer through.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "trisolve/bench.h"
#include "trisolve/examples.h"
#include "trisolve/reference/block_tridiagonal.h"
#include "trisolve/reference/dense.h"

namespace trisolve {
namespace {

struct Batch {
  int64_t batch, n;
  std::vector<double> a, b, c, d, x, norm;
};

Batch Make(int64_t batch, int64_t n, uint64_t seed) {
  Batch m{batch, n, {}, {}, {}, {}, {}, {}};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  const size_t e = size_t(batch * n);
  for (auto* v : {&m.a, &m.b, &m.c, &m.d, &m.x}) v->resize(e);
  for (size_t i = 0; i < e; ++i) {
    m.a[i] = u(rng);
    m.b[i] = 4 + u(rng);
    m.c[i] = u(rng);
    m.d[i] = u(rng);
  }
  m.norm.assign(size_t(batch), 0);
  for (int64_t s = 0; s < batch; ++s) {
    // x by Thomas in long double: an answer as right as float64 can hold.
    std::vector<long double> cp(static_cast<size_t>(n)), y(static_cast<size_t>(n));
    const int64_t o = s * n;
    long double beta = m.b[size_t(o)];
    cp[0] = m.c[size_t(o)] / beta;
    y[0] = m.d[size_t(o)] / beta;
    for (int64_t i = 1; i < n; ++i) {
      beta = m.b[size_t(o + i)] - m.a[size_t(o + i)] * cp[size_t(i - 1)];
      cp[size_t(i)] = m.c[size_t(o + i)] / beta;
      y[size_t(i)] = (m.d[size_t(o + i)] - m.a[size_t(o + i)] * y[size_t(i - 1)]) / beta;
    }
    for (int64_t i = n - 2; i >= 0; --i) y[size_t(i)] -= cp[size_t(i)] * y[size_t(i + 1)];
    for (int64_t i = 0; i < n; ++i) {
      m.x[size_t(o + i)] = double(y[size_t(i)]);
      const double row = std::abs(m.b[size_t(o + i)]) + (i > 0 ? std::abs(m.a[size_t(o + i)]) : 0) +
                         (i + 1 < n ? std::abs(m.c[size_t(o + i)]) : 0);
      m.norm[size_t(s)] = std::max(m.norm[size_t(s)], row);
    }
  }
  return m;
}

// The definition, row by row, in long double.
double Plain(const Batch& m) {
  long double worst = 0;
  for (int64_t s = 0; s < m.batch; ++s) {
    long double r = 0, an = 0, xn = 0, dn = 0;
    for (int64_t i = 0; i < m.n; ++i) {
      const size_t k = size_t(s * m.n + i);
      if (!std::isfinite(m.x[k])) return INFINITY;
      long double ax = (long double)m.b[k] * m.x[k], row = std::abs(m.b[k]);
      if (i > 0) ax += (long double)m.a[k] * m.x[k - 1], row += std::abs(m.a[k]);
      if (i + 1 < m.n) ax += (long double)m.c[k] * m.x[k + 1], row += std::abs(m.c[k]);
      r = std::max(r, std::abs(m.d[k] - ax));
      an = std::max(an, row);
      xn = std::max<long double>(xn, std::abs(m.x[k]));
      dn = std::max<long double>(dn, std::abs(m.d[k]));
    }
    worst = std::max(worst, r / (an * xn + dn));
  }
  return double(worst);
}

double Check(const Batch& m) {
  return TridiagonalBackwardError(m.a.data(), m.b.data(), m.c.data(), m.norm.data(), m.d.data(),
                                  m.x.data(), m.batch, m.n);
}

TEST(BenchCheck, AgreesWithTheDefinition) {
  for (int64_t n : {2, 3, 17, 64, 1024})
    for (int64_t batch : {1, 5}) {
      Batch m = Make(batch, n, uint64_t(n * 31 + batch));
      EXPECT_LE(Check(m), 1e-15) << n << " x " << batch;
      // A wrong answer in any row of any system: the first, the last, one in the middle.
      for (int64_t s : {int64_t{0}, batch - 1})
        for (int64_t i : {int64_t{0}, n / 2, n - 1}) {
          Batch w = m;
          w.x[size_t(s * n + i)] += 1e-6;
          const double plain = Plain(w);
          EXPECT_GT(plain, 1e-8);
          // The check rounds in double, the definition here in long double.
          EXPECT_NEAR(Check(w), plain, 1e-8 * plain) << n << " x " << batch << " row " << i;
        }
    }
}

TEST(BenchCheck, NaNAndInfinityAreInfinitelyWrong) {
  const double bad[] = {std::numeric_limits<double>::quiet_NaN(),
                        std::numeric_limits<double>::infinity(),
                        -std::numeric_limits<double>::infinity()};
  for (int64_t n : {2, 5, 1024})
    for (double v : bad)
      for (int64_t i : {int64_t{0}, n / 2, n - 1}) {
        Batch m = Make(3, n, 7);
        m.x[size_t(2 * n + i)] = v;
        EXPECT_EQ(Check(m), INFINITY) << "n " << n << " row " << i << " value " << v;
      }
}

TEST(BenchCheck, AnotherRequestsAnswerIsWrong) {
  // The answer to another right-hand side (a misrouted answer) is far from this one's.
  Batch m = Make(4, 256, 11), other = Make(4, 256, 12);
  m.x = other.x;
  other.a = m.a, other.b = m.b, other.c = m.c;
  EXPECT_GT(Check(m), 1e-3);
}

TEST(BenchCheck, TheComparisonWithTheLocalAnswerMissesNothing) {
  Batch m = Make(5, 300, 21);
  const std::vector<double> expected = m.x;
  EXPECT_EQ(MaxRelativeDifference(m.x.data(), expected.data(), 5, 300), 0);
  for (int64_t s : {0, 2, 4})
    for (int64_t i : {0, 150, 299}) {
      std::vector<double> x = expected;
      x[size_t(s * 300 + i)] *= 1 + 1e-10;
      const double e = MaxRelativeDifference(x.data(), expected.data(), 5, 300);
      EXPECT_GT(e, 1e-12) << s << " " << i;
      EXPECT_LT(e, 1e-9) << s << " " << i;
      for (double v : {std::numeric_limits<double>::quiet_NaN(),
                       std::numeric_limits<double>::infinity()}) {
        x[size_t(s * 300 + i)] = v;
        EXPECT_EQ(MaxRelativeDifference(x.data(), expected.data(), 5, 300), INFINITY);
      }
    }
  // A system whose answer is small is judged against its own scale, not the batch's.
  std::vector<double> x = expected, e2 = expected;
  for (int64_t i = 0; i < 300; ++i) e2[size_t(300 + i)] *= 1e-6, x[size_t(300 + i)] *= 1e-6;
  x[size_t(300 + 7)] += 1e-12;
  EXPECT_GT(MaxRelativeDifference(x.data(), e2.data(), 5, 300), 1e-9);
}


// ---- the block family's check ----------------------------------------------------------------

// A grid's block-tridiagonal system, random coefficients (not symmetric, so that a coupling
// read from the wrong side shows), garbage in the couplings A does not have, and its answer by
// the CPU reference to 1e-13.
struct Grid {
  int64_t N, M;
  std::vector<double> aC, cC, bC, cA, cB, f, y;
  double norm;
  const double* arr(int i) const {
    const std::vector<double>* v[] = {&aC, &cC, &bC, &cA, &cB};
    return v[i]->data();
  }
};

Grid MakeGrid(int64_t N, int64_t M, uint64_t seed) {
  Grid g{N, M, {}, {}, {}, {}, {}, {}, {}, 0};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  for (auto* v : {&g.aC, &g.cC, &g.bC, &g.cA, &g.cB, &g.f}) {
    v->resize(size_t(N * M));
    for (double& x : *v) x = u(rng);
  }
  for (double& x : g.cC) x += 6;  // dominant: the line iterations converge
  g.norm = BlockTridiagonalNorm(N, M, g.aC.data(), g.cC.data(), g.bC.data(), g.cA.data(),
                                g.cB.data());
  BlockTridiagonalProblem<double> p;
  p.N = N, p.M = M, p.aC = g.aC.data(), p.cC = g.cC.data(), p.bC = g.bC.data();
  p.cA = g.cA.data(), p.cB = g.cB.data(), p.f = g.f.data();
  g.y.resize(size_t(N * M));
  SystemStatus st = SystemStatus::kOk;
  BlockOptions o;
  o.tol = 1e-13;
  auto info = cpu::SolveBlockTridiagonal<double>(p, BlockMethod::kGaussSeidel, o, {g.y.data(), &st});
  EXPECT_TRUE(info.ok() && st == SystemStatus::kOk);
  return g;
}

// ||f - A y||_2 / ||f||_2 by the definition, in long double.
double PlainBlock(const Grid& g, const std::vector<double>& y) {
  long double rr = 0, ff = 0;
  for (int64_t i = 0; i < g.N; ++i)
    for (int64_t k = 0; k < g.M; ++k) {
      const size_t e = size_t(i * g.M + k);
      long double ax = (long double)g.cC[e] * y[e];
      if (k > 0) ax += (long double)g.aC[e] * y[e - 1];
      if (k + 1 < g.M) ax += (long double)g.bC[e] * y[e + 1];
      if (i > 0) ax += (long double)g.cA[e] * y[e - size_t(g.M)];
      if (i + 1 < g.N) ax += (long double)g.cB[e] * y[e + size_t(g.M)];
      rr += (g.f[e] - ax) * (g.f[e] - ax);
      ff += (long double)g.f[e] * g.f[e];
    }
  return double(std::sqrt(rr / ff));
}

BlockResidual CheckBlock(const Grid& g, const std::vector<double>& y) {
  return BlockTridiagonalResidual(g.N, g.M, g.aC.data(), g.cC.data(), g.bC.data(), g.cA.data(),
                                  g.cB.data(), g.norm, g.f.data(), y.data());
}

TEST(BenchCheck, BlockResidualAgreesWithTheDefinition) {
  for (auto [N, M] : {std::pair<int64_t, int64_t>{2, 2}, {2, 9}, {7, 3}, {33, 64}, {64, 17}}) {
    const Grid g = MakeGrid(N, M, uint64_t(N * 100 + M));
    const BlockResidual good = CheckBlock(g, g.y);
    EXPECT_LE(good.residual, 1e-12) << N << " x " << M;
    EXPECT_GT(good.rounding, 0);
    EXPECT_LT(good.rounding, 1e-13);
    // A wrong value at a corner, an edge, the middle: each shows, as the definition says.
    for (int64_t e : {int64_t{0}, M - 1, (N / 2) * M + M / 2, N * M - M, N * M - 1}) {
      std::vector<double> w = g.y;
      w[size_t(e)] += 1e-5;
      const double plain = PlainBlock(g, w);
      EXPECT_GT(plain, 1e-8);
      EXPECT_NEAR(CheckBlock(g, w).residual, plain, 1e-8 * plain) << N << " x " << M << " @" << e;
    }
  }
}

TEST(BenchCheck, BlockCouplingsOutsideTheGridAreNotRead) {
  Grid g = MakeGrid(9, 11, 3);
  const double before = CheckBlock(g, g.y).residual;
  // A has no coupling left of column 0, right of column M - 1, above row 0, below row N - 1.
  for (int64_t i = 0; i < g.N; ++i) g.aC[size_t(i * g.M)] = 1e9, g.bC[size_t(i * g.M + g.M - 1)] = 1e9;
  for (int64_t k = 0; k < g.M; ++k) g.cA[size_t(k)] = 1e9, g.cB[size_t((g.N - 1) * g.M + k)] = 1e9;
  EXPECT_EQ(CheckBlock(g, g.y).residual, before);
  EXPECT_EQ(BlockTridiagonalNorm(g.N, g.M, g.aC.data(), g.cC.data(), g.bC.data(), g.cA.data(),
                                 g.cB.data()),
            g.norm);
}

TEST(BenchCheck, BlockNaNInfinityAndAnotherRequestsAnswerAreWrong) {
  const Grid g = MakeGrid(16, 24, 5), other = MakeGrid(16, 24, 6);
  for (double v : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()})
    for (int64_t e : {int64_t{0}, int64_t{200}, int64_t{16 * 24 - 1}}) {
      std::vector<double> w = g.y;
      w[size_t(e)] = v;
      EXPECT_EQ(CheckBlock(g, w).residual, INFINITY) << e << " " << v;
    }
  EXPECT_GT(CheckBlock(g, other.y).residual, 1e-2);
  // The bench's own system (the thesis' experiment 2): an answer to 1e-8 passes at 1e-8, the
  // same answer does not pass at 1e-10.
  auto ex = examples::ThesisExperiment2(64, 48);
  Grid t{64, 48, {}, {}, {}, {}, {}, {}, {}, 0};
  for (auto [name, v] : {std::pair<const char*, std::vector<double>*>{"aC", &t.aC}, {"cC", &t.cC},
                         {"bC", &t.bC}, {"cA", &t.cA}, {"cB", &t.cB}, {"f", &t.f}})
    v->assign(ex[name].as<double>(), ex[name].as<double>() + 64 * 48);
  t.norm = BlockTridiagonalNorm(64, 48, t.aC.data(), t.cC.data(), t.bC.data(), t.cA.data(),
                                t.cB.data());
  BlockTridiagonalProblem<double> p;
  p.N = 64, p.M = 48, p.aC = t.aC.data(), p.cC = t.cC.data(), p.bC = t.bC.data();
  p.cA = t.cA.data(), p.cB = t.cB.data(), p.f = t.f.data();
  t.y.resize(64 * 48);
  SystemStatus st = SystemStatus::kOk;
  BlockOptions o;
  o.tol = 1e-8;
  auto info = cpu::SolveBlockTridiagonal<double>(p, BlockMethod::kMultigridCg, o, {t.y.data(), &st});
  ASSERT_TRUE(info.ok());
  ASSERT_EQ(st, SystemStatus::kOk);
  const BlockResidual r = CheckBlock(t, t.y);
  EXPECT_LE(r.residual, 1e-8 + r.rounding);
  EXPECT_NEAR(r.residual, info->residual, 1e-12);
  EXPECT_GT(r.residual, 1e-10);
}

// ---- the dense family's check ----------------------------------------------------------------

// x = A^-1 b by Gauss-Jordan with partial pivoting in long double: an answer as right as
// float64 can hold (kappa ~ 3), and A^-1 itself where inverse is given.
std::vector<double> SolveLong(const double* A, const double* b, int64_t n,
                              std::vector<long double>* inverse = nullptr) {
  const int64_t w = 2 * n + 1;
  std::vector<long double> t(static_cast<size_t>(n * w), 0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) t[size_t(i * w + j)] = A[i * n + j];
    t[size_t(i * w + n + i)] = 1;
    t[size_t(i * w + 2 * n)] = b[i];
  }
  for (int64_t k = 0; k < n; ++k) {
    int64_t p = k;
    for (int64_t i = k + 1; i < n; ++i)
      if (std::abs(t[size_t(i * w + k)]) > std::abs(t[size_t(p * w + k)])) p = i;
    for (int64_t j = 0; j < w; ++j) std::swap(t[size_t(k * w + j)], t[size_t(p * w + j)]);
    const long double piv = t[size_t(k * w + k)];
    for (int64_t j = 0; j < w; ++j) t[size_t(k * w + j)] /= piv;
    for (int64_t i = 0; i < n; ++i)
      if (i != k) {
        const long double f = t[size_t(i * w + k)];
        for (int64_t j = 0; j < w; ++j) t[size_t(i * w + j)] -= f * t[size_t(k * w + j)];
      }
  }
  std::vector<double> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = double(t[size_t(i * w + 2 * n)]);
  if (inverse != nullptr) {
    inverse->resize(size_t(n * n));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) (*inverse)[size_t(i * n + j)] = t[size_t(i * w + n + j)];
  }
  return x;
}

// kappa_bound bounds kappa_inf of every matrix (Varah's bound, computed here from the exact
// inverse), and stays near 3 at every order, so the check's tolerances stay near n eps.
TEST(BenchCheck, DenseKappaBoundHoldsAndStaysSmall) {
  for (int64_t n : {1, 2, 3, 16, 100}) {
    const DenseBatch m = MakeDenseBatch(3, n, uint64_t(n));
    ASSERT_EQ(m.A.size(), size_t(3 * n * n));
    EXPECT_LE(m.kappa_bound, 3.5) << n;
    for (int64_t s = 0; s < 3; ++s) {
      const double* A = m.A.data() + s * n * n;
      std::vector<long double> inv;
      SolveLong(A, std::vector<double>(size_t(n), 1).data(), n, &inv);
      long double an = 0, in = 0;
      for (int64_t i = 0; i < n; ++i) {
        long double ra = 0, ri = 0;
        for (int64_t j = 0; j < n; ++j)
          ra += std::abs(A[i * n + j]), ri += std::abs(inv[size_t(i * n + j)]);
        an = std::max(an, ra);
        in = std::max(in, ri);
      }
      EXPECT_LE(double(an * in), m.kappa_bound * (1 + 1e-12)) << n << " system " << s;
      EXPECT_GE(double(an * in), 1.0) << n;
    }
  }
}

// The backward error by the definition (long double), and the check against it.
TEST(BenchCheck, DenseBackwardErrorAgreesWithTheDefinition) {
  for (int64_t n : {1, 2, 7, 64}) {
    const int64_t batch = 3;
    const DenseBatch m = MakeDenseBatch(batch, n, uint64_t(40 + n));
    const std::vector<double> b = UniformValues(batch * n, uint64_t(n));
    std::vector<double> x(static_cast<size_t>(batch * n));
    for (int64_t s = 0; s < batch; ++s) {
      const auto xs = SolveLong(m.A.data() + s * n * n, b.data() + s * n, n);
      std::copy(xs.begin(), xs.end(), x.begin() + s * n);
    }
    EXPECT_LE(DenseNormwiseBackwardError(m.A.data(), b.data(), x.data(), batch, n), 1e-15) << n;
    for (int64_t e : {int64_t{0}, batch * n / 2, batch * n - 1}) {
      std::vector<double> w = x;
      w[size_t(e)] += 1e-6;
      long double worst = 0;
      for (int64_t s = 0; s < batch; ++s) {
        long double r = 0, an = 0, xn = 0, bn = 0;
        for (int64_t i = 0; i < n; ++i) {
          long double ax = 0, row = 0;
          for (int64_t j = 0; j < n; ++j)
            ax += (long double)m.A[size_t((s * n + i) * n + j)] * w[size_t(s * n + j)],
                row += std::abs(m.A[size_t((s * n + i) * n + j)]);
          r = std::max(r, std::abs(b[size_t(s * n + i)] - ax));
          an = std::max(an, row);
          xn = std::max<long double>(xn, std::abs(w[size_t(s * n + i)]));
          bn = std::max<long double>(bn, std::abs(b[size_t(s * n + i)]));
        }
        worst = std::max(worst, r / (an * xn + bn));
      }
      EXPECT_GT(double(worst), 1e-9);
      EXPECT_NEAR(DenseNormwiseBackwardError(m.A.data(), b.data(), w.data(), batch, n),
                  double(worst), 1e-8 * double(worst))
          << n << " @" << e;
    }
  }
}

// What the server may answer (Gauss-Jordan: the CPU backend's auto, and the GPU's to n = 64;
// LU: the GPU's above) passes against the local core's LU x, at every order the bench runs; an
// answer to another request, a NaN or an infinity anywhere, or an error ten times the tolerance
// does not.
TEST(BenchCheck, DenseCheckPassesEveryMethodAndCatchesWrongAnswers) {
  for (int64_t n : {1, 2, 16, 256}) {
    const int64_t batch = 4;
    const DenseBatch m = MakeDenseBatch(batch, n, uint64_t(n) + 7);
    const DenseTolerance tol = DenseCheckTolerance(n, m.kappa_bound);
    EXPECT_LT(tol.forward, 1e-10) << n;
    const std::vector<double> b = UniformValues(batch * n, 1), b2 = UniformValues(batch * n, 2);
    std::vector<SystemStatus> status(static_cast<size_t>(batch));
    std::vector<double> local(static_cast<size_t>(batch * n));
    const auto f = cpu::FactorDense<double>(batch, n, m.A.data(), DenseMethod::kLu);
    cpu::SolveFactored(f, b.data(), local.data(), status.data());
    for (DenseMethod method : {DenseMethod::kGaussJordan, DenseMethod::kLu}) {
      std::vector<double> x(static_cast<size_t>(batch * n));
      cpu::SolveDense<double>({batch, n, m.A.data(), b.data()}, method, {x.data(), status.data()});
      const double e = MaxRelativeDifference(x.data(), local.data(), batch, n);
      EXPECT_LE(e, tol.forward / 10) << n << " " << MethodName(method);
      EXPECT_LE(DenseNormwiseBackwardError(m.A.data(), b.data(), x.data(), batch, n),
                tol.backward / 10)
          << n << " " << MethodName(method);
    }
    // Another request's answer.
    std::vector<double> other(static_cast<size_t>(batch * n));
    cpu::SolveFactored(f, b2.data(), other.data(), status.data());
    EXPECT_GT(MaxRelativeDifference(other.data(), local.data(), batch, n), 1e-2) << n;
    EXPECT_GT(DenseNormwiseBackwardError(m.A.data(), b.data(), other.data(), batch, n), 1e-2);
    for (int64_t e : {int64_t{0}, batch * n / 2, batch * n - 1}) {
      std::vector<double> w = local;
      double scale = 0;  // the system's max |x|, what the difference is relative to
      for (int64_t i = 0; i < n; ++i)
        scale = std::max(scale, std::abs(local[size_t((e / n) * n + i)]));
      w[size_t(e)] += 10 * tol.forward * scale;
      EXPECT_GT(MaxRelativeDifference(w.data(), local.data(), batch, n), tol.forward) << n;
      for (double v :
           {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
            -std::numeric_limits<double>::infinity()}) {
        w[size_t(e)] = v;
        EXPECT_EQ(MaxRelativeDifference(w.data(), local.data(), batch, n), INFINITY);
        EXPECT_EQ(DenseNormwiseBackwardError(m.A.data(), b.data(), w.data(), batch, n), INFINITY);
      }
    }
  }
}

}  // namespace
}  // namespace trisolve
