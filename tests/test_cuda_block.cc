// The CUDA backend's block iterations against the CPU reference. Skips, saying so, without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "block/block.h"
#include "block_history.h"
#include "block_systems.h"
#include "cuda_test_util.h"
#include "gtest/gtest.h"
#include "trisolve/block_tridiagonal.h"
#include "trisolve/examples.h"
#include "trisolve/system.h"
#include "trisolve/reference/block_tridiagonal.h"
#include "tuning_table.h"

namespace trisolve {
namespace {

using ::trisolve::testing::Cuda;
using ::trisolve::testing::Experiment;
using ::trisolve::testing::Sys;

template <typename T>
void Compare(const Sys<T>& s, BlockMethod m, BlockOptions o, double tol) {
  std::vector<T> yg(s.N * s.M, T(std::nan(""))), yc(s.N * s.M);
  SystemStatus sg, sc;
  auto ig = Cuda()->Solve(s.P(), m, o, BlockOutput<T>{yg.data(), &sg}, SolveControl{});
  ASSERT_TRUE(ig.ok()) << ig.status();
  auto ic = cpu::SolveBlockTridiagonal(s.P(), m, o, BlockOutput<T>{yc.data(), &sc});
  ASSERT_TRUE(ic.ok());
  EXPECT_EQ(sg, sc);
  if (o.tol == 0) EXPECT_EQ(ig->iterations, o.max_iterations);
  else EXPECT_NEAR(double(ig->iterations), double(ic->iterations), 1.0);
  double dm = 0, ym = 0;
  for (size_t e = 0; e < yc.size(); ++e) {
    dm = std::max(dm, std::abs(double(yg[e]) - double(yc[e])));
    ym = std::max(ym, std::abs(double(yc[e])));
  }
  EXPECT_LE(dm / ym, tol) << MethodName(m) << " N=" << s.N << " M=" << s.M;
  EXPECT_NEAR(ig->residual, ic->residual, 1e-6 * (1 + ic->residual));
}

// The method the CUDA backend reports for L sweeps of s (which path ran).
template <typename T>
std::string MethodRun(const Sys<T>& s, BlockMethod m, int64_t L = 2) {
  std::vector<T> y(size_t(s.N * s.M));
  SystemStatus st;
  auto info = Cuda()->Solve(s.P(), m, {L, 0, false}, BlockOutput<T>{y.data(), &st},
                            SolveControl{});
  if (!info.ok()) return info.status().ToString();
  return info->method;
}

// A prepared system's symmetry (auto's choice of method with a tolerance) is tested once, and
// again after each update: multigrid-cg while the matrix is symmetric, red-black once an update
// of cA breaks the symmetry, multigrid-cg again once another restores it; every answer to the
// tolerance, from the arrays as they then are.
TEST(CudaBlock, PreparedSystemsTestTheirSymmetryAgainAfterAnUpdate) {
  REQUIRE_GPU();
  Sys<double> s = Experiment<double>(2, 64, 48);
  SystemSpec spec;
  spec.family = Family::kBlockTridiagonal;
  spec.n = s.N * s.M;
  spec.block_N = s.N;
  spec.block_M = s.M;
  spec.block_options = {4000, 1e-10, false};
  const auto names = CoefficientNames(Family::kBlockTridiagonal);
  for (size_t i = 0; i < names.size(); ++i)
    spec.coefficients[i] = s.a.at(std::string(names[i])).data();
  auto system = Cuda()->Prepare(spec);
  ASSERT_TRUE(system.ok()) << system.status();
  const std::vector<double> symmetric_cA = s.a.at("cA");
  const std::vector<double> halved = [&] {
    std::vector<double> h = symmetric_cA;
    for (double& v : h) v *= 0.5;
    return h;
  }();
  const int cA = CoefficientIndex(Family::kBlockTridiagonal, "cA");
  for (const auto& [values, cg] : {std::pair{&symmetric_cA, true}, std::pair{&halved, false},
                                   std::pair{&symmetric_cA, true}}) {
    ASSERT_TRUE((*system)->Update(cA, values->data()).ok());
    s.a["cA"] = *values;
    for (int repeat = 0; repeat < 2; ++repeat) {
      std::vector<double> y(size_t(s.N * s.M));
      SystemStatus st = SystemStatus::kDiverged;
      auto info = Cuda()->SolvePrepared(**system, RhsBlock<double>{s.a.at("f").data()}, y.data(),
                                        &st, SolveControl{});
      ASSERT_TRUE(info.ok()) << info.status();
      EXPECT_EQ(st, SystemStatus::kOk) << info->method;
      EXPECT_EQ(info->method.find("multigrid-cg") != std::string::npos, cg) << info->method;
      // The residual from the arrays as they are now, on the host.
      EXPECT_LE(BlockRelativeResidual(s.P(), y.data()), 1e-9) << info->method;
    }
  }
}

// A prepared block system keeps its method's setup on the device (the multigrid hierarchy,
// cg's sign test): by handle, x is bit for bit the backend's one-shot answer on the same arrays
// (status, method and iterations too), for every method with a setup, float64 and float32,
// positive and negative definite, k = 1 and 2, and after updates (the diagonal scaled, then the
// whole matrix negated array by array); and the answer's residual, from the host arrays, is
// the CPU reference's to within the tolerance.
template <typename T>
void KeptMatchesOneShot(BlockMethod m, int sign, double tol) {
  Sys<T> s = Experiment<T>(2, 96, 80);
  if (sign < 0)
    for (auto& [k, v] : s.a)
      for (T& x : v) x = -x;
  const std::string what = std::string(MethodName(m)) + (sizeof(T) == 8 ? " float64" : " float32") +
                           (sign > 0 ? " positive" : " negative") + " definite";
  const SystemSpec spec = s.Spec(m, {600, tol, false});
  const auto names = CoefficientNames(Family::kBlockTridiagonal);
  auto system = Cuda()->Prepare(spec);
  ASSERT_TRUE(system.ok()) << system.status();
  if (m != BlockMethod::kCg) {
    EXPECT_NE((*system)->prepared().find("multigrid hierarchy"), std::string::npos)
        << (*system)->prepared();
  }
  const int64_t n = s.N * s.M;
  // definite: the matrix is (negative or positive) definite now, so that the CPU reference's
  // status must be the device's (on the matrices between, half negated, either may stop or
  // break down an iteration apart).
  auto round = [&](const std::string& when, bool definite) {
    std::vector<T> two(size_t(2 * n));
    for (int64_t e = 0; e < n; ++e) {
      two[size_t(e)] = s.a.at("f")[size_t(e)];
      two[size_t(n + e)] = T(0.5) * s.a.at("f")[size_t(e)] + T((e % 7) - 3);
    }
    for (int64_t j = 0; j < 2; ++j) {
      Sys<T> one = s;
      one.a["f"].assign(two.begin() + j * n, two.begin() + (j + 1) * n);
      std::vector<T> y1(size_t(n), T(std::nan(""))), yk(size_t(n), T(std::nan(""))),
          yc(static_cast<size_t>(n));
      SystemStatus s1 = SystemStatus::kDiverged, sk = s1, sc = s1;
      auto once = Cuda()->Solve(one.P(), m, spec.block_options, BlockOutput<T>{y1.data(), &s1},
                                SolveControl{});
      ASSERT_TRUE(once.ok()) << once.status();
      auto kept = Cuda()->SolvePrepared(**system, RhsBlock<T>{one.a.at("f").data()}, yk.data(),
                                        &sk, SolveControl{});
      ASSERT_TRUE(kept.ok()) << kept.status();
      EXPECT_EQ(sk, s1) << what << when;
      EXPECT_EQ(kept->method, once->method) << what << when;
      EXPECT_EQ(kept->iterations, once->iterations) << what << when;
      EXPECT_EQ(std::memcmp(yk.data(), y1.data(), size_t(n) * sizeof(T)), 0)
          << what << when << ", right-hand side " << j << ": x differs from the one-shot answer";
      auto cpu = cpu::SolveBlockTridiagonal(one.P(), m, spec.block_options,
                                            BlockOutput<T>{yc.data(), &sc});
      ASSERT_TRUE(cpu.ok());
      if (!definite) continue;
      EXPECT_EQ(sk, sc) << what << when << ": " << kept->method << " / " << cpu->method;
      const double rk = BlockRelativeResidual(one.P(), yk.data());
      const double rc = BlockRelativeResidual(one.P(), yc.data());
      if (sc == SystemStatus::kOk) {
        EXPECT_LE(rk, 10 * tol) << what << when << ": " << kept->method;
        EXPECT_LE(rc, 10 * tol) << what << when;
      }
    }
    // k = 2 in one call: each block the one-shot answer (checked above).
    std::vector<T> yk(two.size(), T(std::nan("")));
    std::vector<SystemStatus> st(2, SystemStatus::kDiverged);
    RhsBlock<T> block;
    block.rhs = two.data();
    block.k = 2;
    auto both = Cuda()->SolvePrepared(**system, block, yk.data(), st.data(), SolveControl{});
    ASSERT_TRUE(both.ok()) << both.status();
    for (int64_t j = 0; j < 2; ++j) {
      std::vector<T> y1(static_cast<size_t>(n));
      SystemStatus s1;
      auto r = Cuda()->SolvePrepared(**system, RhsBlock<T>{two.data() + j * n}, y1.data(), &s1,
                                     SolveControl{});
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(st[size_t(j)], s1);
      EXPECT_EQ(std::memcmp(yk.data() + j * n, y1.data(), size_t(n) * sizeof(T)), 0)
          << what << when << ", k = 2, block " << j;
    }
  };
  round("", true);
  std::vector<std::pair<std::string, std::vector<T>>> updates;
  std::vector<T> c15 = s.a.at("cC");
  for (T& x : c15) x *= T(1.5);
  updates.push_back({"cC", c15});
  for (size_t i = 0; i < names.size(); ++i) {
    std::vector<T> v = names[i] == "cC" ? c15 : s.a.at(std::string(names[i]));
    for (T& x : v) x = -x;
    updates.push_back({std::string(names[i]), v});
  }
  for (size_t u = 0; u < updates.size(); ++u) {
    const auto& [name, values] = updates[u];
    ASSERT_TRUE(
        (*system)->Update(CoefficientIndex(Family::kBlockTridiagonal, name), values.data()).ok());
    s.a[name] = values;
    round(", after updating " + name, u == 0 || u + 1 == updates.size());
  }
}

TEST(CudaBlock, KeptSetupGivesTheOneShotAnswerBitForBit) {
  REQUIRE_GPU();
  for (auto m : {BlockMethod::kMultigridCg, BlockMethod::kCg, BlockMethod::kMultigridBicgstab,
                 BlockMethod::kAuto})
    for (int sign : {1, -1}) {
      KeptMatchesOneShot<double>(m, sign, 1e-10);
      KeptMatchesOneShot<float>(m, sign, 1e-5);
    }
}

class CudaBlockFixedL
    : public ::testing::TestWithParam<std::tuple<int, std::pair<int64_t, int64_t>, BlockMethod>> {};

TEST_P(CudaBlockFixedL, EqualsTheCpuReference) {
  REQUIRE_GPU();
  const auto [which, nm, m] = GetParam();
  Compare(Experiment<double>(which, nm.first, nm.second), m, {16, 0, which == 2}, 1e-12);
  Compare(Experiment<float>(which, nm.first, nm.second), m, {16, 0, which == 2}, 1e-4);
}

std::string BlockName(
    const ::testing::TestParamInfo<std::tuple<int, std::pair<int64_t, int64_t>, BlockMethod>>& i) {
  std::string m(MethodName(std::get<2>(i.param)));
  for (auto& ch : m)
    if (ch == '-') ch = '_';
  return "exp" + std::to_string(std::get<0>(i.param)) + "_N" +
         std::to_string(std::get<1>(i.param).first) + "_M" +
         std::to_string(std::get<1>(i.param).second) + "_" + m;
}

INSTANTIATE_TEST_SUITE_P(
    Thesis, CudaBlockFixedL,
    ::testing::Combine(::testing::Values(1, 2),
                       ::testing::Values(std::pair<int64_t, int64_t>{1, 1}, std::pair<int64_t, int64_t>{2, 2},
                                         std::pair<int64_t, int64_t>{7, 7}, std::pair<int64_t, int64_t>{7, 128},
                                         std::pair<int64_t, int64_t>{128, 7}, std::pair<int64_t, int64_t>{128, 128},
                                         std::pair<int64_t, int64_t>{1000, 1000},
                                         // 16 rows a thread in the fused sweeps (M > 2048)
                                         std::pair<int64_t, int64_t>{9, 3000},
                                         std::pair<int64_t, int64_t>{3, 4096},
                                         // rows longer than one block holds (4096): a
                                         // cluster of 2 blocks a row (sm_90), 4 over 8192
                                         std::pair<int64_t, int64_t>{4, 4097},
                                         std::pair<int64_t, int64_t>{5, 5000},
                                         std::pair<int64_t, int64_t>{3, 8192},
                                         std::pair<int64_t, int64_t>{2, 12289},
                                         // over 16384: red-black and jacobi windowed
                                         // (float64), the rest the right-hand-side kernel
                                         // and the partitioned solve
                                         std::pair<int64_t, int64_t>{2, 16400}),
                       ::testing::Values(BlockMethod::kGaussSeidel, BlockMethod::kRedBlack,
                                         BlockMethod::kJacobi)),
    BlockName);

TEST(CudaBlock, ConvergesToATolerance) {
  REQUIRE_GPU();
  Compare(Experiment<double>(1, 200, 150), BlockMethod::kRedBlack, {1000, 1e-11, false}, 1e-9);
  Compare(Experiment<double>(2, 24, 24), BlockMethod::kRedBlack, {20000, 1e-10, true}, 1e-7);
  Compare(Experiment<double>(1, 64, 64), BlockMethod::kJacobi, {1000, 1e-11, false}, 1e-9);
  Compare(Experiment<double>(1, 50, 90), BlockMethod::kGaussSeidel, {1000, 1e-11, false}, 1e-9);
}

// The fused sweeps run up to 64 sweeps a launch: L over that takes several launches (jacobi's
// buffers swap on an odd count, gauss-seidel's diagonal table changes with the count).
TEST(CudaBlock, FusedSweepsOverSeveralLaunches) {
  REQUIRE_GPU();
  for (auto m : {BlockMethod::kRedBlack, BlockMethod::kJacobi, BlockMethod::kGaussSeidel})
    for (int64_t L : {63, 64, 65, 131}) {
      Compare(Experiment<double>(1, 100, 300), m, {L, 0, false}, 1e-12);
      Compare(Experiment<float>(2, 37, 200), m, {L, 0, true}, 1e-4);
    }
}

// Every launch choice of the fused sweeps (rows a thread, staged or direct, 1, 2 or 4 blocks a
// row, a block a task or streamed, the streamed rows copied by bulk tensor copies or cp.async),
// and the two-kernel path, give the CPU reference's iterates: M odd (no 16-byte loads) and a
// multiple of 16 (float64 streamed: the bulk copies); with 4 blocks of 32 threads x 8 rows the
// last block of a row of 999 or 1008 holds 231 or 240 of its elements (the streamed form's
// blocks are always 256 x 16: its second to fourth blocks hold identity rows only).
TEST(CudaBlock, EveryFusedSweepFormMatchesTheCpu) {
  REQUIRE_GPU();
  cuda::TuningTable table = cuda::ActiveTuning();  // the test's own, in use until it returns
  const cuda::UseTuning use(&table);
  const cuda::SweepTuning saved = table.sweeps;
  std::vector<cuda::SweepTuning> forms = {{false, 0, 0, 0, 0}};
  for (int cluster : {1, 2, 4}) {
    for (int chunk : {8, 16})
      for (int staged : {-1, 1}) forms.push_back({true, chunk, staged, cluster, -1});
    forms.push_back({true, 16, 0, cluster, 1});               // streamed
    forms.push_back({true, 16, 0, cluster, 1, -1});           // streamed, cp.async
    forms.push_back({true, 16, 0, cluster, 1, 0, 256, 4});    // neighbours 4 rows at a time
  }
  for (const cuda::SweepTuning& t : forms) {
    table.sweeps = t;
    for (auto m : {BlockMethod::kRedBlack, BlockMethod::kJacobi, BlockMethod::kGaussSeidel})
      for (int64_t M : {999, 1008}) {
        SCOPED_TRACE(::testing::Message() << "fused " << t.fused << " chunk " << t.chunk
                                          << " staged " << t.staged << " cluster " << t.cluster
                                          << " stream " << t.stream << " bulk " << t.bulk
                                          << " M " << M);
        Compare(Experiment<double>(1, 37, M), m, {5, 0, false}, 1e-12);
        Compare(Experiment<float>(2, 37, M), m, {5, 0, true}, 1e-4);
      }
  }
  table.sweeps = saved;
}

// The streamed form on blocks of 128 threads (two an SM; float64 on sm_90), clusters of 2, 4
// and 8 blocks by the length of the row, the last block partly filled: M odd (cp.async) and a
// multiple of 16 (bulk tensor copies, the neighbours' loads 8 or 4 rows at a time, and cp.async
// where the tuning says so). float32 falls back to blocks of 256 threads.
TEST(CudaBlock, StreamedSweepsOnSmallBlocksMatchTheCpu) {
  REQUIRE_GPU();
  cuda::TuningTable table = cuda::ActiveTuning();  // the test's own, in use until it returns
  const cuda::UseTuning use(&table);
  const cuda::SweepTuning saved = table.sweeps;
  for (auto [bulk, group] : {std::pair{0, 0}, std::pair{0, 4}, std::pair{-1, 0}}) {
    table.sweeps = cuda::SweepTuning{true, 16, 0, 0, 1, bulk, 128, group};
    for (auto m : {BlockMethod::kRedBlack, BlockMethod::kJacobi, BlockMethod::kGaussSeidel})
      for (int64_t M : {3999, 4000, 7001, 7008, 15337, 15344}) {
        SCOPED_TRACE(::testing::Message() << "bulk " << bulk << " group " << group << " M " << M);
        Compare(Experiment<double>(1, 9, M), m, {5, 0, false}, 1e-12);
      }
    Compare(Experiment<float>(2, 9, 7001), BlockMethod::kRedBlack, {5, 0, true}, 1e-4);
  }
  table.sweeps = saved;
}

// The windowed form (each row's line solve as overlapping windows of 4096 values, a task a
// window; what red-black and jacobi run in float64 over 16384), forced for shorter rows: 2 to 4
// windows a row, M odd (cp.async) and a multiple of 16 (bulk tensor copies, and cp.async where
// the tuning says so), the last window short; several launches (L = 65: jacobi's buffers swap);
// float32 as well. The halo is the least multiple of 16 whose limit 2^(-(digits + 1) /
// (halo + 1)) every row's ratio (|a| + |c|) / |b| is under: experiment 1's rows have ratios up
// to 1/2 (v / 4 twice, v <= 1), so halo + 1 >= 54 in float64 (64) and >= 25 in float32 (32);
// experiment 2's first block row has 2/3 (3 on the diagonal, -1 beside it): halo + 1 >= 54 /
// log2(3/2) = 92.3 (96) and 25 / log2(3/2) = 42.7 (48).
TEST(CudaBlock, WindowedSweepsMatchTheCpu) {
  REQUIRE_GPU();
  cuda::TuningTable table = cuda::ActiveTuning();  // the test's own, in use until it returns
  const cuda::UseTuning use(&table);
  const cuda::SweepTuning saved = table.sweeps;
  for (int bulk : {0, -1}) {
    cuda::SweepTuning t;
    t.window = 1;
    t.bulk = bulk;
    table.sweeps = t;
    for (auto m : {BlockMethod::kRedBlack, BlockMethod::kJacobi})
      for (int64_t M : {4097, 5000, 8192, 12289, 12304}) {
        SCOPED_TRACE(::testing::Message() << "bulk " << bulk << " M " << M);
        Compare(Experiment<double>(1, 5, M), m, {5, 0, false}, 1e-12);
        Compare(Experiment<double>(2, 4, M), m, {4, 0, true}, 1e-12);
        Compare(Experiment<float>(2, 3, M), m, {3, 0, false}, 1e-4);
        Compare(Experiment<float>(1, 3, M), m, {3, 0, false}, 1e-4);
        const std::string name(MethodName(m));
        EXPECT_EQ(MethodRun(Experiment<double>(1, 2, M), m), name + "+fused+windows(halo 64)");
        EXPECT_EQ(MethodRun(Experiment<double>(2, 2, M), m), name + "+fused+windows(halo 96)");
        EXPECT_EQ(MethodRun(Experiment<float>(1, 2, M), m), name + "+fused+windows(halo 32)");
        EXPECT_EQ(MethodRun(Experiment<float>(2, 2, M), m), name + "+fused+windows(halo 48)");
      }
    Compare(Experiment<double>(1, 7, 9000), BlockMethod::kJacobi, {65, 0, false}, 1e-12);
    Compare(Experiment<double>(1, 6, 9008), BlockMethod::kRedBlack, {65, 0, false}, 1e-12);
    // Random couplings of both signs, each row's ratio (|a| + |c|) / |b| drawn up to 0.86 (its
    // largest of 45,000 draws over 240's limit, 0.856: the halo 256; float32 128, 112's limit
    // 0.858) and, in a second system, up to 0.3 (over 16's limit 0.110, under 32's 0.321: 32;
    // float32 16, whose limit is 0.336); the diagonal of either sign; the couplings between
    // block rows small (0.05), random right-hand sides.
    for (double most : {0.86, 0.3}) {
      const int64_t N = 5, M = 9000;
      auto s = Experiment<double>(1, N, M);
      std::mt19937_64 rng(11);
      std::uniform_real_distribution<double> u(-1, 1), r(0, most);
      for (int64_t e = 0; e < N * M; ++e) {
        const int64_t k = e % M;
        auto coupling = [&] {
          const double v = u(rng);
          return (v < 0 ? -0.25 : 0.25) + 0.75 * v;  // 0.25 to 1 in size
        };
        const double a = k > 0 ? coupling() : 0.0, c = k + 1 < M ? coupling() : 0.0;
        const double sign = u(rng) < 0 ? -1.0 : 1.0;
        s.a["aC"][e] = a;
        s.a["bC"][e] = c;
        s.a["cC"][e] = sign * (std::abs(a) + std::abs(c)) / std::max(r(rng), 1e-3);
        s.a["cA"][e] = s.a["cA"][e] == 0 ? 0.0 : 0.05 * u(rng);
        s.a["cB"][e] = s.a["cB"][e] == 0 ? 0.0 : 0.05 * u(rng);
        s.a["f"][e] = u(rng);
      }
      SCOPED_TRACE(::testing::Message() << "bulk " << bulk << " random, ratios up to " << most);
      for (auto m : {BlockMethod::kRedBlack, BlockMethod::kJacobi}) {
        Compare(s, m, {7, 0, false}, 1e-12);
        EXPECT_EQ(MethodRun(s, m), std::string(MethodName(m)) + "+fused+windows(halo " +
                                       (most > 0.5 ? "256" : "32") + ")");
        Sys<float> f{N, M, {}};
        for (auto& [k, v] : s.a) f.a[k] = std::vector<float>(v.begin(), v.end());
        Compare(f, m, {7, 0, false}, 1e-4);
        EXPECT_EQ(MethodRun(f, m), std::string(MethodName(m)) + "+fused+windows(halo " +
                                       (most > 0.5 ? "128" : "16") + ")");
      }
    }
  }
  table.sweeps = saved;
}

// Where one row of one line system is not dominant enough for any halo, the solve runs the
// two-kernel half-sweeps instead (exact), and says so; just under the limit it runs windowed
// and still matches the CPU. One row's ratio sets the halo of them all. float64's limits:
// 2^(-54/257) = 0.8644 (halo 256), 2^(-54/113) = 0.7182 (112) and 2^(-54/97) = 0.6798 (96),
// 2^(-54/65) = 0.5622 (64). A halo set by the tuning (rounded up to a multiple of 16) is taken
// where the rows allow it, else none.
TEST(CudaBlock, WindowedSweepsFallBackWhereARowIsNotDominantEnough) {
  REQUIRE_GPU();
  cuda::TuningTable table = cuda::ActiveTuning();  // the test's own, in use until it returns
  const cuda::UseTuning use(&table);
  const cuda::SweepTuning saved = table.sweeps;
  const int64_t N = 3, M = 9000;
  struct Case {
    double rho;
    int halo;         // the tuning's
    std::string run;  // the method reported
  };
  for (const Case& c :
       {Case{0.86, 0, "red-black+fused+windows(halo 256)"}, Case{0.87, 0, "red-black+fused"},
        Case{0.70, 0, "red-black+fused+windows(halo 112)"},
        Case{0.56, 0, "red-black+fused+windows(halo 64)"},
        Case{0.56, 64, "red-black+fused+windows(halo 64)"},
        Case{0.57, 64, "red-black+fused"}, Case{0.57, 65, "red-black+fused+windows(halo 80)"},
        Case{0.56, 200, "red-black+fused+windows(halo 208)"}}) {
    cuda::SweepTuning t;
    t.window = 1;
    t.window_halo = c.halo;
    table.sweeps = t;
    for (int64_t e : {int64_t{1} * M + 4000, int64_t{2} * M + M - 1, int64_t{0}}) {
      auto s = Experiment<double>(1, N, M);
      // (|a| + |c|) / |b| = rho at element e, the couplings past the line left out.
      const int64_t k = e % M;
      const double off = (k > 0 ? std::abs(s.a["aC"][e]) : 0.0) +
                         (k + 1 < M ? std::abs(s.a["bC"][e]) : 0.0);
      s.a["cC"][e] = off / c.rho;
      SCOPED_TRACE(::testing::Message() << "rho " << c.rho << " halo " << c.halo << " element "
                                        << e);
      Compare(s, BlockMethod::kRedBlack, {6, 0, false}, 1e-12);
      EXPECT_EQ(MethodRun(s, BlockMethod::kRedBlack), c.run);
    }
  }
  // Without the tuning (auto), rows of 9000 run the cluster form either way; over 16384 the
  // windows or, where the check fails, the two-kernel half-sweeps.
  table.sweeps = saved;
  auto s = Experiment<double>(1, 2, 16400);
  s.a["cC"][100] = (std::abs(s.a["aC"][100]) + std::abs(s.a["bC"][100])) / 0.95;
  Compare(s, BlockMethod::kJacobi, {3, 0, false}, 1e-12);
  EXPECT_EQ(MethodRun(s, BlockMethod::kJacobi), "jacobi");
}

// Many short rows, many sweeps: thousands of tiny tasks racing on the per-row counters. Also
// says which path ran.
TEST(CudaBlock, FusedSweepsManyShortRows) {
  REQUIRE_GPU();
  for (auto m : {BlockMethod::kRedBlack, BlockMethod::kJacobi, BlockMethod::kGaussSeidel}) {
    Compare(Experiment<double>(1, 3000, 5), m, {100, 0, false}, 1e-12);
    EXPECT_EQ(MethodRun(Experiment<double>(1, 257, 33), m, 3),
              std::string(MethodName(m)) + "+fused");
  }
  // Rows over 4096 on a cluster of blocks (fused, red-black and jacobi in float64 streamed) up
  // to 16384; over that red-black and jacobi windowed, gauss-seidel the two-kernel half-sweeps.
  for (int64_t M : {5000, 12000, 16385}) {
    const auto s = Experiment<double>(1, 3, M);
    for (auto m : {BlockMethod::kRedBlack, BlockMethod::kJacobi, BlockMethod::kGaussSeidel}) {
      const std::string form = M <= 16384                       ? "+fused"
                               : m == BlockMethod::kGaussSeidel ? ""
                                                                : "+fused+windows(halo 64)";
      EXPECT_EQ(MethodRun(s, m, 3), std::string(MethodName(m)) + form) << M;
    }
  }
  // One sweep over 16384 skips the windows' check (a third of a sweep): the two-kernel path.
  auto s = Experiment<double>(1, 3, 16385);
  Compare(s, BlockMethod::kRedBlack, {1, 0, false}, 1e-12);
  EXPECT_EQ(MethodRun(s, BlockMethod::kRedBlack, 1), "red-black");
}

TEST(CudaBlock, ConjugateGradientsMatchTheCpu) {
  REQUIRE_GPU();
  Compare(Experiment<double>(2, 96, 80), BlockMethod::kCg, {5000, 1e-10, false}, 1e-8);
  Compare(Experiment<float>(2, 40, 40), BlockMethod::kCg, {5000, 1e-5, false}, 1e-3);
  // auto on the GPU: multigrid-cg for a symmetric system with a tolerance.
  auto s = Experiment<double>(2, 32, 32);
  std::vector<double> y(32 * 32);
  SystemStatus st;
  auto info = Cuda()->Solve(s.P(), BlockMethod::kAuto, {5000, 1e-10, false},
                            BlockOutput<double>{y.data(), &st}, SolveControl{});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->method, "multigrid-cg");
  EXPECT_EQ(st, SystemStatus::kOk);
  for (double v : y) ASSERT_NEAR(v, 1.0, 1e-7);
}

// Auto's choice under a one-shot solve tests the symmetry on the device (IsSymmetricDevice),
// once the arrays are there: the same answer as the host's IsSymmetric, bit for bit, for
// random symmetric couplings of both signs broken (or kept within the test's tolerance of 64
// ulps) at single couplings anywhere -- the first and last of a line and of a block row
// included -- and with NaN, at shapes with N or M of 1; float64 and float32. Auto then runs
// multigrid-cg exactly where the host's test says symmetric.
template <typename T>
void ExpectDeviceSymmetryAsTheHost(int64_t N, int64_t M, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  auto s = Experiment<T>(1, N, M);
  for (int64_t e = 0; e < N * M; ++e) s.a["bC"][e] = T(u(rng)), s.a["cB"][e] = T(u(rng));
  for (int64_t i = 0; i < N; ++i)
    for (int64_t k = 0; k < M; ++k) {
      const int64_t e = i * M + k;
      s.a["aC"][e] = k > 0 ? s.a["bC"][e - 1] : T(0);
      s.a["cA"][e] = i > 0 ? s.a["cB"][e - M] : T(0);
      if (k + 1 == M) s.a["bC"][e] = 0;
      if (i + 1 == N) s.a["cB"][e] = 0;
      s.a["cC"][e] = T(0.05) + std::abs(s.a["aC"][e]) + std::abs(s.a["bC"][e]) +
                     std::abs(s.a["cA"][e]) + std::abs(s.a["cB"][e]);
    }
  const int64_t n = N * M;
  std::vector<T*> dev(4, nullptr);
  for (T*& d : dev) ASSERT_EQ(cudaMalloc(&d, size_t(n) * sizeof(T)), cudaSuccess);
  const char* names[4] = {"aC", "bC", "cA", "cB"};
  auto same = [&](const std::string& what) -> bool {
    for (int q = 0; q < 4; ++q)
      if (cudaMemcpy(dev[q], s.a[names[q]].data(), size_t(n) * sizeof(T),
                     cudaMemcpyHostToDevice) != cudaSuccess) {
        ADD_FAILURE() << "cudaMemcpy";
        return false;
      }
    const BlockTridiagonalProblem<T> dp{N, M, dev[0], nullptr, dev[1], dev[2], dev[3],
                                        nullptr, nullptr};
    auto got = cuda::IsSymmetricDevice(dp, nullptr);
    const bool want = IsSymmetric(s.P());
    if (!got.ok()) {
      ADD_FAILURE() << got.status();
      return want;
    }
    EXPECT_EQ(*got, want) << what << " N " << N << " M " << M;
    return want;
  };
  EXPECT_TRUE(same("as made"));
  // One coupling changed by r ulps of itself (or made NaN), then put back.
  const T eps = std::numeric_limits<T>::epsilon();
  std::vector<std::pair<const char*, int64_t>> at = {{"aC", 1}, {"aC", n - 1}, {"cA", M},
                                                     {"cA", n - 1}, {"bC", 0}, {"cB", 0}};
  for (int q = 0; q < 6; ++q)
    at.push_back({names[rng() % 4], int64_t(rng() % uint64_t(n))});
  [[maybe_unused]] int kept = 0;
  int broken = 0;
  for (auto [name, e] : at) {
    if (e >= n) continue;
    T& v = s.a[name][size_t(e)];
    const T was = v;
    for (double r : {16.0, -63.0, 63.0, 65.0, -65.0, 200.0, std::nan("")}) {
      v = std::isnan(r) ? T(NAN) : T(was * (1 + r * eps));
      if (same(std::string(name) + "[" + std::to_string(e) + "] by " + std::to_string(r)))
        ++kept;
      else
        ++broken;
    }
    v = was;
  }
  if (N * M > 1) {
    EXPECT_GT(broken, 0);
  }
  // Auto runs multigrid-cg exactly where the test says symmetric.
  for (bool keep : {true, false}) {
    if (!keep) {
      s.a["aC"][size_t(n - 1)] += T(0.25);
    }
    const bool symmetric = same("auto");
    std::vector<T> y(static_cast<size_t>(n));
    SystemStatus st;
    auto info = Cuda()->Solve(s.P(), BlockMethod::kAuto, {500, sizeof(T) == 8 ? 1e-10 : 1e-5, false},
                              BlockOutput<T>{y.data(), &st}, SolveControl{});
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->method.rfind("multigrid-cg", 0) == 0, symmetric) << info->method;
  }
  for (T* d : dev) cudaFree(d);
}

TEST(CudaBlock, AutoTestsSymmetryOnTheDeviceAsTheHostDoes) {
  REQUIRE_GPU();
  uint64_t seed = 1;
  for (auto [N, M] : {std::pair<int64_t, int64_t>{1, 1}, {1, 9}, {9, 1}, {7, 128}, {128, 7},
                      {333, 1000}}) {
    ExpectDeviceSymmetryAsTheHost<double>(N, M, seed++);
    ExpectDeviceSymmetryAsTheHost<float>(N, M, seed++);
  }
}

TEST(CudaBlock, MultigridCgMatchesTheCpu) {
  REQUIRE_GPU();
  // The thesis' experiment 2 at N, M in {1, 2, 7, 128, 1000}, N != M included, and beyond:
  // the same iterations as the CPU (+-1) and the same converged answer.
  for (auto [N, M] : {std::pair<int64_t, int64_t>{1, 1}, {2, 2}, {7, 7}, {7, 128}, {128, 7},
                      {128, 128}, {1000, 1000}, {1000, 333}, {2048, 2048}}) {
    Compare(Experiment<double>(2, N, M), BlockMethod::kMultigridCg, {200, 1e-10, false}, 1e-8);
    if (N <= 1000)
      Compare(Experiment<float>(2, N, M), BlockMethod::kMultigridCg, {200, 1e-5, false}, 1e-3);
  }
  // Random symmetric dominant couplings of both signs.
  auto s = Experiment<double>(1, 300, 200);
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(-1, 1);
  const int64_t N = 300, M = 200;
  for (int64_t e = 0; e < N * M; ++e) s.a["bC"][e] = u(rng), s.a["cB"][e] = u(rng);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t k = 0; k < M; ++k) {
      const int64_t e = i * M + k;
      s.a["aC"][e] = k > 0 ? s.a["bC"][e - 1] : 0.0;
      s.a["cA"][e] = i > 0 ? s.a["cB"][e - M] : 0.0;
      if (k + 1 == M) s.a["bC"][e] = 0;
      if (i + 1 == N) s.a["cB"][e] = 0;
      s.a["cC"][e] = 0.05 + std::abs(s.a["aC"][e]) + std::abs(s.a["bC"][e]) +
                     std::abs(s.a["cA"][e]) + std::abs(s.a["cB"][e]);
    }
  Compare(s, BlockMethod::kMultigridCg, {200, 1e-12, false}, 1e-9);
  // Not definite (one negative diagonal; the matrix is nonsingular): multigrid-cg by name
  // does not run and says why, NOT_CONVERGED with the initial guess (zeros) -- never
  // SINGULAR, as the CPU reference.
  s.a["cC"][17] = -1;
  std::vector<double> y(N * M, 1.0);
  SystemStatus st;
  auto info = Cuda()->Solve(s.P(), BlockMethod::kMultigridCg, {200, 1e-12, false},
                            BlockOutput<double>{y.data(), &st}, SolveControl{});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(st, SystemStatus::kNotConverged);
  EXPECT_EQ(info->method, "multigrid-cg (not run: not definite: diagonals of both signs)");
  for (double v : y) ASSERT_EQ(v, 0.0);
}

TEST(CudaBlock, MultigridBicgstabMatchesTheCpu) {
  REQUIRE_GPU();
  // Not symmetric: the thesis' experiment 1, N != M included, and an upwinded
  // convection-diffusion operator; the same iterations as the CPU (+-1), the same answer.
  for (auto [N, M] : {std::pair<int64_t, int64_t>{1, 1}, {2, 2}, {7, 128}, {128, 7},
                      {300, 200}, {1000, 1000}}) {
    Compare(Experiment<double>(1, N, M), BlockMethod::kMultigridBicgstab, {300, 1e-10, false},
            1e-8);
  }
  Compare(Experiment<float>(1, 100, 90), BlockMethod::kMultigridBicgstab, {300, 1e-5, false},
          1e-3);
  auto s = Experiment<double>(2, 256, 256);
  for (int64_t i = 0; i < 256; ++i)
    for (int64_t k = 0; k < 256; ++k) {
      const int64_t e = i * 256 + k;
      if (k > 0) s.a["aC"][e] -= 0.5, s.a["cC"][e] += 0.5;
      if (i > 0) s.a["cA"][e] -= 0.5, s.a["cC"][e] += 0.5;
    }
  Compare(s, BlockMethod::kMultigridBicgstab, {300, 1e-10, false}, 1e-6);
}

TEST(CudaBlock, SingularLineIsReported) {
  REQUIRE_GPU();
  auto s = Experiment<double>(1, 6, 5);
  for (const char* k : {"aC", "cC", "bC"}) s.a[k][7] = 0;  // a zero row in C_1
  std::vector<double> y(30);
  SystemStatus st;
  auto info = Cuda()->Solve(s.P(), BlockMethod::kRedBlack, {8, 0, false},
                            BlockOutput<double>{y.data(), &st}, SolveControl{});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(st, SystemStatus::kSingular);
  for (double v : y) EXPECT_EQ(v, 0.0);
}

// A zero row in the part of a line that the second block of a cluster holds (rows of 1000 over
// 2 blocks of 64 threads x 8 rows: elements 512 .. 999), and in a 6000-long row (2 blocks of
// 256 x 16, a block a task and streamed), for each method.
TEST(CudaBlock, SingularLineOnAClusterIsReported) {
  REQUIRE_GPU();
  cuda::TuningTable table = cuda::ActiveTuning();  // the test's own, in use until it returns
  const cuda::UseTuning use(&table);
  const cuda::SweepTuning saved = table.sweeps;
  for (auto [M, t] : {std::pair{int64_t{1000}, cuda::SweepTuning{true, 8, 1, 2, -1}},
                      std::pair{int64_t{1000}, cuda::SweepTuning{true, 8, -1, 2, -1}},
                      std::pair{int64_t{6000}, cuda::SweepTuning{true, 16, 1, 2, -1}},
                      std::pair{int64_t{6000}, cuda::SweepTuning{}}}) {
    table.sweeps = t;
    for (auto m : {BlockMethod::kRedBlack, BlockMethod::kJacobi, BlockMethod::kGaussSeidel}) {
      auto s = Experiment<double>(1, 4, M);
      const int64_t e = 2 * M + M - 300;  // row 2, element M - 300
      for (const char* k : {"aC", "cC", "bC"}) s.a[k][size_t(e)] = 0;
      std::vector<double> y(size_t(4 * M), 1.0);
      SystemStatus st;
      auto info = Cuda()->Solve(s.P(), m, {4, 0, false}, BlockOutput<double>{y.data(), &st},
                                SolveControl{});
      ASSERT_TRUE(info.ok()) << info.status();
      EXPECT_EQ(info->method, std::string(MethodName(m)) + "+fused");
      EXPECT_EQ(st, SystemStatus::kSingular) << MethodName(m) << " M " << M;
      for (double v : y) ASSERT_EQ(v, 0.0);
    }
  }
  table.sweeps = saved;
}

// Issue 33: the thesis' experiment 2 as chapter 5 writes it (-4 inside, couplings +1: symmetric
// negative definite) through auto with a tolerance on the GPU: multigrid-cg with the sign
// folded in, as many iterations as the positive form, never SINGULAR; and an indefinite
// symmetric system (experiment 2 shifted) through auto: the device's CG stops and the CPU
// reference's BiCGStab takes over on the host -- converged or NOT_CONVERGED, never SINGULAR.
TEST(CudaBlock, AutoNeverAnswersSingularForANegativeDefiniteSystem) {
  REQUIRE_GPU();
  for (auto [N, M] : {std::pair<int64_t, int64_t>{32, 32}, {64, 64}, {128, 96}, {1000, 1000}}) {
    auto pos = Experiment<double>(2, N, M);
    auto neg = pos;
    for (auto& [k, v] : neg.a)
      for (double& x : v) x = -x;
    std::vector<double> yp(N * M), yn(N * M, std::nan(""));
    SystemStatus sp, sn = SystemStatus::kDiverged;
    auto ip = Cuda()->Solve(pos.P(), BlockMethod::kAuto, {500, 1e-10, false},
                            BlockOutput<double>{yp.data(), &sp}, SolveControl{});
    auto in = Cuda()->Solve(neg.P(), BlockMethod::kAuto, {500, 1e-10, false},
                            BlockOutput<double>{yn.data(), &sn}, SolveControl{});
    ASSERT_TRUE(ip.ok() && in.ok());
    EXPECT_EQ(sn, SystemStatus::kOk) << N << " x " << M << ": " << in->method;
    EXPECT_EQ(in->method, "multigrid-cg (negated: negative definite)");
    EXPECT_EQ(in->iterations, ip->iterations) << N << " x " << M;
    EXPECT_LE(in->residual, 1e-10);
    for (double v : yn) ASSERT_NEAR(v, 1.0, 1e-6) << N << " x " << M;
    // Named cg and multigrid-bicgstab, which the issue saw fail the same way.
    for (auto m : {BlockMethod::kCg, BlockMethod::kMultigridBicgstab}) {
      if (m == BlockMethod::kCg && N > 128) continue;
      SystemStatus st = SystemStatus::kDiverged;
      auto r = Cuda()->Solve(neg.P(), m, {5000, 1e-9, false}, BlockOutput<double>{yn.data(), &st},
                             SolveControl{});
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(st, SystemStatus::kOk) << MethodName(m) << " " << N << " x " << M;
    }
  }
  // Float32.
  auto f = Experiment<float>(2, 64, 48);
  for (auto& [k, v] : f.a)
    for (float& x : v) x = -x;
  std::vector<float> y(64 * 48);
  SystemStatus st = SystemStatus::kDiverged;
  auto r = Cuda()->Solve(f.P(), BlockMethod::kAuto, {200, 1e-5, false},
                         BlockOutput<float>{y.data(), &st}, SolveControl{});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(st, SystemStatus::kOk) << r->method;
  for (float v : y) ASSERT_NEAR(v, 1.0f, 1e-3f);
}

TEST(CudaBlock, AutoFallsBackOnTheHostForAnIndefiniteSystem) {
  REQUIRE_GPU();
  for (auto [n, sigma] : {std::pair<int64_t, double>{16, 0.3}, {32, 0.05}}) {
    auto s = Experiment<double>(2, n, n);
    for (int64_t e = 0; e < n * n; ++e) {
      s.a["cC"][e] -= sigma;
      s.a["f"][e] -= sigma;  // the exact solution stays all ones
    }
    std::vector<double> y(n * n, std::nan(""));
    SystemStatus st = SystemStatus::kDiverged;
    auto r = Cuda()->Solve(s.P(), BlockMethod::kAuto, {400, 1e-8, false},
                           BlockOutput<double>{y.data(), &st}, SolveControl{});
    ASSERT_TRUE(r.ok());
    EXPECT_NE(st, SystemStatus::kSingular) << r->method;
    EXPECT_NE(r->method.find("bicgstab"), std::string::npos) << r->method;
    EXPECT_NE(r->method.find("(host)"), std::string::npos) << r->method;
    if (st == SystemStatus::kOk) {
      for (double v : y) ASSERT_NEAR(v, 1.0, 1e-4) << r->method;
    }
    std::printf("GPU auto, indefinite %lld^2: %s, %s\n", (long long)n,
                std::string(StatusName(st)).c_str(), r->method.c_str());
  }
}

// auto without symmetry: red-black on the device; a line block with a zero pivot in a
// nonsingular matrix sends it to the host's BiCGStab, as the CPU's auto goes on from
// gauss-seidel -- never SINGULAR.
TEST(CudaBlock, AutoFallsBackWhereTheLineSolvesCannotRun) {
  REQUIRE_GPU();
  auto s = Experiment<double>(1, 6, 6);
  s.a["cC"][6] = 0;  // C_1 starts with a zero pivot
  std::vector<double> y(36, std::nan(""));
  SystemStatus st = SystemStatus::kDiverged;
  auto r = Cuda()->Solve(s.P(), BlockMethod::kAuto, {500, 1e-10, false},
                         BlockOutput<double>{y.data(), &st}, SolveControl{});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(st, SystemStatus::kSingular) << r->method;
  EXPECT_NE(r->method.find("(a line block is singular) -> "), std::string::npos) << r->method;
  EXPECT_NE(r->method.find("(host)"), std::string::npos) << r->method;
  std::printf("GPU auto, singular line: %s, %s\n", std::string(StatusName(st)).c_str(),
              r->method.c_str());
  // By name, red-black reports the vanished pivot, as before.
  auto rb = Cuda()->Solve(s.P(), BlockMethod::kRedBlack, {10, 0, false},
                          BlockOutput<double>{y.data(), &st}, SolveControl{});
  ASSERT_TRUE(rb.ok());
  EXPECT_EQ(st, SystemStatus::kSingular);
}

// ---- progress and residual history on the device ------------------------------------------

struct Reported {
  std::vector<std::pair<int64_t, double>> calls;
  SolveInfo info;
  SystemStatus status = SystemStatus::kDiverged;
};

template <typename T>
Reported SolveReporting(const Sys<T>& s, BlockMethod m, BlockOptions o, int64_t limit,
                        std::vector<T>* y) {
  Reported r;
  y->assign(size_t(s.N * s.M), T(std::nan("")));
  SolveControl c;
  c.progress = [&r](int64_t it, double res) { r.calls.push_back({it, res}); };
  c.history_limit = limit;
  auto info = Cuda()->Solve(s.P(), m, o, BlockOutput<T>{y->data(), &r.status}, c);
  EXPECT_TRUE(info.ok()) << info.status();
  if (info.ok()) r.info = *info;
  return r;
}

void ExpectHistory(const Reported& r, int64_t limit, const std::string& what) {
  testing::ExpectHistoryConsistent(r.calls, r.info, limit, 1e-5, what, false);
}

TEST(CudaBlock, ProgressAndHistoryFromEveryMethod) {
  REQUIRE_GPU();
  for (auto m : {BlockMethod::kCg, BlockMethod::kMultigridCg, BlockMethod::kMultigridBicgstab,
                 BlockMethod::kRedBlack, BlockMethod::kJacobi, BlockMethod::kGaussSeidel}) {
    const std::string name(MethodName(m));
    const bool lines = m == BlockMethod::kRedBlack || m == BlockMethod::kJacobi ||
                       m == BlockMethod::kGaussSeidel;
    const int64_t n = lines ? 24 : 96;
    std::vector<double> yd;
    auto d = SolveReporting(Experiment<double>(2, n, n), m, {20000, 1e-9, false}, 64, &yd);
    EXPECT_EQ(d.status, SystemStatus::kOk) << name;
    ExpectHistory(d, 64, name + " float64");
    // The CPU reference runs the same iterations: its history has the same length and end.
    std::vector<double> yc(size_t(n * n));
    SystemStatus sc;
    SolveControl cc;
    cc.history_limit = 64;
    auto c = cpu::SolveBlockTridiagonal(Experiment<double>(2, n, n).P(), m, {20000, 1e-9, false},
                                        BlockOutput<double>{yc.data(), &sc}, cc);
    ASSERT_TRUE(c.ok());
    EXPECT_NEAR(double(d.info.residual_history.size()), double(c->residual_history.size()), 2)
        << name;
    std::vector<float> yf;
    auto f = SolveReporting(Experiment<float>(2, n, n), m, {20000, 1e-4, false}, 64, &yf);
    EXPECT_EQ(f.status, SystemStatus::kOk) << name;
    ExpectHistory(f, 64, name + " float32");
  }
  // Without a tolerance the device checks every 1024 sweeps (one launch of fused sweeps or
  // more between): L = 3000 reports at 0, 1024, 2048 and ends at 3000.
  std::vector<double> y;
  auto fixed = SolveReporting(Experiment<double>(1, 64, 64), BlockMethod::kRedBlack,
                              {3000, 0, false}, 100, &y);
  ExpectHistory(fixed, 100, "red-black, L = 3000");
  ASSERT_EQ(fixed.info.residual_history.size(), 4u);
  EXPECT_EQ(fixed.info.residual_history[1].iteration, 1024);
  EXPECT_EQ(fixed.info.residual_history[2].iteration, 2048);
}

// Asked for nothing, a solve keeps no history; asked, its answer is the same to the bit.
TEST(CudaBlock, ProgressChangesNoAnswer) {
  REQUIRE_GPU();
  for (auto m : {BlockMethod::kMultigridCg, BlockMethod::kRedBlack}) {
    auto s = Experiment<double>(2, 64, 64);
    std::vector<double> y0(64 * 64), y1;
    SystemStatus st;
    auto plain = Cuda()->Solve(s.P(), m, {5000, 1e-9, false}, BlockOutput<double>{y0.data(), &st},
                               SolveControl{});
    ASSERT_TRUE(plain.ok());
    EXPECT_TRUE(plain->residual_history.empty());
    auto r = SolveReporting(s, m, {5000, 1e-9, false}, 1024, &y1);
    EXPECT_EQ(y0, y1) << MethodName(m);
    EXPECT_EQ(plain->iterations, r.info.iterations);
    EXPECT_EQ(plain->residual, r.info.residual);
  }
}

// auto's host fallback after the device's CG stops: one history, the count going on.
TEST(CudaBlock, FallbackHistoryContinuesOnTheHost) {
  REQUIRE_GPU();
  auto s = Experiment<double>(2, 32, 32);
  for (int64_t e = 0; e < 32 * 32; ++e) {
    s.a["cC"][e] -= 0.05;
    s.a["f"][e] -= 0.05;
  }
  std::vector<double> y;
  auto r = SolveReporting(s, BlockMethod::kAuto, {400, 1e-8, false}, 1024, &y);
  ASSERT_NE(r.info.method.find("(host)"), std::string::npos) << r.info.method;
  ExpectHistory(r, 1024, "auto, device then host");
  auto small = SolveReporting(s, BlockMethod::kAuto, {400, 1e-8, false}, 8, &y);
  ExpectHistory(small, 8, "auto, device then host, 8 points");
}

// The tuning table's rows are keyed by compute capability: sm_90 (the H100, H200) gets the row
// measured there, any other architecture the default row. Needs no device.
TEST(TuningTable, RowsKeyedByComputeCapability) {
  ASSERT_FALSE(cuda::TuningRows().empty());
  for (const cuda::TuningRow& row : cuda::TuningRows()) {
    EXPECT_GT(row.compute_capability, 0);
    EXPECT_EQ(row.table.compute_capability, row.compute_capability);
    EXPECT_NE(std::string(row.evidence).find("docs/kernels"), std::string::npos);
    EXPECT_EQ(cuda::TuningTable::ForComputeCapability(row.compute_capability).compute_capability,
              row.compute_capability);
  }
  cudaDeviceProp prop{};
  prop.major = 9;
  prop.minor = 0;
  EXPECT_EQ(cuda::TuningTable::For(prop).compute_capability, 90);
  for (auto [major, minor] : {std::pair{8, 0}, {8, 6}, {8, 9}, {10, 0}, {12, 0}}) {
    prop.major = major;
    prop.minor = minor;
    const cuda::TuningTable t = cuda::TuningTable::For(prop);
    EXPECT_EQ(t.compute_capability, 0) << major << "." << minor;
    EXPECT_EQ(t.compute_capability, cuda::DefaultTuningRow().table.compute_capability);
  }
  EXPECT_NE(std::string(cuda::DefaultTuningRow().evidence).find("sm_90"), std::string::npos);
  // No table in use: the default row's knobs.
  EXPECT_EQ(cuda::ActiveTuning().compute_capability, 0);
}

}  // namespace
}  // namespace trisolve
