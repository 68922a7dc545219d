// The CUDA backend's dense solves against the CPU reference. Skips, saying so, without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_test_util.h"
#include "dense/dense.h"
#include "dense_bound.h"
#include "error_measure.h"
#include "gtest/gtest.h"
#include "trisolve/backend.h"
#include "trisolve/dense.h"
#include "trisolve/system.h"
#include "trisolve/examples.h"
#include "trisolve/reference/dense.h"

namespace trisolve {
namespace {

using ::trisolve::testing::Cuda;


template <typename T>
void Check(int64_t n, int64_t batch, double tol_x, double tol_be) {
  std::mt19937_64 rng(n * 31 + batch);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<T> A(batch * n * n), b(batch * n);
  for (auto& v : A) v = T(u(rng));  // no diagonal weight: row exchanges are needed
  for (auto& v : b) v = T(u(rng));
  // System 0: a Hilbert matrix where its verdict is clear (n <= 10: cond <= 1.6e13; beyond,
  // it is singular to rounding and either verdict is right); system 1: two equal rows
  // (singular); system 2: a zero column (singular).
  const bool hilbert = batch >= 3 && n >= 2 && n <= (sizeof(T) == 8 ? 10 : 4);
  if (batch >= 3 && n >= 2) {
    for (int64_t i = 0; i < n && hilbert; ++i)
      for (int64_t j = 0; j < n; ++j) A[i * n + j] = T(1.0 / double(i + j + 1));
    for (int64_t j = 0; j < n; ++j) A[n * n + (n - 1) * n + j] = A[n * n + j];
    for (int64_t i = 0; i < n; ++i) A[2 * n * n + i * n] = T(0);
  }
  DenseProblem<T> p{batch, n, A.data(), b.data()};
  std::vector<T> xg(batch * n, T(std::nan(""))), xc(batch * n);
  std::vector<SystemStatus> sg(batch), sc(batch);
  auto info = Cuda()->Solve(p, DenseMethod::kAuto, DenseOutput<T>{xg.data(), sg.data()}, SolveControl{});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->method, n <= 32   ? "gauss-jordan-warp"
                          : n <= 64 ? "gauss-jordan-2warps"
                                    : "gauss-jordan-block");
  cpu::SolveDense(p, DenseMethod::kGaussJordan, DenseOutput<T>{xc.data(), sc.data()});
  double worst = 0;
  for (int64_t s = 0; s < batch; ++s) {
    ASSERT_EQ(sg[s], sc[s]) << "system " << s << " of n = " << n;
    if (sc[s] != SystemStatus::kOk) {
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(xg[s * n + i], T(0));
      continue;
    }
    if (s == 0 && hilbert) continue;  // Hilbert: judged by backward error only
    if constexpr (std::is_same_v<T, float>) {
      // float32: what backward stability allows (tests/dense_bound.h), against dgesv on the
      // same data; a fixed 5e-2 against the CPU passed answers 10^4 times worse.
      auto v = testing::JudgeFloat32(n, &A[s * n * n], &b[s * n], &xg[s * n]);
      EXPECT_EQ(v.fault, "") << "system " << s << " of n = " << n;
      continue;
    }
    double dm = 0, xm = 0;
    for (int64_t i = 0; i < n; ++i) {
      dm = testing::WorseOf(dm, std::abs(double(xg[s * n + i]) - double(xc[s * n + i])));
      xm = testing::WorseOf(xm, std::abs(double(xc[s * n + i])));
    }
    worst = testing::WorseOf(worst, dm / xm);
  }
  EXPECT_LE(worst, tol_x) << "n = " << n;
  EXPECT_LE(DenseBackwardError(p, xg.data(), sg.data()), tol_be) << "n = " << n;
}

class CudaDense : public ::testing::TestWithParam<int64_t> {};

TEST_P(CudaDense, MatchesTheCpuReference) {
  REQUIRE_GPU();
  Check<double>(GetParam(), 2000, 1e-9, 1e-14);
  Check<float>(GetParam(), 500, /*tol_x: the bound of dense_bound.h*/ 0, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Orders, CudaDense,
                         ::testing::Values(1, 2, 3, 8, 9, 17, 32, 33, 47, 64, 65, 100, 127, 128));

// Large systems: LU through cuBLAS (batched) or cuSOLVER (one at a time), householder-pcr
// through cuSOLVER's sytrd and the tridiagonal kernels. b = A x_true; the CPU reference where
// it is quick enough (n <= 1000), the backward error and x_true everywhere.
template <typename T>
void CheckLarge(int64_t n, int64_t batch, DenseMethod m, bool symmetric, const char* expect,
                double tol_be, double tol_x) {
  std::mt19937_64 rng(n * 7 + batch);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<T> A(batch * n * n), b(batch * n, T(0)), xt(batch * n);
  for (int64_t s = 0; s < batch; ++s) {
    T* As = A.data() + s * n * n;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) As[i * n + j] = T(u(rng));
    if (symmetric) {  // indefinite: diagonal of both signs
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < i; ++j) As[i * n + j] = As[j * n + i];
        As[i * n + i] += T((i % 2 ? -2 : 2) * std::sqrt(double(n)));
      }
    }
    for (int64_t i = 0; i < n; ++i) xt[s * n + i] = T(u(rng));
    for (int64_t i = 0; i < n; ++i) {
      double acc = 0;
      for (int64_t j = 0; j < n; ++j) acc += double(As[i * n + j]) * double(xt[s * n + j]);
      b[s * n + i] = T(acc);
    }
  }
  // The last system of a batch (LU): two equal rows, singular. (A singular symmetric system
  // is not used for householder-pcr: PCR on a singular T may return a huge x whose normwise
  // backward error is small, which is a valid answer to a singular system, not a test.)
  const bool singular_last = batch > 1 && !symmetric;
  if (singular_last)
    for (int64_t j = 0; j < n; ++j)
      A[(batch - 1) * n * n + (n - 1) * n + j] = A[(batch - 1) * n * n + j];
  DenseProblem<T> p{batch, n, A.data(), b.data()};
  std::vector<T> xg(batch * n, T(std::nan("")));
  std::vector<SystemStatus> sg(batch);
  auto info = Cuda()->Solve(p, m, DenseOutput<T>{xg.data(), sg.data()}, SolveControl{});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->method, expect) << "n = " << n;
  const int64_t good = singular_last ? batch - 1 : batch;
  for (int64_t s = 0; s < good; ++s) {
    ASSERT_EQ(sg[s], SystemStatus::kOk) << "system " << s << ", n = " << n;
    if constexpr (std::is_same_v<T, float>) {
      // float32 (kappa ~ 1e4 - 1e6 here): the bound of tests/dense_bound.h against dgesv on
      // the stored data, in place of 2e-2 / 5e-1 absolute against x_true (b rounded to
      // float32 is not A x_true, and 5e-1 passed an x wrong by half its size).
      auto v = testing::JudgeFloat32(n, &A[s * n * n], &b[s * n], &xg[s * n]);
      EXPECT_EQ(v.fault, "") << "system " << s << ", n = " << n;
      continue;
    }
    double dm = 0;
    for (int64_t i = 0; i < n; ++i)
      dm = testing::WorseOf(dm, std::abs(double(xg[s * n + i]) - double(xt[s * n + i])));
    EXPECT_LE(dm, tol_x) << "system " << s << ", n = " << n;
  }
  if (singular_last) {
    EXPECT_EQ(sg[batch - 1], SystemStatus::kSingular);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(xg[(batch - 1) * n + i], T(0));
  }
  EXPECT_LE(DenseBackwardError(p, xg.data(), sg.data()), tol_be) << "n = " << n;
  if (n <= 1000 && std::is_same_v<T, double>) {  // float32: judged against dgesv above
    std::vector<T> xc(batch * n);
    std::vector<SystemStatus> sc(batch);
    cpu::SolveDense(p, m == DenseMethod::kAuto ? DenseMethod::kLu : m,
                    DenseOutput<T>{xc.data(), sc.data()});
    for (int64_t s = 0; s < good; ++s) {
      ASSERT_EQ(sc[s], SystemStatus::kOk);
      double dm = 0;
      for (int64_t i = 0; i < n; ++i)
        dm = std::max(dm, std::abs(double(xg[s * n + i]) - double(xc[s * n + i])));
      EXPECT_LE(dm, tol_x) << "against the CPU, system " << s << ", n = " << n;
    }
  }
}

TEST(CudaDenseLarge, LuBatchedAndSingle) {
  REQUIRE_GPU();
  CheckLarge<double>(100, 50, DenseMethod::kLu, false, "lu (cublas getrfBatched)", 1e-14, 1e-10);
  CheckLarge<double>(512, 4, DenseMethod::kLu, false, "lu (cublas getrfBatched)", 1e-14, 1e-9);
  CheckLarge<double>(1000, 1, DenseMethod::kAuto, false, "lu (cusolver getrf)", 1e-14, 1e-9);
  CheckLarge<double>(1000, 3, DenseMethod::kAuto, false, "lu (cusolver getrf)", 1e-14, 1e-9);
  CheckLarge<double>(4096, 1, DenseMethod::kAuto, false, "lu (cusolver getrf)", 1e-14, 1e-7);
  // float32: tol_x unused, the bound of tests/dense_bound.h instead.
  CheckLarge<float>(300, 8, DenseMethod::kAuto, false, "lu (cublas getrfBatched)", 1e-5, 0);
  CheckLarge<float>(2000, 1, DenseMethod::kAuto, false, "lu (cusolver getrf)", 1e-5, 0);
  CheckLarge<float>(700, 3, DenseMethod::kAuto, false, "lu (cusolver getrf)", 1e-5, 0);
}

// gauss-jordan for n > 128: blocked, panels of 512 columns. One panel (129, 512), a panel and
// one column (513), several with a short last one (1000, 4096); 65 and 128 run the one-block
// kernel; the last system of each batch singular; float32 too. The CPU's Gauss-Jordan picks
// the same pivots.
TEST(CudaDenseLarge, GaussJordanBlocked) {
  REQUIRE_GPU();
  const char* gj = "gauss-jordan-blocked";
  CheckLarge<double>(65, 5, DenseMethod::kGaussJordan, false, "gauss-jordan-block", 1e-14, 1e-10);
  CheckLarge<double>(128, 3, DenseMethod::kGaussJordan, false, "gauss-jordan-block", 1e-14, 1e-10);
  CheckLarge<double>(129, 3, DenseMethod::kGaussJordan, false, gj, 1e-14, 1e-10);
  CheckLarge<double>(512, 2, DenseMethod::kGaussJordan, false, gj, 1e-14, 1e-10);
  CheckLarge<double>(513, 3, DenseMethod::kGaussJordan, false, gj, 1e-14, 1e-10);
  CheckLarge<double>(1000, 3, DenseMethod::kGaussJordan, false, gj, 1e-14, 1e-9);
  // Gauss-Jordan is forward stable but not backward stable (Peters and Wilkinson): its
  // residual grows with cond(A), and this matrix (uniform entries, no diagonal weight) is not
  // well conditioned: 1.3e-14 measured, where LU gets 3e-16.
  CheckLarge<double>(4096, 1, DenseMethod::kGaussJordan, false, gj, 5e-14, 1e-7);
  CheckLarge<float>(300, 4, DenseMethod::kGaussJordan, false, gj, 1e-5, 0);
  CheckLarge<float>(2000, 1, DenseMethod::kGaussJordan, false, gj, 1e-5, 0);
}

// A = Q1 diag(sigma) Q2 with sigma from 1 down to 1 / cond (geometric) and Q1, Q2 products of
// three Householder reflectors of random vectors: a matrix of known condition number (2-norm).
std::vector<double> WithCondition(int64_t n, double cond, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> A(n * n, 0.0), v(n), w(n);
  for (int64_t i = 0; i < n; ++i)
    A[i * n + i] = std::pow(cond, -double(i) / double(std::max<int64_t>(n - 1, 1)));
  for (int side = 0; side < 2; ++side)
    for (int h = 0; h < 3; ++h) {
      double vv = 0;
      for (auto& e : v) {
        e = u(rng);
        vv += e * e;
      }
      if (side == 0) {  // A <- H A: rows combined, w = A^T v
        std::fill(w.begin(), w.end(), 0.0);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < n; ++j) w[j] += v[i] * A[i * n + j];
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < n; ++j) A[i * n + j] -= 2 * v[i] * w[j] / vv;
      } else {  // A <- A H: w = A v
        for (int64_t i = 0; i < n; ++i) {
          double acc = 0;
          for (int64_t j = 0; j < n; ++j) acc += A[i * n + j] * v[j];
          w[i] = acc;
        }
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < n; ++j) A[i * n + j] -= 2 * w[i] * v[j] / vv;
      }
    }
  return A;
}

// Ill-conditioned systems (cond = 1e10): the forward error within what the condition allows
// (n cond eps), and the backward error at the CPU reference's level (LU: rounding level; Gauss-
// Jordan, which is not backward stable, within 10x of the CPU's Gauss-Jordan).
TEST(CudaDenseLarge, IllConditionedWithinTheConditionBound) {
  REQUIRE_GPU();
  const double cond = 1e10, eps = 2.2e-16;
  struct Run {
    int64_t n, batch;
    DenseMethod m;
  };
  for (const Run& r : {Run{300, 2, DenseMethod::kLu}, Run{300, 1, DenseMethod::kLu},
                       Run{300, 2, DenseMethod::kGaussJordan},
                       Run{700, 1, DenseMethod::kGaussJordan}, Run{40, 64, DenseMethod::kAuto}}) {
    const int64_t n = r.n, batch = r.batch;
    std::vector<double> A, xt(batch * n), b(batch * n, 0.0);
    std::mt19937_64 rng(n + batch);
    std::uniform_real_distribution<double> u(-1, 1);
    for (int64_t s = 0; s < batch; ++s) {
      auto As = WithCondition(n, cond, 17 * n + s);
      A.insert(A.end(), As.begin(), As.end());
      for (int64_t i = 0; i < n; ++i) xt[s * n + i] = u(rng);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j) b[s * n + i] += As[i * n + j] * xt[s * n + j];
    }
    DenseProblem<double> p{batch, n, A.data(), b.data()};
    std::vector<double> xg(batch * n), xc(batch * n);
    std::vector<SystemStatus> sg(batch), sc(batch);
    auto info = Cuda()->Solve(p, r.m, DenseOutput<double>{xg.data(), sg.data()}, SolveControl{});
    ASSERT_TRUE(info.ok()) << info.status();
    const DenseMethod cm = r.m == DenseMethod::kAuto ? DenseMethod::kGaussJordan : r.m;
    cpu::SolveDense(p, cm, DenseOutput<double>{xc.data(), sc.data()});
    for (int64_t s = 0; s < batch; ++s) {
      ASSERT_EQ(sg[s], SystemStatus::kOk) << info->method << " n = " << n;
      ASSERT_EQ(sc[s], SystemStatus::kOk);
      double dm = 0, xm = 0;
      for (int64_t i = 0; i < n; ++i) {
        dm = std::max(dm, std::abs(xg[s * n + i] - xt[s * n + i]));
        xm = std::max(xm, std::abs(xt[s * n + i]));
      }
      EXPECT_LE(dm / xm, double(n) * cond * eps) << info->method << " n = " << n;
    }
    const double be_gpu = DenseBackwardError(p, xg.data(), sg.data());
    const double be_cpu = DenseBackwardError(p, xc.data(), sc.data());
    EXPECT_LE(be_gpu, 10 * be_cpu + 1e-15) << info->method << " n = " << n;
    if (r.m == DenseMethod::kLu) {
      EXPECT_LE(be_gpu, 1e-14) << info->method << " n = " << n;
    }
    std::printf("[ ill-conditioned ] %-26s n = %4lld: backward error GPU %.1e, CPU %.1e\n",
                info->method.c_str(), (long long)n, be_gpu, be_cpu);
  }
}

TEST(CudaDense, HouseholderPcrBatchedSmall) {
  REQUIRE_GPU();
  // One block a system up to n = 64 against the CPU's householder-pcr: symmetric indefinite
  // matrices, float64 and float32, and a zero matrix (PCR meets a zero pivot: flagged).
  for (int64_t n : {1, 2, 3, 17, 32, 33, 64}) {
    auto ex = examples::RandomDense(300, n, /*symmetric=*/true, 40 + n);
    std::vector<double> A(ex["a"].as<double>(), ex["a"].as<double>() + 300 * n * n);
    std::vector<double> b(ex["b"].as<double>(), ex["b"].as<double>() + 300 * n);
    for (int64_t e = 0; e < n * n; ++e) A[299 * n * n + e] = 0;  // the last system: zero
    DenseProblem<double> p{300, n, A.data(), b.data()};
    std::vector<double> xg(300 * n, std::nan("")), xc(300 * n);
    std::vector<SystemStatus> sg(300), sc(300);
    auto info = Cuda()->Solve(p, DenseMethod::kHouseholderPcr,
                              DenseOutput<double>{xg.data(), sg.data()}, SolveControl{});
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->method, "householder-pcr-block");
    cpu::SolveDense(p, DenseMethod::kHouseholderPcr, DenseOutput<double>{xc.data(), sc.data()});
    for (int64_t s = 0; s < 300; ++s) ASSERT_EQ(sg[s], sc[s]) << "system " << s << ", n " << n;
    EXPECT_EQ(sg[299], SystemStatus::kSingular);
    double dm = 0, xm = 0;
    for (int64_t e = 0; e < 299 * n; ++e) {
      dm = std::max(dm, std::abs(xg[e] - xc[e]));
      xm = std::max(xm, std::abs(xc[e]));
    }
    EXPECT_LE(dm, 1e-11 * xm) << "n = " << n;
    // PCR has no pivoting: on these indefinite T the backward error is the method's, the same
    // as the CPU's (up to 1e-13 here), not Gauss-Jordan's.
    const double be = DenseBackwardError(p, xg.data(), sg.data());
    EXPECT_LE(be, 10 * DenseBackwardError(p, xc.data(), sc.data()) + 1e-14) << "n = " << n;
    EXPECT_LE(be, 1e-12) << "n = " << n;
    std::vector<float> Af(A.begin(), A.end()), bf(b.begin(), b.end()), xf(300 * n);
    std::vector<SystemStatus> sf(300);
    DenseProblem<float> pf{300, n, Af.data(), bf.data()};
    auto fi = Cuda()->Solve(pf, DenseMethod::kHouseholderPcr, DenseOutput<float>{xf.data(), sf.data()},
                            SolveControl{});
    ASSERT_TRUE(fi.ok()) << fi.status();
    std::vector<float> xfc(300 * n);
    std::vector<SystemStatus> sfc(300);
    cpu::SolveDense(pf, DenseMethod::kHouseholderPcr, DenseOutput<float>{xfc.data(), sfc.data()});
    EXPECT_LE(DenseBackwardError(pf, xf.data(), sf.data()),
              4 * DenseBackwardError(pf, xfc.data(), sfc.data()) + 1e-6)
        << "n = " << n;
  }
}

TEST(CudaDenseLarge, HouseholderPcrSymmetricIndefinite) {
  REQUIRE_GPU();
  const char* hp = "householder-pcr (cusolver sytrd)";
  CheckLarge<double>(128, 3, DenseMethod::kHouseholderPcr, true, hp, 1e-14, 1e-11);
  CheckLarge<double>(1000, 1, DenseMethod::kHouseholderPcr, true, hp, 1e-14, 1e-10);
  CheckLarge<double>(1500, 1, DenseMethod::kHouseholderPcr, true, hp, 1e-14, 1e-10);
  CheckLarge<double>(4096, 1, DenseMethod::kHouseholderPcr, true, hp, 1e-14, 1e-9);
  CheckLarge<float>(1000, 1, DenseMethod::kHouseholderPcr, true, hp, 1e-5, 0);
}

// A dense system by handle keeps its elimination on the device (Gauss-Jordan's multipliers and
// pivot rows for n <= 128, LU's factors above and for "lu"); each right-hand side's x and
// statuses are the one-shot call's on the same arrays bit for bit, for one right-hand side and
// for k at once, and again after an update of A. System 3 has two equal rows (singular); the
// fourth right-hand side is scaled by 1e30 so that float32's x overflows (flagged, not Inf).
template <typename T>
void KeptMatchesOneShot(int64_t batch, int64_t n, DenseMethod m, const std::string& kept) {
  SCOPED_TRACE(::testing::Message() << (sizeof(T) == 8 ? "float64" : "float32") << ", batch "
                                    << batch << ", n = " << n << ", " << MethodName(m));
  std::mt19937_64 rng(uint64_t(n * 7 + batch));
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<T> A(size_t(batch * n * n));
  auto fill = [&] {
    for (auto& v : A) v = T(u(rng));
    if (batch > 3 && n >= 2)
      for (int64_t j = 0; j < n; ++j) A[size_t(3 * n * n + n + j)] = A[size_t(3 * n * n + j)];
  };
  fill();
  SystemSpec spec;
  spec.family = Family::kDense;
  spec.precision = sizeof(T) == 8 ? Precision::kFloat64 : Precision::kFloat32;
  spec.batch = batch;
  spec.n = n;
  spec.method = uint8_t(m);
  spec.coefficients = {A.data()};
  auto system = Cuda()->Prepare(spec);
  ASSERT_TRUE(system.ok()) << system.status();
  EXPECT_NE((*system)->prepared().find(kept), std::string::npos) << (*system)->prepared();
  EXPECT_GE((*system)->bytes(), batch * n * n * int64_t(sizeof(T)));
  const auto same = [](const std::vector<T>& p, const std::vector<T>& q, size_t at) {
    for (size_t i = 0; i < p.size(); ++i)
      if (std::memcmp(&p[i], &q[at + i], sizeof(T)) != 0) return ::testing::AssertionFailure()
             << "value " << at + i << ": " << q[at + i] << " against the one-shot " << p[i];
    return ::testing::AssertionSuccess();
  };
  const int64_t N = batch * n, k = 4;
  for (int round = 0; round < 2; ++round) {
    std::vector<T> all(size_t(k * N));
    for (int64_t j = 0; j < k; ++j)
      for (int64_t i = 0; i < N; ++i)
        all[size_t(j * N + i)] = T(u(rng) * (j == 3 ? 1e30 : 1.0));
    std::vector<T> xk(size_t(k * N), T(std::nan("")));
    std::vector<SystemStatus> sk(size_t(k * batch), SystemStatus::kDiverged);
    auto many = Cuda()->SolvePrepared(**system, RhsBlock<T>{all.data(), k}, xk.data(), sk.data(),
                                      SolveControl{});
    ASSERT_TRUE(many.ok()) << many.status();
    for (int64_t j = 0; j < k; ++j) {
      std::vector<T> b(all.begin() + j * N, all.begin() + (j + 1) * N);
      std::vector<T> want(static_cast<size_t>(N)), x(static_cast<size_t>(N), T(std::nan("")));
      std::vector<SystemStatus> want_st(static_cast<size_t>(batch)),
          st(static_cast<size_t>(batch), SystemStatus::kDiverged);
      auto one_shot = Cuda()->Solve(DenseProblem<T>{batch, n, A.data(), b.data()}, m,
                                    DenseOutput<T>{want.data(), want_st.data()}, SolveControl{});
      ASSERT_TRUE(one_shot.ok()) << one_shot.status();
      auto by_handle = Cuda()->SolvePrepared(**system, RhsBlock<T>{b.data()}, x.data(), st.data(),
                                             SolveControl{});
      ASSERT_TRUE(by_handle.ok()) << by_handle.status();
      EXPECT_EQ(by_handle->method, one_shot->method);
      EXPECT_EQ(st, want_st) << "round " << round << ", rhs " << j;
      EXPECT_TRUE(same(want, x, 0)) << "round " << round << ", rhs " << j;
      EXPECT_TRUE(std::equal(want_st.begin(), want_st.end(), sk.begin() + j * batch));
      if (batch > 1 || n <= cuda::kDenseGpuMaxN) {
        // (One system's k right-hand sides go to getrs as one n x k block: the same solve,
        // not necessarily the same order of sums.)
        EXPECT_TRUE(same(want, xk, size_t(j * N))) << "round " << round << ", rhs " << j;
      } else if (want_st[0] == SystemStatus::kOk) {
        for (int64_t i = 0; i < N; ++i)
          EXPECT_NEAR(xk[size_t(j * N + i)], want[size_t(i)],
                      (sizeof(T) == 8 ? 1e-10 : 1e-2) * (1 + std::fabs(want[size_t(i)])));
      }
      // (Two equal rows are singular to LU's working precision only where its elimination
      // leaves the second a multiple of n eps of the column, which cuBLAS's at n = 129 does not:
      // the verdict is then the one-shot call's, checked above.)
      if (batch > 3 && n >= 2 && n <= cuda::kDenseGpuMaxN) {
        EXPECT_EQ(st[3], SystemStatus::kSingular);
      }
      if (j < 3) {
        EXPECT_LT(DenseBackwardError(DenseProblem<T>{batch, n, A.data(), b.data()}, x.data(),
                                     st.data()),
                  sizeof(T) == 8 ? 1e-13 : 1e-4);
      }
    }
    // A new A: factored again.
    fill();
    ASSERT_TRUE((*system)->Update(0, A.data()).ok());
    EXPECT_NE((*system)->prepared().find(kept), std::string::npos);
  }
}

TEST(CudaDensePrepared, KeptEliminationGivesTheOneShotAnswerBitForBit) {
  REQUIRE_GPU();
  const std::string gj = "Gauss-Jordan factors", lu = "LU factors";
  for (int64_t n : {1, 5, 8, 13, 32, 33, 64, 65, 100, 128}) {
    KeptMatchesOneShot<double>(6, n, DenseMethod::kAuto, gj);
    KeptMatchesOneShot<float>(6, n, DenseMethod::kGaussJordan, gj);
    KeptMatchesOneShot<double>(6, n, DenseMethod::kLu, lu);
  }
  KeptMatchesOneShot<double>(1, 40, DenseMethod::kAuto, gj);
  KeptMatchesOneShot<double>(5, 129, DenseMethod::kAuto, lu);  // getrfBatched
  KeptMatchesOneShot<float>(5, 300, DenseMethod::kLu, lu);
  KeptMatchesOneShot<double>(2, 600, DenseMethod::kAuto, lu);  // cuSOLVER, system by system
  KeptMatchesOneShot<double>(1, 700, DenseMethod::kLu, lu);    // one system, k as one block
  KeptMatchesOneShot<float>(1, 257, DenseMethod::kAuto, lu);
}

// Methods whose elimination is not kept (householder-pcr; Gauss-Jordan past n = 128, blocked)
// keep A on the device and factor it at every solve, as the one-shot call does.
TEST(CudaDensePrepared, OtherMethodsKeepTheirCoefficients) {
  REQUIRE_GPU();
  for (auto [n, m] : {std::pair<int64_t, DenseMethod>{200, DenseMethod::kGaussJordan},
                      {48, DenseMethod::kHouseholderPcr}}) {
    auto ex = examples::RandomDense(3, n, /*symmetric=*/true, 5 + n);
    std::vector<double> A(ex["a"].as<double>(), ex["a"].as<double>() + 3 * n * n);
    std::vector<double> b(ex["b"].as<double>(), ex["b"].as<double>() + 3 * n);
    SystemSpec spec;
    spec.family = Family::kDense;
    spec.batch = 3;
    spec.n = n;
    spec.method = uint8_t(m);
    spec.coefficients = {A.data()};
    auto system = Cuda()->Prepare(spec);
    ASSERT_TRUE(system.ok()) << system.status();
    EXPECT_NE((*system)->prepared().find("coefficients on CUDA device"), std::string::npos);
    std::vector<double> x(static_cast<size_t>(3 * n)), want(static_cast<size_t>(3 * n));
    std::vector<SystemStatus> st(3), want_st(3);
    ASSERT_TRUE(Cuda()->SolvePrepared(**system, RhsBlock<double>{b.data()}, x.data(), st.data(),
                                      SolveControl{}).ok());
    ASSERT_TRUE(Cuda()->Solve(DenseProblem<double>{3, n, A.data(), b.data()}, m,
                              DenseOutput<double>{want.data(), want_st.data()}, SolveControl{})
                    .ok());
    EXPECT_EQ(st, want_st);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], want[i], 1e-12) << i;
  }
}

}  // namespace
}  // namespace trisolve
