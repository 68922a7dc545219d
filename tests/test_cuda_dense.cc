// The CUDA backend's dense solves against the CPU reference. Skips, saying so, without a GPU.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "gtest/gtest.h"
#include "trisolve/backend.h"
#include "trisolve/dense.h"

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
                          : n <= 64 ? "gauss-jordan-smem"
                                    : "gauss-jordan (host)");
  cpu::SolveDense(p, DenseMethod::kGaussJordan, DenseOutput<T>{xc.data(), sc.data()});
  double worst = 0;
  for (int64_t s = 0; s < batch; ++s) {
    ASSERT_EQ(sg[s], sc[s]) << "system " << s << " of n = " << n;
    if (sc[s] != SystemStatus::kOk) {
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(xg[s * n + i], T(0));
      continue;
    }
    if (s == 0 && hilbert) continue;  // Hilbert: judged by backward error only
    double dm = 0, xm = 0;
    for (int64_t i = 0; i < n; ++i) {
      dm = std::max(dm, std::abs(double(xg[s * n + i]) - double(xc[s * n + i])));
      xm = std::max(xm, std::abs(double(xc[s * n + i])));
    }
    worst = std::max(worst, dm / xm);
  }
  EXPECT_LE(worst, tol_x) << "n = " << n;
  EXPECT_LE(DenseBackwardError(p, xg.data(), sg.data()), tol_be) << "n = " << n;
}

class CudaDense : public ::testing::TestWithParam<int64_t> {};

TEST_P(CudaDense, MatchesTheCpuReference) {
  REQUIRE_GPU();
  Check<double>(GetParam(), 2000, 1e-9, 1e-14);
  Check<float>(GetParam(), 500, 5e-2, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Orders, CudaDense, ::testing::Values(1, 2, 3, 8, 9, 17, 32, 33, 47, 64, 65, 128));

}  // namespace
}  // namespace trisolve
