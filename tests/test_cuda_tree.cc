// The CUDA backend's tree solves against the CPU reference. Skips, saying so, without a GPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda_test_util.h"
#include "error_measure.h"
#include "tree_cells.h"
#include "gtest/gtest.h"
#include "trisolve/backend.h"
#include "trisolve/examples.h"
#include "trisolve/reference/tree.h"
#include "trisolve/swc.h"
#include "trisolve/tree.h"
#include "tree/cells.h"
#include "tree/tree.h"
#include "runtime/memory_pool.h"

namespace trisolve {
namespace {

using ::trisolve::testing::Cuda;


enum class Shape { kChain, kStar, kRandom, kMorphology, kRecursive, kRecursiveDfs };

// A random recursive tree (parent uniform below i: depth ~ e ln n, mostly short cables),
// optionally renumbered depth-first.
std::vector<int32_t> Recursive(int64_t n, uint64_t seed, bool dfs) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p(n);
  p[0] = -1;
  for (int64_t i = 1; i < n; ++i)
    p[i] = int32_t(std::uniform_int_distribution<int64_t>(0, i - 1)(rng));
  if (!dfs) return p;
  std::vector<std::vector<int32_t>> kids(n);
  for (int64_t i = 1; i < n; ++i) kids[p[i]].push_back(int32_t(i));
  std::vector<int32_t> label(n), stack = {0};
  int32_t next = 0;
  while (!stack.empty()) {
    const int32_t v = stack.back();
    stack.pop_back();
    label[v] = next++;
    for (auto it = kids[v].rbegin(); it != kids[v].rend(); ++it) stack.push_back(*it);
  }
  std::vector<int32_t> q(n);
  for (int64_t i = 0; i < n; ++i) q[label[i]] = i == 0 ? -1 : label[p[i]];
  return q;
}

std::vector<int32_t> Parents(Shape shape, int64_t n, uint64_t seed) {
  std::vector<int32_t> p(n);
  std::mt19937_64 rng(seed);
  p[0] = -1;
  for (int64_t i = 1; i < n; ++i) {
    switch (shape) {
      case Shape::kRecursive: return Recursive(n, seed, false);
      case Shape::kRecursiveDfs: return Recursive(n, seed, true);
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
             double tol, TreeMethod method = TreeMethod::kAuto, const char* expect = nullptr) {
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
  // A singular cell: a leaf's row is zero, which every elimination order must find.
  if (batch >= 3) {
    diag[ElementIndex(layout, batch, n, 1, n - 1)] = T(0);
    lower[ElementIndex(layout, batch, n, 1, n - 1)] = T(0);
  }
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
  auto info = Cuda()->Solve(p, method, TreeOutput<T>{xg.data(), sg.data()}, SolveControl{});
  ASSERT_TRUE(info.ok()) << info.status();
  if (expect) {
    // Cells that fit in shared memory run one block a cell (which auto picks then is
    // checked in CudaTreeAuto below): the contraction for auto, the cables when asked for.
    const bool block_ok =
        !p.parent_per_system &&
        ((info->method == "contraction-block" &&
          (method == TreeMethod::kAuto || method == TreeMethod::kContraction)) ||
         (info->method == "cables-block" && method == TreeMethod::kCables));
    if (!block_ok) {
      EXPECT_EQ(info->method, expect) << "n = " << n << ", batch " << batch;
    }
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
      dm = testing::WorseOf(dm, std::abs(double(xg[e]) - double(xc[e])));
      xm = testing::WorseOf(xm, std::abs(double(xc[e])));
    }
    worst = testing::WorseOf(worst, xm > 0 ? dm / xm : dm);
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
  // Enough cells of one morphology to fill the GPU: one thread a cell (auto from 2048 on).
  Compare<double>(parent, 2048, layout, false, 1e-12, TreeMethod::kAuto, "hines-batch");
  Compare<float>(parent, 300, layout, false, 1e-3, TreeMethod::kHines, "hines-batch");
  Compare<double>(parent, 300, layout, false, 1e-12, TreeMethod::kAuto, "cables");
  // Per-cell trees: one thread a cell reading its own parent array.
  Compare<double>(parent, 5, layout, true, 1e-12, TreeMethod::kAuto, "hines-batch");
  // A few cells: the cable elimination (auto), and forced either way.
  Compare<double>(parent, 3, layout, false, 1e-12, TreeMethod::kAuto, "cables");
  Compare<float>(parent, 4, layout, false, 1e-3, TreeMethod::kCables, "cables");
  Compare<double>(parent, 64, layout, false, 1e-12, TreeMethod::kCables, "cables");
  Compare<double>(parent, 3, layout, false, 1e-12, TreeMethod::kHines, "hines-batch");
}

// One large tree across the GPU: every shape, sizes around the long-cable threshold (512) and
// the shared-memory limit of the batch kernel, up to 2^20 nodes; chains of more than 512
// nodes go through the partitioned tridiagonal kernel.
class CudaCables : public ::testing::TestWithParam<std::tuple<Shape, int64_t>> {};

TEST_P(CudaCables, MatchesTheCpuReference) {
  REQUIRE_GPU();
  const auto [shape, n] = GetParam();
  const auto parent = Parents(shape, n, uint64_t(n) * 3 + int(shape));
  for (Layout layout : {Layout::kFlat, Layout::kInterleaved}) {
    Compare<double>(parent, 1, layout, false, 1e-11, TreeMethod::kAuto, "cables");
    Compare<double>(parent, 3, layout, false, 1e-11, TreeMethod::kCables, "cables");
    Compare<float>(parent, 1, layout, false, 2e-3, TreeMethod::kCables, "cables");
  }
}

std::string CablesName(const ::testing::TestParamInfo<std::tuple<Shape, int64_t>>& i) {
  const char* names[] = {"chain", "star", "random", "morphology", "recursive", "recursive_dfs"};
  return std::string(names[int(std::get<0>(i.param))]) + "_" +
         std::to_string(std::get<1>(i.param));
}

INSTANTIATE_TEST_SUITE_P(
    Trees, CudaCables,
    ::testing::Combine(::testing::Values(Shape::kChain, Shape::kStar, Shape::kRandom,
                                         Shape::kRecursive, Shape::kRecursiveDfs),
                       ::testing::Values(int64_t{1}, int64_t{2}, int64_t{3}, int64_t{511},
                                         int64_t{513}, int64_t{5000}, int64_t{65537},
                                         int64_t{1} << 20)),
    CablesName);

TEST(CudaCablesMorphology, RealCellAloneAndInSmallBatches) {
  REQUIRE_GPU();
  auto m = ReadSwc(std::string(TRISOLVE_TEST_DATA) + "/neuron_10-2012-02-09-001.CNG.swc");
  ASSERT_TRUE(m.ok());
  for (Layout layout : {Layout::kFlat, Layout::kInterleaved}) {
    Compare<double>(m->parent, 1, layout, false, 1e-12, TreeMethod::kAuto, "cables");
    Compare<double>(m->parent, 100, layout, false, 1e-12, TreeMethod::kAuto, "cables");
    Compare<float>(m->parent, 7, layout, false, 1e-3, TreeMethod::kAuto, "cables");
  }
}

// The one-block-a-cell kernel, called directly on device arrays (either layout; the host
// arrays are flat and transposed for the interleaved upload).
template <typename T>
void CompareBlock(const std::vector<int32_t>& parent, int64_t batch, double tol,
                  Layout layout = Layout::kFlat, TreeMethod method = TreeMethod::kCables) {
  const bool contraction = method == TreeMethod::kContraction;
  const bool il = layout == Layout::kInterleaved;
  const int64_t n = int64_t(parent.size());
  std::mt19937_64 rng(n * 5 + batch);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<T> h[4];  // lower, upper, diag, rhs
  for (auto& v : h) v.assign(n * batch, T(0));
  for (int64_t s = 0; s < batch; ++s) {
    std::vector<double> dg(n, 0.0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t e = s * n + i;
      h[0][e] = T(u(rng));
      h[1][e] = T(u(rng));
      h[3][e] = T(u(rng));
      dg[i] += 1 + std::abs(double(h[0][e]));
      if (i > 0) dg[parent[i]] += std::abs(double(h[1][e]));
    }
    for (int64_t i = 0; i < n; ++i) h[2][s * n + i] = T(dg[i]);
  }
  if (batch >= 2) {  // cell 1: a leaf's row is zero
    h[2][2 * n - 1] = T(0);
    h[0][2 * n - 1] = T(0);
  }
  cuda::Pool pool(cuda::Pool::Kind::kDevice, 0, int64_t{4} << 30);
  auto plan = cuda::TreeCablesPlan::Make(parent.data(), n, pool, nullptr);
  ASSERT_TRUE(plan.ok()) << plan.status();
  TreeProblem<T> p;
  p.batch = batch;
  p.n = n;
  p.layout = layout;
  T* d[5];
  uint8_t* flags;
  for (int q = 0; q < 5; ++q) ASSERT_EQ(cudaMalloc(&d[q], sizeof(T) * n * batch), cudaSuccess);
  // x starts as NaN (every byte 0xff): an element the kernel never writes is a NaN, which the
  // measures below count as the worst error.
  ASSERT_EQ(cudaMemset(d[4], 0xff, sizeof(T) * n * batch), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&flags, batch), cudaSuccess);
  ASSERT_EQ(cudaMemset(flags, 0, batch), cudaSuccess);
  auto transpose = [&](const std::vector<T>& v) {  // flat -> interleaved
    std::vector<T> t(v.size());
    for (int64_t s = 0; s < batch; ++s)
      for (int64_t i = 0; i < n; ++i) t[i * batch + s] = v[s * n + i];
    return t;
  };
  for (int q = 0; q < 4; ++q) {
    const std::vector<T> up = il ? transpose(h[q]) : h[q];
    ASSERT_EQ(cudaMemcpy(d[q], up.data(), sizeof(T) * n * batch, cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  p.lower = d[0];
  p.upper = d[1];
  p.diag = d[2];
  p.rhs = d[3];
  if (contraction) {
    ASSERT_TRUE(cuda::ContractionBlockFits(p, **plan));
    ASSERT_TRUE(cuda::SolveTreeContractionBlockDevice(p, **plan, d[4], flags, nullptr).ok());
  } else {
    ASSERT_TRUE(cuda::CablesBlockFits(p, **plan));
    ASSERT_TRUE(cuda::SolveTreeCablesBlockDevice(p, **plan, d[4], flags, nullptr).ok());
  }
  std::vector<T> xg(n * batch);
  std::vector<uint8_t> fg(batch);
  ASSERT_EQ(cudaMemcpy(xg.data(), d[4], sizeof(T) * n * batch, cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(fg.data(), flags, batch, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int q = 0; q < 5; ++q) cudaFree(d[q]);
  cudaFree(flags);
  TreeProblem<T> hp = p;
  hp.parent = parent.data();
  hp.layout = Layout::kFlat;  // the host arrays
  hp.lower = h[0].data();
  hp.upper = h[1].data();
  hp.diag = h[2].data();
  hp.rhs = h[3].data();
  std::vector<T> xc(n * batch);
  std::vector<SystemStatus> sc(batch);
  cpu::SolveTree(hp, method, TreeOutput<T>{xc.data(), sc.data()});
  std::vector<T> xflat(n * batch);
  std::vector<SystemStatus> sg(batch);
  for (int64_t s = 0; s < batch; ++s) {
    ASSERT_EQ(fg[s] != 0, sc[s] != SystemStatus::kOk) << "cell " << s << ", n = " << n;
    sg[s] = fg[s] != 0 ? SystemStatus::kSingular : SystemStatus::kOk;
    for (int64_t i = 0; i < n; ++i) xflat[s * n + i] = il ? xg[i * batch + s] : xg[s * n + i];
    if (sc[s] != SystemStatus::kOk) continue;
    double dm = 0, xm = 0;
    for (int64_t i = 0; i < n; ++i) {
      dm = testing::WorseOf(dm, std::abs(double(xflat[s * n + i]) - double(xc[s * n + i])));
      xm = testing::WorseOf(xm, std::abs(double(xc[s * n + i])));
    }
    EXPECT_LE(dm, tol * xm) << "cell " << s << ", n = " << n;
  }
  // What backward stability promises, as Compare asks of the same kernels through the backend:
  // a float32 answer 1e-4 of max|x| away from the reference could be far from stable.
  EXPECT_LE(TreeBackwardError(hp, xflat.data(), sg.data()), sizeof(T) == 8 ? 1e-15 : 1e-6)
      << "n = " << n << ", batch " << batch;
}

TEST(CudaCablesBlock, MatchesTheCpuCables) {
  REQUIRE_GPU();
  auto m = ReadSwc(std::string(TRISOLVE_TEST_DATA) + "/neuron_10-2012-02-09-001.CNG.swc");
  ASSERT_TRUE(m.ok());
  for (Layout layout : {Layout::kFlat, Layout::kInterleaved}) {
    SCOPED_TRACE(layout == Layout::kFlat ? "flat" : "interleaved");
    CompareBlock<double>(m->parent, 300, 1e-13, layout);
    CompareBlock<float>(m->parent, 100, 1e-4, layout);
    for (int64_t n : {1, 2, 3, 100, 3000})
      for (Shape sh : {Shape::kStar, Shape::kRandom, Shape::kRecursiveDfs, Shape::kRecursive}) {
        CompareBlock<double>(Parents(sh, n, 77 + n), 5, 1e-13, layout);
      }
    // 7,000 nodes: 219 KB of shared memory, one cell an SM (short cables: recursive trees).
    CompareBlock<double>(Parents(Shape::kRecursiveDfs, 7000, 5), 3, 1e-13, layout);
    CompareBlock<double>(Parents(Shape::kChain, 64, 1), 4, 1e-13, layout);  // one cable of 64
    // Stars: a node with 3,999 child cables (the descriptions' list beyond the first two).
    CompareBlock<float>(Parents(Shape::kStar, 4000, 3), 3, 1e-4, layout);
  }
}

TEST(CudaContractionBlock, MatchesTheCpuContraction) {
  REQUIRE_GPU();
  auto m = ReadSwc(std::string(TRISOLVE_TEST_DATA) + "/neuron_10-2012-02-09-001.CNG.swc");
  ASSERT_TRUE(m.ok());
  const TreeMethod c = TreeMethod::kContraction;
  for (Layout layout : {Layout::kFlat, Layout::kInterleaved}) {
    SCOPED_TRACE(layout == Layout::kFlat ? "flat" : "interleaved");
    CompareBlock<double>(m->parent, 300, 1e-13, layout, c);
    CompareBlock<float>(m->parent, 100, 1e-4, layout, c);
    for (int64_t n : {1, 2, 3, 100, 3000})
      for (Shape sh : {Shape::kChain, Shape::kStar, Shape::kRandom, Shape::kRecursiveDfs,
                       Shape::kRecursive}) {
        CompareBlock<double>(Parents(sh, n, 77 + n), 5, 1e-13, layout, c);
      }
    // 7,000 nodes: 219 KB of shared memory, one cell an SM; a chain of 7,000 (no cables limit).
    CompareBlock<double>(Parents(Shape::kRecursiveDfs, 7000, 5), 3, 1e-13, layout, c);
    CompareBlock<double>(Parents(Shape::kChain, 7000, 5), 3, 1e-13, layout, c);
    CompareBlock<float>(Parents(Shape::kStar, 4000, 3), 3, 1e-4, layout, c);
  }
}

// One kernel, two callers at once with different shared-memory needs (the one-block-a-cell
// contraction kernel at 100 nodes, 3.2 KB, and 3,000 nodes, 96 KB), as two requests on one
// device are: each launch must run, and give what it gives alone, bit for bit. When each launch
// set the kernel's limit to its own need, the small caller lowered it between the large one's
// setting and its launch, and that launch failed.
TEST(CudaContractionBlock, CallersOfDifferentSizesAtOnceEachRun) {
  REQUIRE_GPU();
  struct Caller {
    std::vector<int32_t> parent;
    int64_t n, batch = 4;
    std::unique_ptr<cuda::TreeCablesPlan> plan;
    double* d[5] = {};
    uint8_t* flags = nullptr;
    cudaStream_t stream = nullptr;
    std::vector<double> alone;
    int failed = 0;
    std::string first_error;
  };
  cuda::Pool pool(cuda::Pool::Kind::kDevice, 0, int64_t{1} << 30);
  Caller callers[2];
  callers[0].parent = Parents(Shape::kRecursiveDfs, 100, 3);
  callers[1].parent = Parents(Shape::kRecursiveDfs, 3000, 4);
  auto problem = [](Caller& c) {
    TreeProblem<double> p;
    p.batch = c.batch;
    p.n = c.n;
    p.lower = c.d[0];
    p.upper = c.d[1];
    p.diag = c.d[2];
    p.rhs = c.d[3];
    return p;
  };
  for (Caller& c : callers) {
    c.n = int64_t(c.parent.size());
    auto plan = cuda::TreeCablesPlan::Make(c.parent.data(), c.n, pool, nullptr);
    ASSERT_TRUE(plan.ok()) << plan.status();
    c.plan = std::move(*plan);
    const size_t e = size_t(c.n * c.batch);
    std::vector<double> h[4];
    for (int q = 0; q < 4; ++q) {
      h[q].resize(e);
      for (size_t i = 0; i < e; ++i) h[q][i] = q == 2 ? 4.0 : 0.25 + 0.001 * double(i % 97);
    }
    for (int q = 0; q < 5; ++q) ASSERT_EQ(cudaMalloc(&c.d[q], 8 * e), cudaSuccess);
    for (int q = 0; q < 4; ++q)
      ASSERT_EQ(cudaMemcpy(c.d[q], h[q].data(), 8 * e, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&c.flags, size_t(c.batch)), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_TRUE(cuda::ContractionBlockFits(problem(c), *c.plan));
    ASSERT_TRUE(
        cuda::SolveTreeContractionBlockDevice(problem(c), *c.plan, c.d[4], c.flags, c.stream)
            .ok());
    c.alone.resize(e);
    ASSERT_EQ(cudaMemcpyAsync(c.alone.data(), c.d[4], 8 * e, cudaMemcpyDeviceToHost, c.stream),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(c.stream), cudaSuccess);
  }
  auto run = [&](Caller& c) {
    cudaSetDevice(0);
    for (int k = 0; k < 2000; ++k) {
      auto st =
          cuda::SolveTreeContractionBlockDevice(problem(c), *c.plan, c.d[4], c.flags, c.stream);
      if (!st.ok() && c.failed++ == 0) c.first_error = std::string(st.message());
      if (k % 64 == 63) cudaStreamSynchronize(c.stream);  // (a bounded queue)
    }
    cudaStreamSynchronize(c.stream);
  };
  std::thread other(run, std::ref(callers[0]));
  run(callers[1]);
  other.join();
  for (Caller& c : callers) {
    EXPECT_EQ(c.failed, 0) << c.n << " nodes: " << c.first_error;
    std::vector<double> x(c.alone.size());
    ASSERT_EQ(cudaMemcpy(x.data(), c.d[4], 8 * x.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(std::memcmp(x.data(), c.alone.data(), 8 * x.size()), 0) << c.n << " nodes";
    for (double* q : c.d) cudaFree(q);
    cudaFree(c.flags);
    cudaStreamDestroy(c.stream);
  }
}

TEST(CudaTreeAuto, PicksByShapeLayoutAndBatch) {
  REQUIRE_GPU();
  auto m = ReadSwc(std::string(TRISOLVE_TEST_DATA) + "/neuron_10-2012-02-09-001.CNG.swc");
  ASSERT_TRUE(m.ok());
  auto method_of = [&](const std::vector<int32_t>& parent, int64_t batch, Layout layout,
                       TreeMethod method) {
    const int64_t n = int64_t(parent.size());
    std::vector<double> lower(n * batch, -0.5), upper(n * batch, -0.5), diag(n * batch, 4),
        rhs(n * batch, 1), x(n * batch);
    std::vector<SystemStatus> st(batch);
    TreeProblem<double> p;
    p.batch = batch;
    p.n = n;
    p.layout = layout;
    p.parent = parent.data();
    p.lower = lower.data();
    p.upper = upper.data();
    p.diag = diag.data();
    p.rhs = rhs.data();
    auto info = Cuda()->Solve(p, method, TreeOutput<double>{x.data(), st.data()}, SolveControl{});
    EXPECT_TRUE(info.ok()) << info.status();
    for (auto s : st) EXPECT_EQ(s, SystemStatus::kOk);
    return info.ok() ? info->method : std::string("error");
  };
  const auto& cell = m->parent;
  const TreeMethod a = TreeMethod::kAuto;
  EXPECT_EQ(method_of(cell, 1, Layout::kFlat, a), "contraction-block");
  EXPECT_EQ(method_of(cell, 4096, Layout::kFlat, a), "contraction-block");
  EXPECT_EQ(method_of(cell, 4607, Layout::kInterleaved, a), "contraction-block");
  EXPECT_EQ(method_of(cell, 4608, Layout::kInterleaved, a), "hines-batch");
  EXPECT_EQ(method_of(cell, 3, Layout::kInterleaved, TreeMethod::kCables), "cables-block");
  EXPECT_EQ(method_of(cell, 3, Layout::kFlat, TreeMethod::kHines), "hines-batch");
  // Too large for shared memory: the cables (auto); the contraction then runs on the host.
  const auto big = Parents(Shape::kRandom, 20000, 9);
  EXPECT_EQ(method_of(big, 2, Layout::kFlat, a), "cables");
  EXPECT_EQ(method_of(big, 2, Layout::kFlat, TreeMethod::kContraction), "contraction (host)");
}

TEST(CudaCablesMorphology, MoreCellsThanOneGridDimension) {
  REQUIRE_GPU();
  // 70,000 small cells: the cables' second grid dimension (65,535 at most) is walked in
  // pieces (a chain of 65: one cable longer than the block kernel takes), and the block
  // kernels launch one block a cell.
  const auto chain = Parents(Shape::kChain, 65, 5);
  Compare<double>(chain, 70000, Layout::kInterleaved, false, 1e-12, TreeMethod::kCables,
                  "cables");
  const auto parent = Parents(Shape::kRandom, 6, 5);
  Compare<double>(parent, 70000, Layout::kFlat, false, 1e-12, TreeMethod::kCables,
                  "cables-block");
  Compare<double>(parent, 70000, Layout::kInterleaved, false, 1e-12, TreeMethod::kContraction,
                  "contraction-block");
}

TEST(CudaCablesMorphology, PerCellTreesDiffer) {
  REQUIRE_GPU();
  // Different random trees per cell: auto runs hines-batch with each cell's parent array;
  // "cables" for them runs on the host.
  const int64_t n = 700, batch = 40;
  std::mt19937_64 rng(9);
  std::vector<int32_t> parents(n * batch);
  for (int64_t s = 0; s < batch; ++s) {
    const auto t = Recursive(n, 100 + s, s % 2 == 0);
    std::copy(t.begin(), t.end(), parents.begin() + s * n);
  }
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> lower(n * batch), upper(n * batch), diag(n * batch, 0), rhs(n * batch);
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t e = s * n + i;
      lower[e] = u(rng), upper[e] = u(rng), rhs[e] = u(rng);
      diag[e] += 1 + std::abs(lower[e]);
      if (i > 0) diag[s * n + parents[e]] += std::abs(upper[e]);
    }
  TreeProblem<double> p;
  p.batch = batch;
  p.n = n;
  p.parent = parents.data();
  p.parent_per_system = true;
  p.lower = lower.data();
  p.upper = upper.data();
  p.diag = diag.data();
  p.rhs = rhs.data();
  for (TreeMethod m : {TreeMethod::kAuto, TreeMethod::kCables}) {
    std::vector<double> xg(n * batch), xc(n * batch);
    std::vector<SystemStatus> sg(batch), sc(batch);
    auto info = Cuda()->Solve(p, m, TreeOutput<double>{xg.data(), sg.data()}, SolveControl{});
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->method, m == TreeMethod::kAuto ? "hines-batch" : "cables (host)");
    cpu::SolveTree(p, TreeMethod::kHines, TreeOutput<double>{xc.data(), sc.data()});
    for (int64_t s = 0; s < batch; ++s) ASSERT_EQ(sg[s], SystemStatus::kOk);
    double dm = 0, xm = 0;
    for (int64_t e = 0; e < n * batch; ++e) {
      dm = testing::WorseOf(dm, std::abs(xg[e] - xc[e]));
      xm = testing::WorseOf(xm, std::abs(xc[e]));
    }
    EXPECT_LE(dm, 1e-12 * xm);
  }
}

// Cells of different sizes (TreeProblem::offsets): one block a cell with its structure's plan
// (contraction-block for auto and contraction, cables-block for cables), cells too large for
// a block as one tree whose roots are joined by zero couplings; every status and x against
// the CPU reference's, a cell
// at a time, by the same method (auto: hines on the CPU). `expect`: the method string's start;
// `also`: a part it must hold further on. auto builds the plan only for cells it has seen
// before: the first call may be the host's (unless an earlier test sent the same cells), the
// second is the device's.
template <typename T>
void CompareCellsOnce(const testing::Cells& c, TreeMethod m, const std::string& expect,
                      double tol, bool first_sight, const std::string& also = "") {
  const auto typed = c.As<T>();
  const TreeProblem<T> p = c.Problem(typed);
  const int64_t total = c.total();
  std::vector<T> xg(static_cast<size_t>(total), T(std::nan(""))), xc(static_cast<size_t>(total));
  std::vector<SystemStatus> sg(size_t(c.cells()), SystemStatus::kDiverged), sc(sg);
  auto info = Cuda()->Solve(p, m, TreeOutput<T>{xg.data(), sg.data()}, SolveControl{});
  ASSERT_TRUE(info.ok()) << info.status();
  const bool host_first =
      first_sight && info->method == "hines (host; the cells' plan is built if they come again)";
  if (!host_first) {
    EXPECT_EQ(info->method.rfind(expect, 0), 0u) << info->method << " (expected " << expect << ")";
    EXPECT_NE(info->method.find(also), std::string::npos) << info->method << " (expected " << also
                                                          << " in it)";
  }
  cpu::SolveTree(p, m == TreeMethod::kAuto ? TreeMethod::kHines : m,
                 TreeOutput<T>{xc.data(), sc.data()});
  double worst = 0;
  for (int64_t s = 0; s < c.cells(); ++s) {
    ASSERT_EQ(sg[size_t(s)], sc[size_t(s)]) << "cell " << s << ": " << info->method;
    double dm = 0, xm = 0;
    for (int64_t i = c.offsets[size_t(s)]; i < c.offsets[size_t(s) + 1]; ++i) {
      if (sc[size_t(s)] != SystemStatus::kOk) {
        ASSERT_EQ(xg[size_t(i)], T(0)) << "cell " << s;
        continue;
      }
      dm = testing::WorseOf(dm, std::abs(double(xg[size_t(i)]) - double(xc[size_t(i)])));
      xm = testing::WorseOf(xm, std::abs(double(xc[size_t(i)])));
    }
    worst = testing::WorseOf(worst, xm > 0 ? dm / xm : dm);
  }
  EXPECT_LE(worst, tol) << info->method;
  EXPECT_LE(TreeBackwardError(p, xg.data(), sg.data()), sizeof(T) == 8 ? 1e-15 : 1e-6)
      << info->method;
}

template <typename T>
void CompareCells(const testing::Cells& c, TreeMethod m, const std::string& expect, double tol,
                  const std::string& also = "") {
  for (int call = 0; call < (m == TreeMethod::kAuto ? 2 : 1); ++call) {
    SCOPED_TRACE(::testing::Message() << "call " << call);
    CompareCellsOnce<T>(c, m, expect, tol, call == 0 && m == TreeMethod::kAuto, also);
  }
}

constexpr const char* kPerCell = "contraction-block (per-cell plans, ";
constexpr const char* kPerCellCables = "cables-block (per-cell plans, ";

// Subtrees of the real morphology (its first k nodes) of many sizes, the whole cell among them,
// and random small trees: 1,200 cells.
testing::Cells MorphologyCells(int64_t cells, uint64_t seed, int singular_at = -1) {
  auto m = ReadSwc(std::string(TRISOLVE_TEST_DATA) + "/neuron_10-2012-02-09-001.CNG.swc");
  EXPECT_TRUE(m.ok());
  std::mt19937_64 rng(seed);
  testing::Cells c;
  const int64_t sizes[] = {3187, 1, 2, 17, 400, 1500, 2900, 3186, 64};
  for (int64_t k = 0; k < cells; ++k) {
    if (k == singular_at) {
      c.AddSingular();
    } else if (k % 3 == 2) {
      c.AddRandom(testing::RandomParents(1 + int64_t(rng() % 300), rng), rng);
    } else {
      const int64_t n = sizes[size_t(k) % std::size(sizes)];
      c.AddRandom(std::vector<int32_t>(m->parent.begin(), m->parent.begin() + n), rng);
    }
  }
  return c;
}

TEST(CudaTreeCells, HandWorkedCells) {
  REQUIRE_GPU();
  const testing::Cells c = testing::HandWorkedCells();
  const auto typed = c.As<double>();
  // (auto: the host's the first time these cells come, the device's the second.)
  for (int call = 0; call < 2; ++call) {
    std::vector<double> x(8);
    std::vector<SystemStatus> st(3);
    auto info = Cuda()->Solve(c.Problem(typed), TreeMethod::kAuto,
                              TreeOutput<double>{x.data(), st.data()}, SolveControl{});
    ASSERT_TRUE(info.ok()) << info.status();
    if (call == 1) {
      EXPECT_EQ(info->method, "contraction-block (per-cell plans, 3 structures)");
    }
    const std::vector<double> want = testing::HandWorkedX();
    for (SystemStatus s : st) EXPECT_EQ(s, SystemStatus::kOk);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(x[i], want[i], 1e-14) << i;
  }
  // The caller's root couplings (not part of the matrix) are untouched.
  EXPECT_EQ(typed.lower[1], 3.5);
  EXPECT_EQ(typed.upper[3], -6.0);
}

TEST(CudaTreeCells, RealMorphologySubtreesOneBlockACell) {
  REQUIRE_GPU();
  const testing::Cells c = MorphologyCells(1200, 1);
  CompareCells<double>(c, TreeMethod::kAuto, kPerCell, 1e-12);
  CompareCells<float>(c, TreeMethod::kAuto, kPerCell, 2e-3);
  CompareCells<double>(c, TreeMethod::kContraction, kPerCell, 1e-12);
  CompareCells<float>(c, TreeMethod::kContraction, kPerCell, 2e-3);
  CompareCells<double>(c, TreeMethod::kCables, kPerCellCables, 1e-12);
  CompareCells<float>(c, TreeMethod::kCables, kPerCellCables, 2e-3);
  // hines is one thread a cell on the device: on the host, a cell at a time.
  CompareCells<double>(c, TreeMethod::kHines, "hines (host)", 0);
}

TEST(CudaTreeCells, OneMorphologySentWithLengths) {
  REQUIRE_GPU();
  // Every cell the whole morphology: one structure, the uniform batch's work.
  auto m = ReadSwc(std::string(TRISOLVE_TEST_DATA) + "/neuron_10-2012-02-09-001.CNG.swc");
  ASSERT_TRUE(m.ok());
  std::mt19937_64 rng(11);
  testing::Cells c;
  for (int k = 0; k < 300; ++k) c.AddRandom(m->parent, rng);
  CompareCells<double>(c, TreeMethod::kAuto, "contraction-block (per-cell plans, 1 structure)",
                       1e-12);
  CompareCells<float>(c, TreeMethod::kContraction,
                      "contraction-block (per-cell plans, 1 structure)", 2e-3);
}

TEST(CudaTreeCells, CellsTooLargeForABlockAmongSmallOnes) {
  REQUIRE_GPU();
  // 15,000 and 70,000 nodes: over shared memory in both precisions (and over the 16-bit
  // fields): the cells as one tree; the others one a block. A singular cell among each kind:
  // the 15,000-node cell's last leaf has a zero row.
  std::mt19937_64 rng(12);
  testing::Cells c;
  for (int k = 0; k < 200; ++k) {
    if (k == 7 || k == 150) {
      c.AddRandom(testing::RandomParents(k == 7 ? 15000 : 70000, rng), rng);
    } else if (k == 90) {
      c.AddSingular();
    } else {
      c.AddRandom(testing::RandomParents(1 + int64_t(rng() % 500), rng), rng);
    }
  }
  const size_t leaf = size_t(c.offsets[8] - 1);  // (a random recursive tree's last node)
  c.diag[leaf] = 0;
  c.lower[leaf] = 0;
  for (TreeMethod m : {TreeMethod::kAuto, TreeMethod::kContraction}) {
    CompareCells<double>(c, m, kPerCell, 1e-12, "; 2 cells too large for a block: ");
    CompareCells<float>(c, m, kPerCell, 2e-3, "; 2 cells too large for a block: ");
  }
  // (cables builds the joined tree's plan at once: the two large cells on the device, their
  // vanished pivot re-solved on the host as the joined tree does)
  const std::string joined =
      "; 2 cells too large for a block: cables (the cells as one tree); a pivot vanished";
  CompareCells<double>(c, TreeMethod::kCables, kPerCellCables, 1e-12, joined);
  CompareCells<float>(c, TreeMethod::kCables, kPerCellCables, 2e-3, joined);
}

TEST(CudaTreeCells, PlanGroupsStructuresAndLeavesLargeCells) {
  REQUIRE_GPU();
  // Sizes 3, 3 (same tree), 3 (another), 9,000 (too large in float64, not in float32), 1, 1.
  testing::Cells c;
  std::mt19937_64 rng(13);
  c.AddRandom({-1, 0, 1}, rng);
  c.AddRandom({-1, 0, 1}, rng);
  c.AddRandom({-1, 0, 0}, rng);
  c.AddRandom(testing::RandomParents(9000, rng), rng);
  c.AddRandom({-1}, rng);
  c.AddRandom({-1}, rng);
  cuda::Pool pool(cuda::Pool::Kind::kDevice, 0, int64_t{1} << 30);
  auto p8 = cuda::TreeCellsPlan::Make(c.parent.data(), c.offsets.data(), c.cells(), 8, pool,
                                      nullptr, 3);
  ASSERT_TRUE(p8.ok()) << p8.status();
  EXPECT_EQ((*p8)->structures(), 4);
  EXPECT_EQ((*p8)->block_cells(), 5);
  EXPECT_EQ((*p8)->rest(), std::vector<int32_t>{3});
  auto p4 = cuda::TreeCellsPlan::Make(c.parent.data(), c.offsets.data(), c.cells(), 4, pool,
                                      nullptr, 1);
  ASSERT_TRUE(p4.ok()) << p4.status();
  EXPECT_EQ((*p4)->block_cells(), 6);
  EXPECT_TRUE((*p4)->rest().empty());
}

// Host only: runs without a GPU.
TEST(TreeCellGroups, SameSizeAndParentsShareAStructure) {
  testing::Cells c;
  std::mt19937_64 rng(14);
  for (const std::vector<int32_t>& p : std::vector<std::vector<int32_t>>{
           {-1, 0, 1}, {-1, 0, 0}, {-1, 0, 1}, {-1}, {-1}, {-1, 0, 1, 2}, {-1, 0, 0}})
    c.AddRandom(p, rng);
  const cuda::TreeCellGroups g =
      cuda::GroupTreeCells(c.parent.data(), c.offsets.data(), c.cells());
  EXPECT_EQ(g.structure_of, (std::vector<int32_t>{0, 1, 0, 2, 2, 3, 1}));
  EXPECT_EQ(g.first_cell, (std::vector<int64_t>{0, 1, 3, 5}));
  // The prefix {-1, 0, 1} of {-1, 0, 1, 2} is not the same tree: sizes differ.
  testing::Cells d;
  d.AddRandom({-1, 0, 1, 2}, rng);
  d.AddRandom({-1, 0, 1}, rng);
  EXPECT_EQ(cuda::GroupTreeCells(d.parent.data(), d.offsets.data(), 2).first_cell.size(), 2u);
}

// The block kernel's arithmetic on the host over the schedule as packed for the device
// (ContractionCellsKernel, one round at a time, entries in order): checks the grouping, the
// rebased offsets and the per-block descriptions without a GPU.
template <typename T>
void EmulateCellBlocks(const cuda::TreeCellsSchedule& sc, const TreeProblem<T>& p, T* x,
                       std::vector<uint8_t>& flagged) {
  const T eps = std::numeric_limits<T>::epsilon();
  for (size_t b = 0; b < sc.info.size(); ++b) {
    const int4 info = sc.info[b];
    const int64_t first = int64_t((uint64_t(uint32_t(info.y)) << 32) | uint32_t(info.x));
    const int n = info.z & 0xffff, R = (info.z >> 16) & 0xff, pb = info.w;
    std::vector<T> lo(p.lower + first, p.lower + first + n), up(p.upper + first, p.upper + first + n),
        dg(p.diag + first, p.diag + first + n), rh(p.rhs + first, p.rhs + first + n);
    bool ok = true;
    auto vanishes = [&](T d, T scale) { return !(std::abs(d) > eps * scale) || !std::isfinite(d); };
    for (int r = 0; r < R; ++r) {
      for (int k = sc.ptr_e[size_t(pb + r)]; k < sc.ptr_e[size_t(pb + r + 1)]; ++k) {
        const int2 e = sc.elim[size_t(k)];
        const int v = e.x & 0xffff, par = (e.x >> 16) - 1, c = e.y - 1;
        const T D = dg[v], inv = T(1) / D;
        ok &= !vanishes(D, T(0));
        const T uc = c >= 0 ? up[c] : T(0), l = lo[v], u = up[v];
        rh[v] = rh[v] * inv;
        lo[v] = par >= 0 ? l * inv : T(0);
        up[v] = c >= 0 ? uc * inv : T(0);
        dg[v] = par >= 0 ? u : T(0);
      }
      for (int k = sc.ptr_u[size_t(pb + r)]; k < sc.ptr_u[size_t(pb + r + 1)]; ++k) {
        const int2 e = sc.upd[size_t(k)];
        const int u = e.x & 0xffff, from = (e.x >> 16) - 1;
        const int c0 = (e.y & 0xffff) - 1, c1f = (e.y >> 16) & 0xffff;
        T D = dg[u], Rr = rh[u], S = std::abs(D);
        if (from >= 0) {
          const T l = lo[u], wc = up[from], d = l * wc;
          D -= d;
          S += std::abs(d);
          Rr -= l * rh[from];
          lo[u] = -l * lo[from];
          up[u] = -dg[from] * wc;
        }
        auto take = [&](int w) {
          const T d = dg[w] * lo[w];
          D -= d;
          S += std::abs(d);
          Rr -= dg[w] * rh[w];
        };
        if (c1f == 0xffff) {
          const int2 m = sc.upd_more[size_t(k)];
          for (int q = m.x; q < m.x + m.y; ++q) take(sc.children[size_t(q)]);
        } else {
          if (c0 >= 0) take(c0);
          if (c1f > 0) take(c1f - 1);
        }
        ok &= !vanishes(D, S);
        dg[u] = D;
        rh[u] = Rr;
      }
    }
    for (int r = R - 1; r >= 0; --r)
      for (int k = sc.ptr_e[size_t(pb + r)]; k < sc.ptr_e[size_t(pb + r + 1)]; ++k) {
        const int2 e = sc.elim[size_t(k)];
        const int v = e.x & 0xffff, par = (e.x >> 16) - 1, c = e.y - 1;
        T xv = rh[v];
        if (par >= 0) xv -= lo[v] * rh[par];
        if (c >= 0) xv -= up[v] * rh[c];
        rh[v] = xv;
      }
    std::copy(rh.begin(), rh.end(), x + first);
    flagged[size_t(sc.cell_of_block[b])] = !ok;
  }
}

// CablesCellsKernel's arithmetic on the host (CablesBlockKernel's, a level at a time).
template <typename T>
void EmulateCablesCells(const cuda::TreeCellsSchedule& sc, const TreeProblem<T>& p, T* x,
                        std::vector<uint8_t>& flagged) {
  const T eps = std::numeric_limits<T>::epsilon();
  for (size_t b = 0; b < sc.info.size(); ++b) {
    const int4 info = sc.info[b];
    const int64_t first = int64_t((uint64_t(uint32_t(info.y)) << 32) | uint32_t(info.x));
    const int n = info.z & 0xffff, H = (info.z >> 16) & 0xffff;
    const int32_t* lp = sc.level_ptr.data() + info.w;
    std::vector<T> lo(p.lower + first, p.lower + first + n), up(p.upper + first, p.upper + first + n),
        dg(p.diag + first, p.diag + first + n), rh(p.rhs + first, p.rhs + first + n);
    bool ok = true;
    auto decode = [](int4 ci, int& s0, int& e0, int& anchor) {
      const unsigned u = unsigned(ci.x);
      s0 = int(u & 0xffffu);
      e0 = s0 + int((u >> 16) & 0x7fffu);
      anchor = ci.y;
    };
    for (int h = 0; h < H; ++h)
      for (int k = lp[h]; k < lp[h + 1]; ++k) {
        const int4 ci = sc.cinfo[size_t(k)];
        int s0, e0, anchor;
        decode(ci, s0, e0, anchor);
        T cD = 0, cR = 0, cS = 0;
        auto gather = [&](int top) {
          cD += dg[top];
          cR += up[top];
          cS += std::abs(dg[top]);
        };
        if (ci.z >= 0) gather(ci.z);
        if (ci.w >= 0) gather(ci.w);
        if ((unsigned(ci.x) >> 31) != 0) {
          const int2 m = sc.cmore[size_t(k)];
          for (int q = m.x; q < m.x + m.y; ++q) gather(sc.ctop[size_t(q)]);
        }
        for (int j = e0; j >= s0; --j) {
          const T D = dg[j] - cD, R = rh[j] - cR;
          ok &= std::abs(D) > eps * (std::abs(dg[j]) + cS) && std::isfinite(D);
          const T inv = T(1) / D;
          rh[j] = R * inv;
          const T l = lo[j], u = up[j];
          lo[j] = j > 0 ? l * inv : T(0);
          const T g = j > 0 ? u * inv : T(0);
          cD = g * l;
          cR = g * R;
          cS = std::abs(cD);
        }
        if (anchor >= 0) {
          dg[s0] = cD;
          up[s0] = cR;
        }
      }
    for (int h = H - 1; h >= 0; --h)
      for (int k = lp[h]; k < lp[h + 1]; ++k) {
        int s0, e0, anchor;
        decode(sc.cinfo[size_t(k)], s0, e0, anchor);
        T xp = anchor >= 0 ? rh[anchor] : T(0);
        for (int j = s0; j <= e0; ++j) rh[j] = xp = rh[j] - lo[j] * xp;
      }
    std::copy(rh.begin(), rh.end(), x + first);
    flagged[size_t(sc.cell_of_block[b])] = !ok;
  }
}

class TreeCellSchedule : public ::testing::TestWithParam<cuda::TreeCellsKind> {};

TEST_P(TreeCellSchedule, SolvesEveryCellLikeTheReference) {
  // Real morphology subtrees, random trees, repeated structures, one- and two-node cells, a
  // singular cell and one too large for a block in float64: every block cell's x against the
  // CPU reference's (the same elimination), only the singular one flagged, the large one left
  // over.
  const cuda::TreeCellsKind kind = GetParam();
  const bool cables = kind == cuda::TreeCellsKind::kCables;
  std::mt19937_64 rng(15);
  testing::Cells c = MorphologyCells(300, 3, 40);
  c.AddRandom(testing::RandomParents(8000, rng), rng);
  for (int k = 0; k < 30; ++k) c.AddRandom({-1, 0, 0, 2}, rng);
  const cuda::TreeCellsSchedule sc =
      cuda::ScheduleTreeCells(c.parent.data(), c.offsets.data(), c.cells(), 8, 2, kind);
  EXPECT_EQ(sc.rest, std::vector<int32_t>{int32_t(c.cells() - 31)});
  EXPECT_EQ(int64_t(sc.cell_of_block.size()), c.cells() - 1);
  EXPECT_LT(sc.structures, c.cells() - 29);
  for (size_t b = 1; b < sc.cell_of_block.size(); ++b)
    EXPECT_GE(c.lengths[size_t(sc.cell_of_block[b - 1])], c.lengths[size_t(sc.cell_of_block[b])]);
  int64_t blocks = 0;
  for (const auto& l : sc.launches) {
    EXPECT_EQ(l.block0, blocks);
    EXPECT_EQ(l.max_n, c.lengths[size_t(sc.cell_of_block[size_t(l.block0)])]);
    blocks += l.blocks;
  }
  EXPECT_EQ(blocks, int64_t(sc.cell_of_block.size()));
  const auto typed = c.As<double>();
  const TreeProblem<double> p = c.Problem(typed);
  std::vector<double> x(size_t(c.total()), std::nan("")), xc(x.size());
  std::vector<uint8_t> flagged(size_t(c.cells()), 0);
  if (cables) {
    EmulateCablesCells(sc, p, x.data(), flagged);
  } else {
    EmulateCellBlocks(sc, p, x.data(), flagged);
  }
  std::vector<SystemStatus> sc_ref(size_t(c.cells()));
  cpu::SolveTree(p, cables ? TreeMethod::kCables : TreeMethod::kContraction,
                 TreeOutput<double>{xc.data(), sc_ref.data()});
  for (int32_t k : sc.cell_of_block) {
    EXPECT_EQ(flagged[size_t(k)] != 0, sc_ref[size_t(k)] != SystemStatus::kOk) << "cell " << k;
    if (sc_ref[size_t(k)] != SystemStatus::kOk) continue;
    for (int64_t i = c.offsets[size_t(k)]; i < c.offsets[size_t(k) + 1]; ++i)
      ASSERT_NEAR(x[size_t(i)], xc[size_t(i)], 1e-12 * (1 + std::abs(xc[size_t(i)])))
          << "cell " << k << " node " << i - c.offsets[size_t(k)];
  }
  EXPECT_EQ(sc_ref[40], SystemStatus::kSingular);
}

INSTANTIATE_TEST_SUITE_P(Kinds, TreeCellSchedule,
                         ::testing::Values(cuda::TreeCellsKind::kContraction,
                                           cuda::TreeCellsKind::kCables),
                         [](const ::testing::TestParamInfo<cuda::TreeCellsKind>& i) {
                           return std::string(i.param == cuda::TreeCellsKind::kCables
                                                  ? "cables"
                                                  : "contraction");
                         });

TEST(TreeCellGroups, WhatFitsABlock) {
  EXPECT_TRUE(cuda::TreeCellFitsBlock(3187, 12, 8));
  EXPECT_TRUE(cuda::TreeCellFitsBlock(1, 1, 8));
  EXPECT_FALSE(cuda::TreeCellFitsBlock(7300, 14, 8));  // 4 arrays of 8 bytes: 233,600 bytes
  EXPECT_TRUE(cuda::TreeCellFitsBlock(7300, 14, 4));
  EXPECT_FALSE(cuda::TreeCellFitsBlock(65535, 20, 2));  // the 16-bit fields
  EXPECT_FALSE(cuda::TreeCellFitsBlock(100, 256, 8));   // the rounds' offsets in shared memory
  EXPECT_TRUE(cuda::TreeCellFitsCablesBlock(3187, 17, 8));
  EXPECT_FALSE(cuda::TreeCellFitsCablesBlock(3187, 65, 8));  // a cable over 64 nodes
  EXPECT_FALSE(cuda::TreeCellFitsCablesBlock(7300, 10, 8));
  EXPECT_TRUE(cuda::TreeCellFitsCablesBlock(7300, 10, 4));
}

// Host only: a launch's threads a block, by hand: float64 cells of 3,187 nodes (102 KB + 3 KB
// of shared memory) run 2 an SM, at 512 threads; of 2,000 (67 KB) 3, at 256 (3 x 512 would pass
// the 1,024 threads an SM runs at 64 registers); of 1,100 (38 KB) 6, at 128; of 40, 8 at 128.
TEST(TreeCellGroups, LaunchThreadsForOccupancy) {
  using cuda::TreeCellsBlockThreads;
  constexpr auto kC = cuda::TreeCellsKind::kContraction, kK = cuda::TreeCellsKind::kCables;
  constexpr auto kOcc = cuda::TreeCellsThreads::kOccupancy, kSize = cuda::TreeCellsThreads::kBySize;
  EXPECT_EQ(TreeCellsBlockThreads(3187, 8, kC, kOcc), 512);
  EXPECT_EQ(TreeCellsBlockThreads(2000, 8, kC, kOcc), 256);
  EXPECT_EQ(TreeCellsBlockThreads(1100, 8, kC, kOcc), 128);
  EXPECT_EQ(TreeCellsBlockThreads(40, 8, kC, kOcc), 128);
  // float32: 3,187 nodes in 51 KB + 3 KB, 4 an SM at 256 threads.
  EXPECT_EQ(TreeCellsBlockThreads(3187, 4, kC, kOcc), 256);
  // Where 3 blocks fit (3 x 76 KB of an SM's 228 KB): 2,336 nodes with the contraction's 2 KB of
  // round offsets, 2,400 for cables-block, which has none.
  EXPECT_EQ(TreeCellsBlockThreads(2337, 8, kC, kOcc), 512);
  EXPECT_EQ(TreeCellsBlockThreads(2336, 8, kC, kOcc), 256);
  EXPECT_EQ(TreeCellsBlockThreads(2401, 8, kK, kOcc), 512);
  EXPECT_EQ(TreeCellsBlockThreads(2400, 8, kK, kOcc), 256);
  EXPECT_EQ(TreeCellsBlockThreads(7000, 8, kC, kOcc), 512);  // one an SM
  EXPECT_EQ(TreeCellsBlockThreads(1100, 8, kC, kSize), 512);
  EXPECT_EQ(TreeCellsBlockThreads(1000, 8, kC, kSize), 256);
  EXPECT_EQ(TreeCellsBlockThreads(200, 8, kC, kSize), 128);
}

TEST(CudaTreeCells, ManySmallRandomCells) {
  REQUIRE_GPU();
  // More cells than fan-out^2 (the roots three levels deep), most of 1 .. 40 nodes.
  std::mt19937_64 rng(2);
  testing::Cells c;
  for (int k = 0; k < 40000; ++k)
    c.AddRandom(testing::RandomParents(1 + int64_t(rng() % 40), rng), rng);
  CompareCells<double>(c, TreeMethod::kAuto, kPerCell, 1e-12);
  CompareCells<float>(c, TreeMethod::kCables, kPerCellCables, 2e-3);
}

TEST(CudaTreeCells, SmallForestOneBlock) {
  REQUIRE_GPU();
  // A few thousand nodes in all.
  std::mt19937_64 rng(4);
  testing::Cells c;
  for (int k = 0; k < 90; ++k) c.AddRandom(testing::RandomParents(1 + int64_t(rng() % 60), rng), rng);
  CompareCells<double>(c, TreeMethod::kAuto, kPerCell, 1e-12);
  CompareCells<double>(c, TreeMethod::kContraction, kPerCell, 1e-12);
  CompareCells<double>(c, TreeMethod::kCables, kPerCellCables, 1e-12);
  CompareCells<float>(c, TreeMethod::kAuto, kPerCell, 2e-3);
}

TEST(CudaTreeCells, ASingularCellAmongGoodOnes) {
  REQUIRE_GPU();
  // One block a cell: the singular cell alone is flagged and solved again on the host,
  // wherever it is among the blocks.
  for (int at : {0, 1, 33, 600, 1199}) {
    const testing::Cells c = MorphologyCells(1200, 5, at);
    CompareCells<double>(c, TreeMethod::kAuto, kPerCell, 1e-12, "; a pivot vanished in 1 cell:");
    CompareCells<float>(c, TreeMethod::kContraction, kPerCell, 2e-3,
                        "; a pivot vanished in 1 cell:");
    CompareCells<float>(c, TreeMethod::kCables, kPerCellCables, 2e-3,
                        "; a pivot vanished in 1 cell:");
  }
  std::mt19937_64 rng(6);
  testing::Cells small;
  for (int k = 0; k < 50; ++k) {
    if (k == 20) {
      small.AddSingular();
    } else {
      small.AddRandom(testing::RandomParents(1 + int64_t(rng() % 60), rng), rng);
    }
  }
  CompareCells<double>(small, TreeMethod::kAuto, kPerCell, 1e-12, "; a pivot vanished in 1 cell:");
}

// Tree cells by handle: lower, upper and diag stay on the device, and the per-cell plan is the
// system's own, built at Prepare (no first sight on the host). x and the statuses are the
// one-shot device call's on the same arrays bit for bit, for one and for two right-hand sides,
// after an update of diag and after an update of parent (every cell a chain: a new plan).
template <typename T>
void ComparePreparedCells(testing::Cells c, TreeMethod m, int64_t singular,
                          const std::string& expect) {
  SCOPED_TRACE(::testing::Message() << (sizeof(T) == 8 ? "float64 " : "float32 ")
                                    << MethodName(m));
  auto typed = c.As<T>();
  SystemSpec spec;
  spec.family = Family::kTree;
  spec.precision = sizeof(T) == 8 ? Precision::kFloat64 : Precision::kFloat32;
  spec.batch = c.cells();
  spec.n = c.total();
  spec.method = uint8_t(m);
  spec.coefficients = {typed.lower.data(), typed.upper.data(), typed.diag.data(), c.parent.data()};
  spec.lengths = c.lengths.data();
  auto system = Cuda()->Prepare(spec);
  ASSERT_TRUE(system.ok()) << system.status();
  const size_t N = size_t(c.total()), B = size_t(c.cells());
  const auto same = [](const std::vector<T>& want, const std::vector<T>& got, size_t at) {
    for (size_t i = 0; i < want.size(); ++i)
      if (std::memcmp(&want[i], &got[at + i], sizeof(T)) != 0)
        return ::testing::AssertionFailure() << "value " << at + i << ": " << got[at + i]
                                             << " against the one-shot " << want[i];
    return ::testing::AssertionSuccess();
  };
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(::testing::Message() << "round " << round);
    std::vector<T> two(typed.rhs);
    for (T v : typed.rhs) two.push_back(T(-3) * v);
    std::vector<T> x2(2 * N, T(std::nan("")));
    std::vector<SystemStatus> s2(2 * B, SystemStatus::kDiverged);
    auto k2 = Cuda()->SolvePrepared(**system, RhsBlock<T>{two.data(), 2}, x2.data(), s2.data(),
                                    SolveControl{});
    ASSERT_TRUE(k2.ok()) << k2.status();
    EXPECT_EQ(k2->method.rfind(expect, 0), 0u) << k2->method;
    for (int j = 0; j < 2; ++j) {
      auto t = typed;
      t.rhs.assign(two.begin() + long(j * N), two.begin() + long((j + 1) * N));
      TreeProblem<T> p = c.Problem(t);
      std::vector<T> want(N);
      std::vector<SystemStatus> want_st(B);
      for (int call = 0; call < 2; ++call) {  // (auto: the second sight is the device's)
        auto one = Cuda()->Solve(p, m, TreeOutput<T>{want.data(), want_st.data()}, SolveControl{});
        ASSERT_TRUE(one.ok()) << one.status();
        if (call == 1) {
          EXPECT_EQ(one->method, k2->method);
        }
      }
      std::vector<T> x(N, T(std::nan("")));
      std::vector<SystemStatus> st(B, SystemStatus::kDiverged);
      auto by_handle = Cuda()->SolvePrepared(**system, RhsBlock<T>{t.rhs.data()}, x.data(),
                                             st.data(), SolveControl{});
      ASSERT_TRUE(by_handle.ok()) << by_handle.status();
      EXPECT_TRUE(same(want, x, 0)) << "rhs " << j;
      EXPECT_TRUE(same(want, x2, j * N)) << "rhs " << j << " of 2";
      EXPECT_EQ(st, want_st);
      EXPECT_TRUE(std::equal(want_st.begin(), want_st.end(), s2.begin() + long(j * B)));
      for (size_t k = 0; k < B; ++k)
        EXPECT_EQ(st[k] == SystemStatus::kSingular, int64_t(k) == singular) << "cell " << k;
      // (Round 2's chains keep coefficients made dominant for other trees.)
      EXPECT_LE(TreeBackwardError(p, x.data(), st.data()),
                (sizeof(T) == 8 ? 1e-15 : 1e-6) * (round == 2 ? 10 : 1));
    }
    if (round == 0) {
      for (size_t i = 0; i < N; ++i) typed.diag[i] = T(typed.diag[i] * T(1.5));
      ASSERT_TRUE((*system)->Update(2, typed.diag.data()).ok());
      if (singular >= 0) singular = -1;  // ([[1.5, 1], [1, 1.5]] is not singular)
    } else if (round == 1) {
      for (int64_t k = 0; k < c.cells(); ++k)
        for (int64_t i = c.offsets[size_t(k)]; i < c.offsets[size_t(k) + 1]; ++i)
          c.parent[size_t(i)] = i == c.offsets[size_t(k)] ? -1 : int32_t(i - c.offsets[size_t(k)] - 1);
      ASSERT_TRUE((*system)->Update(3, c.parent.data()).ok());
    }
  }
}

TEST(CudaTreeCellsPrepared, AnswerAsTheOneShotDeviceCallBitForBit) {
  REQUIRE_GPU();
  const testing::Cells c = MorphologyCells(1200, 11, 33);
  ComparePreparedCells<double>(c, TreeMethod::kAuto, 33, kPerCell);
  ComparePreparedCells<float>(c, TreeMethod::kContraction, 33, kPerCell);
  ComparePreparedCells<double>(c, TreeMethod::kCables, 33, kPerCellCables);
  // Cells too large for a block among small ones: those as one tree, from the host copy.
  std::mt19937_64 rng(12);
  testing::Cells mixed;
  for (int k = 0; k < 300; ++k)
    mixed.AddRandom(testing::RandomParents(k % 100 == 7 ? 9000 : 1 + int64_t(rng() % 500), rng),
                    rng);
  ComparePreparedCells<double>(mixed, TreeMethod::kAuto, -1, kPerCell);
}

// One device call on the per-cell plan, on its own non-blocking stream, as a caller of the
// kernels library makes it: the inputs arrive on that stream behind a long copy (a launch that
// did not wait for the caller's stream would read zeros), and x is copied on it right after
// the call (a launch not joined back could still be writing). rhs_scale varies the answer.
template <typename T>
void SolveCellsOnItsStream(const testing::Cells& c, const cuda::TreeCellsPlan& plan,
                           cuda::TreeCellsLaunches order, double rhs_scale, std::vector<T>& x,
                           std::vector<uint8_t>& flags) {
  const auto typed = c.As<T>();
  const int64_t total = c.total(), cells = c.cells();
  const size_t bytes = sizeof(T) * size_t(total), filler = size_t(1) << 29;
  std::vector<T> rhs(typed.rhs.begin(), typed.rhs.end());
  for (T& v : rhs) v = T(double(v) * rhs_scale);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  T *src[4], *in[4], *dx, *dx_copy;
  uint8_t* df;
  void *fa, *fb;
  for (int q = 0; q < 4; ++q) {
    ASSERT_EQ(cudaMalloc(&src[q], bytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&in[q], bytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(in[q], 0, bytes), cudaSuccess);
  }
  const T* host[4] = {typed.lower.data(), typed.upper.data(), typed.diag.data(), rhs.data()};
  for (int q = 0; q < 4; ++q)
    ASSERT_EQ(cudaMemcpy(src[q], host[q], bytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dx, bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dx_copy, bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&df, size_t(cells)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&fa, filler), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&fb, filler), cudaSuccess);
  ASSERT_EQ(cudaMemset(dx, 0xff, bytes), cudaSuccess);  // NaN wherever no block writes
  ASSERT_EQ(cudaMemset(df, 0, size_t(cells)), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(fb, fa, filler, cudaMemcpyDeviceToDevice, s), cudaSuccess);
  for (int q = 0; q < 4; ++q)
    ASSERT_EQ(cudaMemcpyAsync(in[q], src[q], bytes, cudaMemcpyDeviceToDevice, s), cudaSuccess);
  TreeProblem<T> p = c.Problem(typed);
  p.parent = nullptr;
  p.lower = in[0];
  p.upper = in[1];
  p.diag = in[2];
  p.rhs = in[3];
  const absl::Status st = cuda::SolveTreeCellsBlockDevice(p, plan, dx, df, s, order);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaMemcpyAsync(dx_copy, dx, bytes, cudaMemcpyDeviceToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  x.assign(size_t(total), T(0));
  flags.assign(size_t(cells), 0);
  ASSERT_EQ(cudaMemcpy(x.data(), dx_copy, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(flags.data(), df, size_t(cells), cudaMemcpyDeviceToHost), cudaSuccess);
  for (void* b : {static_cast<void*>(dx), static_cast<void*>(dx_copy), static_cast<void*>(df), fa,
                  fb})
    cudaFree(b);
  for (int q = 0; q < 4; ++q) {
    cudaFree(src[q]);
    cudaFree(in[q]);
  }
  cudaStreamDestroy(s);
}

// The size classes' launches overlapped (the default) answer as one after the other, bit for
// bit, alone and as two calls on one plan at once from two threads (each call's own events:
// one call's fork or join must not wait for the other's launches, nor miss its own).
template <typename T>
void CompareLaunchOrders(const testing::Cells& c, cuda::TreeCellsKind kind, double tol) {
  cuda::Pool pool(cuda::Pool::Kind::kDevice, 0, int64_t{1} << 30);
  auto plan = cuda::TreeCellsPlan::Make(c.parent.data(), c.offsets.data(), c.cells(),
                                        int(sizeof(T)), pool, nullptr, 0, kind);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ((*plan)->block_cells(), c.cells());
  ASSERT_GE((*plan)->launches(), 5);  // (sizes 1 .. 3,187: a launch a halving)
  std::vector<T> xs[2], xo[2];
  std::vector<uint8_t> fs[2], fo[2];
  for (int k = 0; k < 2; ++k)
    SolveCellsOnItsStream<T>(c, **plan, cuda::TreeCellsLaunches::kSerial, 1.0 + k, xs[k], fs[k]);
  // The serial answer against the CPU reference, a cell at a time.
  const auto typed = c.As<T>();
  const TreeProblem<T> hp = c.Problem(typed);
  std::vector<T> xc(size_t(c.total()));
  std::vector<SystemStatus> sc(size_t(c.cells()));
  cpu::SolveTree(hp, kind == cuda::TreeCellsKind::kCables ? TreeMethod::kCables
                                                          : TreeMethod::kContraction,
                 TreeOutput<T>{xc.data(), sc.data()});
  for (int64_t s = 0; s < c.cells(); ++s) {
    ASSERT_EQ(fs[0][size_t(s)] != 0, sc[size_t(s)] != SystemStatus::kOk) << "cell " << s;
    if (sc[size_t(s)] != SystemStatus::kOk) continue;
    for (int64_t i = c.offsets[size_t(s)]; i < c.offsets[size_t(s) + 1]; ++i)
      ASSERT_NEAR(double(xs[0][size_t(i)]), double(xc[size_t(i)]),
                  tol * (1 + std::abs(double(xc[size_t(i)]))))
          << "cell " << s << ", node " << i;
  }
  SolveCellsOnItsStream<T>(c, **plan, cuda::TreeCellsLaunches::kOverlapped, 1.0, xo[0], fo[0]);
  EXPECT_EQ(std::memcmp(xo[0].data(), xs[0].data(), sizeof(T) * xs[0].size()), 0);
  EXPECT_EQ(fo[0], fs[0]);
  std::thread other([&] {
    SolveCellsOnItsStream<T>(c, **plan, cuda::TreeCellsLaunches::kOverlapped, 2.0, xo[1], fo[1]);
  });
  SolveCellsOnItsStream<T>(c, **plan, cuda::TreeCellsLaunches::kOverlapped, 1.0, xo[0], fo[0]);
  other.join();
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE(::testing::Message() << "concurrent call " << k);
    EXPECT_EQ(std::memcmp(xo[k].data(), xs[k].data(), sizeof(T) * xs[k].size()), 0);
    EXPECT_EQ(fo[k], fs[k]);
  }
}

TEST(CudaTreeCells, OverlappedLaunchesAnswerAsSerialBitForBit) {
  REQUIRE_GPU();
  const testing::Cells c = MorphologyCells(3000, 23, 500);
  CompareLaunchOrders<double>(c, cuda::TreeCellsKind::kContraction, 1e-12);
  CompareLaunchOrders<float>(c, cuda::TreeCellsKind::kContraction, 2e-3);
  CompareLaunchOrders<double>(c, cuda::TreeCellsKind::kCables, 1e-12);
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
