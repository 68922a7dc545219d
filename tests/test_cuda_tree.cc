// The CUDA backend's tree solves against the CPU reference. Skips, saying so, without a GPU.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "gtest/gtest.h"
#include "trisolve/backend.h"
#include "trisolve/examples.h"
#include "trisolve/swc.h"
#include "trisolve/tree.h"

namespace trisolve {
namespace {

using ::trisolve::testing::Cuda;


enum class Shape { kChain, kStar, kRandom, kMorphology };

std::vector<int32_t> Parents(Shape shape, int64_t n, uint64_t seed) {
  std::vector<int32_t> p(n);
  std::mt19937_64 rng(seed);
  p[0] = -1;
  for (int64_t i = 1; i < n; ++i) {
    switch (shape) {
      case Shape::kChain: p[i] = int32_t(i - 1); break;
      case Shape::kStar: p[i] = 0; break;
      default:  // mostly cables, sometimes a branch from anywhere above
        p[i] = std::uniform_real_distribution<double>(0, 1)(rng) < 0.85
                   ? int32_t(i - 1)
                   : int32_t(std::uniform_int_distribution<int64_t>(0, i - 1)(rng));
    }
  }
  return p;
}

template <typename T>
void Compare(const std::vector<int32_t>& parent, int64_t batch, Layout layout, bool per_system,
             double tol) {
  const int64_t n = int64_t(parent.size());
  std::mt19937_64 rng(n + batch);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<T> lower(n * batch), upper(n * batch), diag(n * batch, T(0)), rhs(n * batch);
  std::vector<int32_t> parents;
  for (int64_t s = 0; s < (per_system ? batch : 1); ++s) parents.insert(parents.end(), parent.begin(), parent.end());
  for (int64_t s = 0; s < batch; ++s) {
    std::vector<double> dg(n, 0.0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t e = ElementIndex(layout, batch, n, s, i);
      lower[e] = T(u(rng));
      upper[e] = T(u(rng));
      rhs[e] = T(u(rng));
      dg[i] += 1 + std::abs(double(lower[e]));
      if (i > 0) dg[parent[i]] += std::abs(double(upper[e]));
    }
    for (int64_t i = 0; i < n; ++i) diag[ElementIndex(layout, batch, n, s, i)] = T(dg[i]);
  }
  if (batch >= 3) diag[ElementIndex(layout, batch, n, 1, n - 1)] = T(0);  // a singular cell
  TreeProblem<T> p;
  p.batch = batch;
  p.n = n;
  p.layout = layout;
  p.parent = parents.data();
  p.parent_per_system = per_system && batch > 1;
  p.lower = lower.data();
  p.upper = upper.data();
  p.diag = diag.data();
  p.rhs = rhs.data();
  std::vector<T> xg(n * batch, T(std::nan(""))), xc(n * batch);
  std::vector<SystemStatus> sg(batch), sc(batch);
  auto info = Cuda()->Solve(p, TreeMethod::kAuto, TreeOutput<T>{xg.data(), sg.data()}, SolveControl{});
  ASSERT_TRUE(info.ok()) << info.status();
  if (!p.parent_per_system) {
    EXPECT_EQ(info->method, "hines-batch");
  }
  cpu::SolveTree(p, TreeMethod::kHines, TreeOutput<T>{xc.data(), sc.data()});
  double worst = 0;
  for (int64_t s = 0; s < batch; ++s) {
    ASSERT_EQ(sg[s], sc[s]) << "system " << s;
    double dm = 0, xm = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t e = ElementIndex(layout, batch, n, s, i);
      if (sc[s] != SystemStatus::kOk) {
        ASSERT_EQ(xg[e], T(0));
        continue;
      }
      dm = std::max(dm, std::abs(double(xg[e]) - double(xc[e])));
      xm = std::max(xm, std::abs(double(xc[e])));
    }
    if (xm > 0) worst = std::max(worst, dm / xm);
  }
  EXPECT_LE(worst, tol);
  EXPECT_LE(TreeBackwardError(p, xg.data(), sg.data()), sizeof(T) == 8 ? 1e-15 : 1e-6);
}

class CudaTree : public ::testing::TestWithParam<std::tuple<Shape, Layout>> {};

TEST_P(CudaTree, MatchesTheCpuReference) {
  REQUIRE_GPU();
  const auto [shape, layout] = GetParam();
  std::vector<int32_t> parent;
  if (shape == Shape::kMorphology) {
    auto m = ReadSwc(std::string(TRISOLVE_TEST_DATA) + "/neuron_10-2012-02-09-001.CNG.swc");
    ASSERT_TRUE(m.ok());
    parent = m->parent;
  } else {
    parent = Parents(shape, shape == Shape::kStar ? 500 : 4000, 7);
  }
  Compare<double>(parent, 1024, layout, false, 1e-12);
  Compare<float>(parent, 300, layout, false, 1e-3);
  Compare<double>(parent, 5, layout, true, 1e-12);  // per-system trees: host fallback
}

std::string TreeName(const ::testing::TestParamInfo<std::tuple<Shape, Layout>>& i) {
  const char* names[] = {"chain", "star", "random", "morphology"};
  return std::string(names[int(std::get<0>(i.param))]) +
         (std::get<1>(i.param) == Layout::kFlat ? "_flat" : "_interleaved");
}

INSTANTIATE_TEST_SUITE_P(Trees, CudaTree,
                         ::testing::Combine(::testing::Values(Shape::kChain, Shape::kStar,
                                                              Shape::kRandom, Shape::kMorphology),
                                            ::testing::Values(Layout::kFlat, Layout::kInterleaved)),
                         TreeName);

}  // namespace
}  // namespace trisolve
