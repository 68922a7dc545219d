// The multigrid V-cycle of multigrid-cg and multigrid-bicgstab launched as a CUDA graph against
// its plain launches (cuda::SetBlockLaunches): the same bits, one-shot and by a prepared
// system (whose second solve reuses the kept work and captures nothing), float64 and float32,
// and from two threads at once. Skips, saying so, without a GPU.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "block/block.h"
#include "block_systems.h"
#include "cuda_test_util.h"
#include "gtest/gtest.h"
#include "trisolve/block_tridiagonal.h"
#include "trisolve/examples.h"
#include "trisolve/reference/block_tridiagonal.h"
#include "trisolve/system.h"

namespace trisolve {
namespace {

using ::trisolve::testing::Cuda;

// Puts the process back on the environment's choice when a test ends, however it ends.
struct LaunchesFor {
  explicit LaunchesFor(cuda::BlockLaunches l) { cuda::SetBlockLaunches(l); }
  ~LaunchesFor() { cuda::SetBlockLaunches(cuda::BlockLaunches::kDefault); }
};

using ::trisolve::testing::Experiment;
using ::trisolve::testing::Sys;

template <typename T>
std::unique_ptr<PreparedSystem> Prepared(const Sys<T>& s, BlockMethod m, BlockOptions o) {
  const SystemSpec spec = s.Spec(m, o);
  auto system = Cuda()->Prepare(spec);
  EXPECT_TRUE(system.ok()) << system.status();
  return system.ok() ? *std::move(system) : nullptr;
}

template <typename T>
struct Answer {
  std::vector<T> y;
  SystemStatus status = SystemStatus::kDiverged;
  SolveInfo info;
};

template <typename T>
Answer<T> OneShot(const Sys<T>& s, BlockMethod m, BlockOptions o) {
  Answer<T> a;
  a.y.assign(size_t(s.N * s.M), T(std::nan("")));
  auto info = Cuda()->Solve(s.P(), m, o, BlockOutput<T>{a.y.data(), &a.status}, SolveControl{});
  EXPECT_TRUE(info.ok()) << info.status();
  if (info.ok()) a.info = *info;
  return a;
}

template <typename T>
Answer<T> ByHandle(const Sys<T>& s, PreparedSystem& system) {
  Answer<T> a;
  a.y.assign(size_t(s.N * s.M), T(std::nan("")));
  auto info = Cuda()->SolvePrepared(system, RhsBlock<T>{s.a.at("f").data()}, a.y.data(), &a.status,
                                    SolveControl{});
  EXPECT_TRUE(info.ok()) << info.status();
  if (info.ok()) a.info = *info;
  return a;
}

template <typename T>
void ExpectSameBits(const Answer<T>& a, const Answer<T>& b, const std::string& what) {
  EXPECT_EQ(a.status, b.status) << what;
  EXPECT_EQ(a.info.method, b.info.method) << what;
  EXPECT_EQ(a.info.iterations, b.info.iterations) << what;
  EXPECT_EQ(std::memcmp(&a.info.residual, &b.info.residual, sizeof(double)), 0) << what;
  ASSERT_EQ(a.y.size(), b.y.size()) << what;
  EXPECT_EQ(std::memcmp(a.y.data(), b.y.data(), a.y.size() * sizeof(T)), 0)
      << what << ": x differs";
}

// The preconditioner applications of a solve of `it` iterations, at least: CG's once before
// and once an iteration, BiCGStab's twice an iteration but the last, which may stop halfway.
int64_t Applications(BlockMethod m, int64_t it) {
  return m == BlockMethod::kMultigridCg ? it + 1 : 2 * it - 1;
}

// One system and method: plain launches and graphs, one-shot and by handle, all four the same
// bits; the graphs ran (the count of V-cycles launched as graphs rose by every preconditioner
// application); the plain launches launched none; the answer's status is the CPU reference's
// and, converged, its residual from the original arrays on the host is within the tolerance.
template <typename T>
void GraphsGiveThePlainAnswer(const Sys<T>& s, BlockMethod m, double tol) {
  const std::string what = std::string(MethodName(m)) +
                           (sizeof(T) == 8 ? " float64 " : " float32 ") + std::to_string(s.N) +
                           "x" + std::to_string(s.M);
  const BlockOptions o{400, tol, false};
  auto system = Prepared(s, m, o);
  ASSERT_NE(system, nullptr);
  std::map<cuda::BlockLaunches, std::pair<Answer<T>, Answer<T>>> got;
  for (auto l : {cuda::BlockLaunches::kPlain, cuda::BlockLaunches::kGraph}) {
    const LaunchesFor launches(l);
    ASSERT_EQ(cuda::BlockGraphsOn(), l == cuda::BlockLaunches::kGraph);
    const int64_t before = cuda::VCycleGraphLaunches();
    const int64_t captured = cuda::VCycleGraphCaptures();
    Answer<T> once = OneShot(s, m, o);
    const int64_t between = cuda::VCycleGraphLaunches();
    Answer<T> kept = ByHandle(s, *system);
    const int64_t after = cuda::VCycleGraphLaunches();
    if (l == cuda::BlockLaunches::kGraph) {
      EXPECT_GE(between - before, Applications(m, once.info.iterations)) << what;
      EXPECT_GE(after - between, Applications(m, kept.info.iterations)) << what;
      EXPECT_GT(after - between, 0) << what;
      // The next solve by handle reuses the work the system kept, graphs included: it
      // captures nothing, replays them, and answers the same bits.
      const int64_t captures = cuda::VCycleGraphCaptures();
      Answer<T> again = ByHandle(s, *system);
      EXPECT_EQ(cuda::VCycleGraphCaptures(), captures)
          << what << ": the second solve by handle captured its graphs again";
      EXPECT_GE(cuda::VCycleGraphLaunches() - after, Applications(m, again.info.iterations))
          << what;
      ExpectSameBits(kept, again, what + ", by handle twice");
    } else {
      EXPECT_EQ(after, before) << what << ": plain launches ran a graph";
      EXPECT_EQ(cuda::VCycleGraphCaptures(), captured) << what << ": plain launches captured";
    }
    got[l] = {std::move(once), std::move(kept)};
  }
  const auto& plain = got[cuda::BlockLaunches::kPlain];
  const auto& graph = got[cuda::BlockLaunches::kGraph];
  ExpectSameBits(plain.first, graph.first, what + ", one-shot: graph against plain");
  ExpectSameBits(plain.second, graph.second, what + ", by handle: graph against plain");
  ExpectSameBits(plain.first, plain.second, what + ", plain: by handle against one-shot");
  EXPECT_GE(graph.first.info.iterations, 1) << what;
  std::vector<T> yc(size_t(s.N * s.M));
  SystemStatus sc = SystemStatus::kDiverged;
  auto cpu = cpu::SolveBlockTridiagonal(s.P(), m, o, BlockOutput<T>{yc.data(), &sc});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(graph.first.status, sc)
      << what << ": " << graph.first.info.method << " / " << cpu->method;
  if (sizeof(T) == 8) {
    EXPECT_EQ(graph.first.status, SystemStatus::kOk) << what;
  }
  if (graph.first.status == SystemStatus::kOk) {
    EXPECT_LE(BlockRelativeResidual(s.P(), graph.first.y.data()), 10 * tol) << what;
    EXPECT_LE(BlockRelativeResidual(s.P(), graph.second.y.data()), 10 * tol) << what;
  }
}

TEST(CudaBlockGraphs, GiveThePlainLaunchesAnswerBitForBit) {
  REQUIRE_GPU();
  // Symmetric positive definite (experiment 2) for both methods; experiment 1 (not symmetric)
  // for BiCGStab; N != M; a size with one level (under the coarsest's 256 cells) and sizes of
  // 4 and 6 levels.
  for (auto [N, M] : {std::pair<int64_t, int64_t>{12, 10}, {96, 80}, {300, 200}}) {
    GraphsGiveThePlainAnswer(Experiment<double>(2, N, M), BlockMethod::kMultigridCg, 1e-10);
    GraphsGiveThePlainAnswer(Experiment<float>(2, N, M), BlockMethod::kMultigridCg, 1e-5);
    GraphsGiveThePlainAnswer(Experiment<double>(2, N, M), BlockMethod::kMultigridBicgstab, 1e-10);
    GraphsGiveThePlainAnswer(Experiment<float>(2, N, M), BlockMethod::kMultigridBicgstab, 1e-5);
    GraphsGiveThePlainAnswer(Experiment<double>(1, N, M), BlockMethod::kMultigridBicgstab, 1e-10);
  }
}

// Where the V-cycle cannot be captured (the legacy default stream) the solve launches it
// plainly: no graph, no error, the same bits as the plain launches on a stream of its own.
TEST(CudaBlockGraphs, LegacyStreamFallsBackToThePlainLaunches) {
  REQUIRE_GPU();
  const Sys<double> s = Experiment<double>(2, 96, 80);
  const int64_t n = s.N * s.M;
  std::vector<double*> d;
  for (const char* k : {"aC", "cC", "bC", "cA", "cB", "f"}) {
    double* p = nullptr;
    ASSERT_EQ(cudaMalloc(&p, n * sizeof(double)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(p, s.a.at(k).data(), n * sizeof(double), cudaMemcpyHostToDevice),
              cudaSuccess);
    d.push_back(p);
  }
  double* y = nullptr;
  ASSERT_EQ(cudaMalloc(&y, n * sizeof(double)), cudaSuccess);
  cudaStream_t own;
  ASSERT_EQ(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking), cudaSuccess);
  cuda::Pool pool(cuda::Pool::Kind::kDevice, 0, int64_t{1} << 30);
  const BlockTridiagonalProblem<double> p{s.N, s.M, d[0], d[1], d[2], d[3], d[4], d[5], nullptr};
  auto solve = [&](cudaStream_t stream) {
    Answer<double> a;
    EXPECT_EQ(cudaMemset(y, 0, n * sizeof(double)), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto info = cuda::SolveBlockTridiagonalDevice(p, BlockMethod::kMultigridCg, {400, 1e-10, false},
                                                  y, &a.status, pool, SolveControl{}, stream);
    EXPECT_TRUE(info.ok()) << info.status();
    if (info.ok()) a.info = *info;
    a.y.resize(size_t(n));
    EXPECT_EQ(cudaMemcpy(a.y.data(), y, n * sizeof(double), cudaMemcpyDeviceToHost), cudaSuccess);
    return a;
  };
  Answer<double> plain, legacy, graph;
  {
    const LaunchesFor launches(cuda::BlockLaunches::kPlain);
    plain = solve(own);
  }
  {
    const LaunchesFor launches(cuda::BlockLaunches::kGraph);
    const int64_t before = cuda::VCycleGraphLaunches();
    legacy = solve(nullptr);
    EXPECT_EQ(cuda::VCycleGraphLaunches(), before) << "a graph captured from the legacy stream";
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the refused capture left no error behind
    graph = solve(own);
    EXPECT_GT(cuda::VCycleGraphLaunches(), before);
  }
  ExpectSameBits(plain, legacy, "legacy stream against plain launches");
  ExpectSameBits(plain, graph, "graph against plain launches");
  EXPECT_EQ(plain.status, SystemStatus::kOk);
  EXPECT_LE(BlockRelativeResidual(s.P(), plain.y.data()), 1e-9);
  cudaStreamDestroy(own);
  for (double* q : d) cudaFree(q);
  cudaFree(y);
}

// Two threads solve different systems on one device at once, each capturing and replaying its
// own graphs (thread-local capture: the other's launches go on meanwhile), one-shot and by
// handle in turn: every answer bit for bit the serial one.
TEST(CudaBlockGraphs, TwoThreadsAtOnceAnswerAsSerially) {
  REQUIRE_GPU();
  const LaunchesFor launches(cuda::BlockLaunches::kGraph);
  const Sys<double> cg = Experiment<double>(2, 160, 144);
  const Sys<double> bicg = Experiment<double>(1, 128, 120);
  const BlockOptions o{400, 1e-10, false};
  auto cg_system = Prepared(cg, BlockMethod::kMultigridCg, o);
  auto bicg_system = Prepared(bicg, BlockMethod::kMultigridBicgstab, o);
  ASSERT_NE(cg_system, nullptr);
  ASSERT_NE(bicg_system, nullptr);
  const Answer<double> cg_serial = OneShot(cg, BlockMethod::kMultigridCg, o);
  const Answer<double> bicg_serial = OneShot(bicg, BlockMethod::kMultigridBicgstab, o);
  ASSERT_EQ(cg_serial.status, SystemStatus::kOk);
  ASSERT_EQ(bicg_serial.status, SystemStatus::kOk);
  constexpr int kRounds = 12;
  std::vector<Answer<double>> cg_got(kRounds), bicg_got(kRounds);
  const int64_t before = cuda::VCycleGraphLaunches();
  std::thread a([&] {
    for (int r = 0; r < kRounds; ++r)
      cg_got[size_t(r)] =
          r % 2 ? ByHandle(cg, *cg_system) : OneShot(cg, BlockMethod::kMultigridCg, o);
  });
  std::thread b([&] {
    for (int r = 0; r < kRounds; ++r)
      bicg_got[size_t(r)] =
          r % 2 ? ByHandle(bicg, *bicg_system) : OneShot(bicg, BlockMethod::kMultigridBicgstab, o);
  });
  a.join();
  b.join();
  EXPECT_GE(cuda::VCycleGraphLaunches() - before,
            kRounds * (Applications(BlockMethod::kMultigridCg, cg_serial.info.iterations) +
                       Applications(BlockMethod::kMultigridBicgstab, bicg_serial.info.iterations)));
  for (int r = 0; r < kRounds; ++r) {
    ExpectSameBits(cg_serial, cg_got[size_t(r)], "multigrid-cg, round " + std::to_string(r));
    ExpectSameBits(bicg_serial, bicg_got[size_t(r)],
                   "multigrid-bicgstab, round " + std::to_string(r));
  }
  EXPECT_LE(BlockRelativeResidual(cg.P(), cg_serial.y.data()), 1e-9);
  EXPECT_LE(BlockRelativeResidual(bicg.P(), bicg_serial.y.data()), 1e-9);
}

// One prepared system solved from two threads at once: one solve takes the work the system
// keeps, the other makes its own (the library does not count on its callers to serialise a
// handle's solves); every answer bit for bit the serial one.
TEST(CudaBlockGraphs, OneHandleFromTwoThreadsAtOnce) {
  REQUIRE_GPU();
  const LaunchesFor launches(cuda::BlockLaunches::kGraph);
  const Sys<double> s = Experiment<double>(2, 160, 144);
  const BlockOptions o{400, 1e-10, false};
  for (BlockMethod m : {BlockMethod::kMultigridCg, BlockMethod::kMultigridBicgstab}) {
    const std::string what = std::string(MethodName(m));
    auto system = Prepared(s, m, o);
    ASSERT_NE(system, nullptr);
    const Answer<double> serial = ByHandle(s, *system);
    ASSERT_EQ(serial.status, SystemStatus::kOk) << what;
    constexpr int kRounds = 10;
    std::vector<Answer<double>> got(2 * kRounds);
    const int64_t before = cuda::VCycleGraphLaunches();
    std::thread a([&] {
      for (int r = 0; r < kRounds; ++r) got[size_t(r)] = ByHandle(s, *system);
    });
    std::thread b([&] {
      for (int r = 0; r < kRounds; ++r) got[size_t(kRounds + r)] = ByHandle(s, *system);
    });
    a.join();
    b.join();
    EXPECT_GE(cuda::VCycleGraphLaunches() - before,
              2 * kRounds * Applications(m, serial.info.iterations))
        << what;
    for (size_t r = 0; r < got.size(); ++r)
      ExpectSameBits(serial, got[r], what + ", solve " + std::to_string(r));
    EXPECT_LE(BlockRelativeResidual(s.P(), serial.y.data()), 1e-9) << what;
  }
}

}  // namespace
}  // namespace trisolve
