// The CUDA backend against the CPU reference on random diagonally dominant systems. Skips,
// saying so, where no CUDA device is present (CI has none); run on the lent GPU.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "block/block.h"
#include "cuda_test_util.h"
#include "error_measure.h"
#include "gtest/gtest.h"
#include "tridiagonal/tridiagonal.h"
#include "tuning_table.h"
#include "trisolve/backend.h"
#include "trisolve/reference/tridiagonal.h"
#include "trisolve/tridiagonal.h"

namespace trisolve {
namespace {

using ::trisolve::testing::Cuda;


template <typename T>
struct Data {
  std::vector<T> a, b, c, d;
  TridiagonalProblem<T> P(int64_t batch, int64_t n, Layout l) const {
    return {batch, n, l, a.data(), b.data(), c.data(), d.data()};
  }
};

template <typename T>
Data<T> Random(int64_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  Data<T> s;
  for (auto* v : {&s.a, &s.b, &s.c, &s.d}) v->resize(size_t(count));
  for (int64_t e = 0; e < count; ++e) {
    s.a[e] = T(u(rng));
    s.c[e] = T(u(rng));
    s.b[e] = T((std::abs(double(s.a[e])) + std::abs(double(s.c[e])) + 0.5 + std::abs(u(rng))) *
               (u(rng) < 0 ? -1 : 1));
    s.d[e] = T(u(rng));
  }
  return s;
}

struct Case {
  int64_t n, batch;
};

// A tuning table of the test's own, in use on this thread while the test runs (the backend's
// table yields to it), starting from the one in use before; dropped when the test ends, however
// it ends (a failed assertion included), so that no test runs with another's settings.
class ScopedTuning {
 public:
  ScopedTuning() : saved_(cuda::ActiveTuning()), table_(saved_), use_(&table_) {}
  ScopedTuning(const ScopedTuning&) = delete;
  ScopedTuning& operator=(const ScopedTuning&) = delete;
  // Runs with the saved tuning changed by `edit` (fields the test forces).
  void Set(const std::function<void(cuda::PartitionedTuning&)>& edit) const {
    table_.tridiagonal = saved_.tridiagonal;
    edit(table_.tridiagonal);
  }
  // The same for the row sweeps' tuning.
  void SetSweeps(const std::function<void(cuda::SweepTuning&)>& edit) const {
    table_.sweeps = saved_.sweeps;
    edit(table_.sweeps);
  }

 private:
  const cuda::TuningTable saved_;
  mutable cuda::TuningTable table_;  // read by the kernels' entry points through use_
  const cuda::UseTuning use_;
};

class CudaTridiagonal : public ::testing::TestWithParam<std::tuple<Case, Layout, TridiagonalMethod>> {};

// Returns the kernel that ran (SolveInfo::method, less auto's " + pivoting (k systems)": the
// systems whose pivot vanished, solved again by the pivoting kernel on the device -- on the
// host below 32 systems, cuda::kPivotingDeviceBatch). `edit`, where given,
// changes the random systems instead of the two given a zero first pivot -- nonsingular, so
// auto re-solves them by pivoting (and is compared with the CPU's auto, which does the same)
// while the other methods report them SINGULAR (compared with the CPU's Thomas).
template <typename T>
std::string Compare(const Case& k, Layout layout, TridiagonalMethod m, double tol_x,
                    double tol_be, const std::function<void(Data<T>&)>& edit = nullptr) {
  const int64_t count = k.n * k.batch;
  auto data = Random<T>(count, uint64_t(k.n * 7 + k.batch));
  if (edit) {
    edit(data);
  } else if (k.batch >= 3) {  // two systems made singular (a zero first pivot)
    data.b[ElementIndex(layout, k.batch, k.n, 1, 0)] = T(0);
    data.b[ElementIndex(layout, k.batch, k.n, k.batch - 1, 0)] = T(0);
  }
  const auto p = data.P(k.batch, k.n, layout);
  std::vector<T> xg(count, T(std::nan(""))), xc(count);
  std::vector<SystemStatus> sg(k.batch, SystemStatus::kDiverged), sc(k.batch);
  auto info = Cuda()->Solve(p, m, TridiagonalOutput<T>{xg.data(), sg.data()}, SolveControl{});
  EXPECT_TRUE(info.ok()) << info.status();
  if (!info.ok()) return "";
  const bool automatic = m == TridiagonalMethod::kAuto;
  cpu::SolveTridiagonal(p, automatic ? TridiagonalMethod::kAuto : TridiagonalMethod::kThomas,
                        TridiagonalOutput<T>{xc.data(), sc.data()});
  // (" + pivoting-split (k systems)" where the device's split solved them again)
  const size_t plus = info->method.find(" + pivoting");
  if (automatic && !edit && k.batch >= 3) {
    EXPECT_TRUE(info->method.find(" + pivoting (2 systems)") != std::string::npos ||
                info->method.find(" + pivoting-split (2 systems)") != std::string::npos)
        << info->method;
  }
  if (!automatic) {
    EXPECT_EQ(plus, std::string::npos) << info->method;
  }
  if (plus != std::string::npos) info->method.resize(plus);
  int64_t mismatched = 0;
  double worst = 0;
  for (int64_t s = 0; s < k.batch; ++s) {
    if (sg[s] != sc[s]) ++mismatched;
    if (sc[s] != SystemStatus::kOk) {
      for (int64_t i = 0; i < k.n; ++i) {
        EXPECT_EQ(xg[ElementIndex(layout, k.batch, k.n, s, i)], T(0));
        if (xg[ElementIndex(layout, k.batch, k.n, s, i)] != T(0)) return info->method;
      }
      continue;
    }
    double dmax = 0, xmax = 0;
    for (int64_t i = 0; i < k.n; ++i) {
      const int64_t e = ElementIndex(layout, k.batch, k.n, s, i);
      dmax = testing::WorseOf(dmax, std::abs(double(xg[e]) - double(xc[e])));
      xmax = testing::WorseOf(xmax, std::abs(double(xc[e])));
    }
    worst = testing::WorseOf(worst, dmax / xmax);
  }
  EXPECT_EQ(mismatched, 0) << "systems whose status differs from the CPU reference";
  EXPECT_LE(worst, tol_x) << "method " << info->method;
  EXPECT_LE(TridiagonalBackwardError(p, xg.data(), sg.data()), tol_be) << info->method;
  ::testing::Test::RecordProperty("kernel", info->method);
  return info->method;
}

TEST_P(CudaTridiagonal, Float64MatchesTheCpuReference) {
  REQUIRE_GPU();
  const auto [k, layout, m] = GetParam();
  if (m == TridiagonalMethod::kThomas && k.batch < 64 && k.n > 70000)
    GTEST_SKIP() << "thomas runs one thread per system: " << k.batch << " threads for " << k.n
                 << " rows is a sequential solve";
  Compare<double>(k, layout, m, 1e-12, 1e-15);
}

TEST_P(CudaTridiagonal, Float32MatchesTheCpuReference) {
  REQUIRE_GPU();
  const auto [k, layout, m] = GetParam();
  if (m == TridiagonalMethod::kThomas && k.batch < 64 && k.n > 70000)
    GTEST_SKIP() << "thomas: one thread per system";
  Compare<float>(k, layout, m, 2e-4, 3e-6);
}

std::string ShapeName(
    const ::testing::TestParamInfo<std::tuple<Case, Layout, TridiagonalMethod>>& p) {
  const Case k = std::get<0>(p.param);
  return "n" + std::to_string(k.n) + "_batch" + std::to_string(k.batch) +
         (std::get<1>(p.param) == Layout::kFlat ? "_flat_" : "_interleaved_") +
         std::string(MethodName(std::get<2>(p.param)));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaTridiagonal,
    ::testing::Combine(::testing::Values(Case{1, 1 << 20}, Case{2, 1000}, Case{3, 777},
                                         Case{31, 4096}, Case{32, 1 << 15}, Case{33, 1000},
                                         Case{256, 3000}, Case{1000, 1000}, Case{2500, 50},
                                         Case{4096, 64}, Case{4097, 100},
                                         Case{65537, 16}, Case{1 << 20, 4}, Case{1 << 24, 1}),
                       ::testing::Values(Layout::kFlat, Layout::kInterleaved),
                       ::testing::Values(TridiagonalMethod::kAuto, TridiagonalMethod::kThomas,
                                         TridiagonalMethod::kPcr,
                                         TridiagonalMethod::kPartitioned)),
    ShapeName);

// The flat one-pass kernel's two ways of reading a thread's rows -- staged through a shared-
// memory tile, or loaded directly (16-byte vectors where n allows) -- each forced, with 4, 8 and
// 16 rows a thread: chunks ending inside a system, odd n (no vectors), n = 1 and 2.
TEST(CudaTridiagonal, FlatRowLoadsMatchTheCpuReference) {
  REQUIRE_GPU();
  const ScopedTuning scoped;
  for (int direct : {-1, 1})
    for (int chunk : {4, 8, 16}) {
      scoped.Set([&](cuda::PartitionedTuning& t) {
        t.flat_direct = direct;
        t.chunk = chunk;
        t.window = -1;  // the path this test forces, not the windows before it
      });
      for (Case k : {Case{1, 5000}, Case{2, 1000}, Case{3, 777}, Case{31, 4096}, Case{32, 1 << 15},
                     Case{33, 1000}, Case{100, 999}, Case{256, 3000}, Case{1000, 1000},
                     Case{2500, 50}, Case{4096, 64}}) {
        if (k.n > int64_t(chunk) * (chunk == 16 ? 256 : 512)) continue;  // one block a system
        SCOPED_TRACE(::testing::Message() << "direct " << direct << " chunk " << chunk << " n "
                                        << k.n);
        Compare<double>(k, Layout::kFlat, TridiagonalMethod::kPartitioned, 1e-12, 1e-15);
        Compare<float>(k, Layout::kFlat, TridiagonalMethod::kPartitioned, 2e-4, 3e-6);
      }
    }
}

// The cluster form (a system over 2, 4 or 8 blocks of a thread-block cluster), forced for every
// cluster size, rows a thread and block size that hold n, both layouts and precisions: odd n
// (chunks ending inside a system, no 16-byte vectors), a system over more blocks than it needs,
// singular systems (Compare makes two).
TEST(CudaTridiagonal, ClusterShapesMatchTheCpuReference) {
  REQUIRE_GPU();
  const ScopedTuning scoped;
  int ran = 0;
  for (int q : {2, 4, 8})
    for (int chunk : {8, 16})
      for (int threads : {64, 256}) {
        scoped.Set([&](cuda::PartitionedTuning& t) {
          t.cluster = q;
          t.chunk = chunk;
          t.min_threads = threads;
          t.window = -1;  // the path this test forces, not the windows before it
          t.thomas_window = -1;
        });
        for (Layout layout : {Layout::kFlat, Layout::kInterleaved})
          for (Case k : {Case{5, 1000}, Case{100, 999}, Case{1000, 300}, Case{1025, 77},
                         Case{2500, 50}, Case{4096, 64}, Case{4097, 33}, Case{8192, 20}}) {
            const auto kernel = cuda::ChooseTridiagonalKernel(TridiagonalMethod::kAuto, k.n,
                                                              k.batch, layout, false);
            if (kernel != cuda::TridiagonalKernel::kPartitionedCluster)
              continue;  // no cluster shape of this size holds n
            SCOPED_TRACE(::testing::Message() << "cluster " << q << " chunk " << chunk
                                              << " threads " << threads << " n " << k.n
                                              << (layout == Layout::kFlat ? " flat" : " inter"));
            EXPECT_EQ(Compare<double>(k, layout, TridiagonalMethod::kPartitioned, 1e-12, 1e-15),
                      "partitioned-cluster");
            EXPECT_EQ(Compare<float>(k, layout, TridiagonalMethod::kPartitioned, 2e-4, 3e-6),
                      "partitioned-cluster");
            ++ran;
          }
      }
  EXPECT_GE(ran, 100) << "too few shapes ran the cluster kernel";
}

// What `auto` runs by shape on this device (compute capability 9.0+: the lent H100/H200), as
// the H100 sweep measured fastest (tridiagonal.cu), and that the solve reports it -- or, where
// `auto` tries the windows on a batch with Compare's two singular systems, the kernel that
// solves it instead (`ran`).
TEST(CudaTridiagonal, AutoPicksTheMeasuredKernelByShape) {
  REQUIRE_GPU();
  using K = cuda::TridiagonalKernel;
  struct Pick {
    int64_t n, batch;
    Layout layout;
    bool float32;
    K kernel;
    std::optional<K> ran = std::nullopt;  // where it is not `kernel`
  };
  const K W = K::kPartitionedWindow;
  const K TW = K::kThomasWindow;
  for (const Pick& c : {Pick{32, 100, Layout::kFlat, false, K::kPartitioned},
                        Pick{64, 100, Layout::kFlat, false, K::kPartitionedStream},
                        Pick{128, 100, Layout::kFlat, false, K::kPartitioned},
                        Pick{128, 100, Layout::kFlat, true, K::kPartitioned},
                        Pick{1024, 64, Layout::kFlat, false, K::kPartitionedStream},
                        Pick{1024, 64, Layout::kFlat, true, K::kPartitioned},
                        Pick{4096, 64, Layout::kFlat, false, K::kPartitionedStream},
                        Pick{4098, 64, Layout::kFlat, false, TW},
                        Pick{4098, 2, Layout::kFlat, false, W},
                        Pick{6000, 64, Layout::kFlat, false, TW},
                        Pick{4097, 64, Layout::kFlat, true, K::kPartitionedCluster},
                        Pick{4095, 64, Layout::kFlat, false, K::kPartitioned},
                        Pick{8192, 64, Layout::kFlat, false, TW},
                        Pick{7168, 64, Layout::kFlat, false, TW},
                        Pick{7200, 64, Layout::kFlat, false, TW},
                        Pick{8192, 64, Layout::kFlat, true, W, K::kPartitionedCluster},
                        Pick{8192, 2, Layout::kFlat, true, W},
                        Pick{10240, 16, Layout::kFlat, false, TW},
                        Pick{12288, 16, Layout::kFlat, false, TW},
                        Pick{12288, 15, Layout::kFlat, false, W, K::kPartitionedClusterStream},
                        Pick{16384, 64, Layout::kFlat, false, TW},
                        Pick{16384, 8, Layout::kFlat, false, W, K::kPartitionedClusterStream},
                        Pick{16384, 8, Layout::kFlat, true, W, K::kPartitioned},
                        Pick{16384, 2, Layout::kFlat, true, W},
                        Pick{16386, 8, Layout::kFlat, true, K::kPartitioned},
                        Pick{16384, 8, Layout::kInterleaved, false, K::kPartitioned},
                        Pick{1 << 20, 16, Layout::kInterleaved, false, TW},
                        Pick{16384, 1, Layout::kInterleaved, false, W},
                        Pick{1 << 20, 2, Layout::kFlat, false, W},
                        Pick{1 << 24, 1, Layout::kFlat, false, TW},
                        Pick{(1 << 24) + 16, 1, Layout::kFlat, false, TW},
                        Pick{1 << 23, 1, Layout::kFlat, false, W},
                        Pick{1 << 20, 2, Layout::kInterleaved, true, K::kPartitioned},
                        Pick{128, 100, Layout::kInterleaved, false, K::kPartitioned},
                        Pick{256, 100, Layout::kInterleaved, false, K::kPartitionedStream},
                        Pick{512, 64, Layout::kInterleaved, false, K::kPartitionedStream},
                        Pick{512, 64, Layout::kInterleaved, true, TW},
                        Pick{1000, 64, Layout::kInterleaved, false, TW},
                        Pick{1024, 64, Layout::kInterleaved, false, TW},
                        Pick{1024, 63, Layout::kInterleaved, false, K::kPartitionedCluster},
                        Pick{2048, 64, Layout::kInterleaved, false, TW},
                        Pick{1024, 64, Layout::kInterleaved, true, TW},
                        Pick{4096, 64, Layout::kInterleaved, false, TW},
                        Pick{4096, 16, Layout::kInterleaved, false, TW},
                        Pick{4096, 16, Layout::kInterleaved, true, TW},
                        Pick{4096, 14, Layout::kInterleaved, false, K::kPartitioned},
                        Pick{4096, 1, Layout::kInterleaved, false, K::kPartitionedStream}}) {
    SCOPED_TRACE(::testing::Message() << "n " << c.n << " batch " << c.batch
                                      << (c.layout == Layout::kFlat ? " flat" : " interleaved")
                                      << (c.float32 ? " float32" : " float64"));
    EXPECT_EQ(cuda::ChooseTridiagonalKernel(TridiagonalMethod::kAuto, c.n, c.batch, c.layout,
                                            c.float32),
              c.kernel);
    const std::string ran =
        c.float32 ? Compare<float>({c.n, c.batch}, c.layout, TridiagonalMethod::kAuto, 2e-4, 3e-6)
                  : Compare<double>({c.n, c.batch}, c.layout, TridiagonalMethod::kAuto, 1e-12,
                                    1e-15);
    EXPECT_EQ(ran, cuda::KernelName(c.ran.value_or(c.kernel)));
  }
}

// The streamed one-pass kernel (persistent blocks, cp.async prefetch of the next systems),
// forced, with 8 and 16 rows a thread and 64-256 threads a block: many groups a block (large
// batches), chunks ending inside a system, singular systems (Compare makes two). n not a
// multiple of 16 bytes falls back to the one-pass kernel.
TEST(CudaTridiagonal, StreamedOnePassMatchesTheCpuReference) {
  REQUIRE_GPU();
  const ScopedTuning scoped;
  for (int chunk : {8, 16})
    for (int threads : {64, 256}) {
      scoped.Set([&](cuda::PartitionedTuning& t) {
        t.stream = 1;
        t.cluster = 1;
        t.chunk = chunk;
        t.min_threads = threads;
        t.window = -1;  // the path this test forces, not the windows before it
      });
      for (Case k : {Case{4, 5000}, Case{32, 1 << 15}, Case{100, 20001}, Case{256, 3000},
                     Case{1000, 1000}, Case{1002, 99}, Case{2048, 300}, Case{4096, 64}}) {
        if (k.n > int64_t(chunk) * 256) continue;
        SCOPED_TRACE(::testing::Message() << "chunk " << chunk << " threads " << threads
                                          << " n " << k.n);
        const std::string m64 =
            Compare<double>(k, Layout::kFlat, TridiagonalMethod::kPartitioned, 1e-12, 1e-15);
        EXPECT_EQ(m64, "partitioned-stream");
        const std::string m32 =
            Compare<float>(k, Layout::kFlat, TridiagonalMethod::kPartitioned, 2e-4, 3e-6);
        EXPECT_EQ(m32, k.n % 4 == 0 ? "partitioned-stream" : "partitioned");
      }
    }
}

// The streamed kernel on the interleaved layout, forced: groups of 2-32 systems (16 to 256 bytes
// a row), many groups a block, chunks ending inside a system, a last group only partly in the
// batch, singular systems (Compare makes two). Where a group's row is not whole 16-byte words
// (an odd batch, too few systems a block) the one-pass kernel runs instead.
TEST(CudaTridiagonal, StreamedInterleavedMatchesTheCpuReference) {
  REQUIRE_GPU();
  const ScopedTuning scoped;
  int streamed = 0;
  for (int chunk : {8, 16})
    for (int threads : {64, 256}) {
      scoped.Set([&](cuda::PartitionedTuning& t) {
        t.stream = 1;
        t.cluster = 1;
        t.two_pass = -1;
        t.chunk = chunk;
        t.min_threads = threads;
        t.window = -1;  // the path this test forces, not the windows before it
      });
      for (Case k : {Case{4, 5000}, Case{33, 1 << 14}, Case{100, 20001}, Case{100, 20000},
                     Case{256, 3000}, Case{1000, 1000}, Case{1002, 98}, Case{1024, 14},
                     Case{2048, 300}, Case{4096, 64}}) {
        if (k.n > int64_t(chunk) * 256) continue;
        int64_t P = 1;
        while (P * chunk < k.n) P *= 2;
        const int64_t S = std::max<int64_t>(P, threads) / P;
        auto applies = [&](int W) {
          return k.batch % W == 0 && S % W == 0 && (chunk * (S / W)) % 8 == 0;
        };
        SCOPED_TRACE(::testing::Message() << "chunk " << chunk << " threads " << threads
                                          << " n " << k.n << " batch " << k.batch);
        const std::string m64 =
            Compare<double>(k, Layout::kInterleaved, TridiagonalMethod::kPartitioned, 1e-12,
                            1e-15);
        EXPECT_EQ(m64, applies(2) ? "partitioned-stream" : "partitioned");
        const std::string m32 =
            Compare<float>(k, Layout::kInterleaved, TridiagonalMethod::kPartitioned, 2e-4, 3e-6);
        EXPECT_EQ(m32, applies(4) ? "partitioned-stream" : "partitioned");
        streamed += applies(2) + applies(4);
      }
    }
  EXPECT_GE(streamed, 30) << "too few shapes ran the streamed interleaved kernel";
}

// The two-pass path forced where one block would hold n (the benchmark's comparison), both
// layouts: small n, n inside one level chunk, odd n.
TEST(CudaTridiagonal, TwoPassForcedMatchesTheCpuReference) {
  REQUIRE_GPU();
  const ScopedTuning scoped;
  for (int level : {8, 16}) {
    scoped.Set([&](cuda::PartitionedTuning& t) {
      t.two_pass = 1;
      t.level_chunk = level;
      t.window = -1;  // the path this test forces, not the windows before it
    });
    for (Layout layout : {Layout::kFlat, Layout::kInterleaved})
      for (Case k : {Case{3, 777}, Case{5, 1000}, Case{33, 1000}, Case{1000, 300},
                     Case{4096, 64}}) {
        SCOPED_TRACE(::testing::Message() << "level " << level << " n " << k.n);
        Compare<double>(k, layout, TridiagonalMethod::kPartitioned, 1e-12, 1e-15);
        Compare<float>(k, layout, TridiagonalMethod::kPartitioned, 2e-4, 3e-6);
      }
  }
}

// Flat float64 systems by the block sweeps' streamed kernel (SolveRowsStreamed), forced where
// it takes n: one block of 256 threads (n <= 4096) and clusters of 2-8 blocks of 128, n a
// multiple of 16 (bulk tensor copies) or not (cp.async), and the copies forced to cp.async;
// batches of one system, fewer systems than persistent clusters and many more, singular systems
// (Compare makes two) flagged in place. float32 and the interleaved layout are not taken.
TEST(CudaTridiagonal, RowsStreamedMatchTheCpuReference) {
  REQUIRE_GPU();
  const ScopedTuning scoped;
  scoped.Set([&](cuda::PartitionedTuning& t) {
    t.rows_stream = 1;
    t.window = -1;  // the path this test forces, not the windows before it
  });
  for (int bulk : {0, -1}) {
    scoped.SetSweeps([&](cuda::SweepTuning& w) { w.bulk = bulk; });
    for (Case k : {Case{2050, 77}, Case{4096, 300}, Case{4097, 3}, Case{6000, 40},
                   Case{8192, 1}, Case{8192, 333}, Case{12000, 9}, Case{16383, 5},
                   Case{16384, 130}}) {
      SCOPED_TRACE(::testing::Message() << "bulk " << bulk << " n " << k.n << " batch "
                                        << k.batch);
      EXPECT_GT(cuda::RowsStreamCapacity(k.n), 0);
      const std::string ran =
          Compare<double>(k, Layout::kFlat, TridiagonalMethod::kPartitioned, 1e-12, 1e-15);
      EXPECT_EQ(ran, "partitioned-cluster-stream");
      if (k.batch > 1) {
        EXPECT_NE(Compare<float>(k, Layout::kFlat, TridiagonalMethod::kPartitioned, 2e-4, 3e-6),
                  "partitioned-cluster-stream");
        EXPECT_NE(Compare<double>(k, Layout::kInterleaved, TridiagonalMethod::kPartitioned, 1e-12,
                                  1e-15),
                  "partitioned-cluster-stream");
      }
    }
  }
  EXPECT_EQ(cuda::RowsStreamCapacity(2048), 0);
  EXPECT_EQ(cuda::RowsStreamCapacity(16385), 0);
}

// Overlapping windows (trisolve/windows.h), forced (window = 1), with the default halos and
// halos of 64 and 512 rows: two windows a system to hundreds, short last cores, batches of one
// to 40, float64 and float32, against the CPU reference. The random systems have (|a| + |c|) /
// |b| up to 0.8: windows with a halo of 64 rows (limits 0.56 / 0.77) fail their check, as do
// batches with singular systems (Compare makes two where batch >= 3); those are solved again
// by the exact path and flagged in place. n not whole 16-byte words never takes the windows.
TEST(CudaTridiagonal, WindowsMatchTheCpuReference) {
  REQUIRE_GPU();
  const ScopedTuning scoped;
  for (int halo : {0, 64, 512}) {
    scoped.Set([&](cuda::PartitionedTuning& t) {
      t.window = 1;
      t.window_halo = halo;
    });
    for (Case k : {Case{4098, 2}, Case{5000, 1}, Case{8192, 3}, Case{16384, 2}, Case{20000, 1},
                   Case{65536, 2}, Case{100000, 40}, Case{1 << 20, 1}}) {
      SCOPED_TRACE(::testing::Message() << "halo " << halo << " n " << k.n << " batch "
                                        << k.batch);
      const bool windows = halo != 64 && k.batch < 3;
      const std::string f64 =
          Compare<double>(k, Layout::kFlat, TridiagonalMethod::kPartitioned, 1e-12, 1e-15);
      EXPECT_EQ(f64 == "partitioned-window", windows) << f64;
      const std::string f32 =
          Compare<float>(k, Layout::kFlat, TridiagonalMethod::kPartitioned, 2e-4, 3e-6);
      EXPECT_EQ(f32 == "partitioned-window", windows && k.n % 4 == 0) << f32;
    }
  }
}

// Each window checks every row it reads against the limit of its halo (0.864 in float64,
// 0.935 in float32 by default): one row a little under it keeps the windows, one a little over
// sends the whole problem to the exact path -- in the middle of a system, in a halo only (the
// row before a core), and in the last window. A non-finite right-hand side or a vanishing pivot
// in one system sends it there too, and that system alone is flagged. The answers match the CPU
// reference either way.
TEST(CudaTridiagonal, WindowsFallBackWhereARowIsNotDominantEnough) {
  REQUIRE_GPU();
  const Case k{50000, 2};
  // Rows of system 1: one in the middle, the first of window 1's core (the cores are 3584 rows
  // in both types; the row is also in window 0's halo) and the last row.
  for (int64_t row : {int64_t{30001}, int64_t{3584}, int64_t{49999}}) {
    for (double ratio : {0.85, 0.87, 0.93, 0.94}) {
      SCOPED_TRACE(::testing::Message() << "row " << row << " ratio " << ratio);
      auto weak = [&](auto& data) {
        using T = std::decay_t<decltype(data.a[0])>;
        const int64_t e = k.n + row;
        const double off =
            std::abs(double(data.a[e])) + (row + 1 < k.n ? std::abs(double(data.c[e])) : 0.0);
        data.b[e] = T(off / ratio);
      };
      const std::string f64 = Compare<double>(k, Layout::kFlat, TridiagonalMethod::kAuto, 1e-12,
                                              1e-15, std::function<void(Data<double>&)>(weak));
      EXPECT_EQ(f64 == "partitioned-window", ratio < 0.864) << f64;
      const std::string f32 = Compare<float>(k, Layout::kFlat, TridiagonalMethod::kAuto, 2e-4,
                                             3e-6, std::function<void(Data<float>&)>(weak));
      EXPECT_EQ(f32 == "partitioned-window", ratio < 0.935) << f32;
    }
  }
  auto nan_rhs = [&](Data<double>& data) { data.d[k.n + 17] = std::nan(""); };
  EXPECT_NE(Compare<double>(k, Layout::kFlat, TridiagonalMethod::kAuto, 1e-12, 1e-15, nan_rhs),
            "partitioned-window");
  auto zero_row = [&](Data<double>& data) {
    data.a[100] = data.b[100] = data.c[100] = 0;
  };
  EXPECT_NE(Compare<double>(k, Layout::kFlat, TridiagonalMethod::kAuto, 1e-12, 1e-15, zero_row),
            "partitioned-window");
}

// thomas-window's tests: skip, saying so, without a GPU or where it cannot run.
#define REQUIRE_THOMAS_WINDOW()                                                         \
  REQUIRE_GPU();                                                                        \
  if (!cuda::ThomasWindowApplies(100, 64, Layout::kInterleaved, false))                 \
    GTEST_SKIP() << "thomas-window needs compute capability 9.0 (bulk tensor copies)"

// Every row a, b, c (the right-hand sides random).
template <typename T>
std::function<void(Data<T>&)> ConstantRows(double a, double b, double c) {
  return [=](Data<T>& data) {
    for (size_t e = 0; e < data.a.size(); ++e) {
      data.a[e] = T(a);
      data.b[e] = T(b);
      data.c[e] = T(c);
    }
  };
}

// thomas-window (Thomas, streamed, x stored by a look-ahead back substitution), forced, in both
// layouts (flat: boxes of systems' rows, swizzled; one system as a chain of windows, the
// lanes'): n from 1 to 2^20, batches of 1 to 2050 (a last group of 32 only partly in the batch;
// batches under 32 as warps of two windows of 16 systems or four of 8, the last task of a
// system partly idle), whole systems and systems cut into 3 and 7 windows with halos of 256
// and 64 rows, all numbers of copies in flight, both precisions, singular systems (Compare makes
// two) flagged per system. The random rows (|a| + |c| up to 0.8 |b|) take a few rows each for
// the left end's bound to fall by 2^-55 (about two bits a row), so the halos of 64 rows
// (forced) and 32 (the first by default) hold it. A batch not whole 16-byte words never takes it.
TEST(CudaTridiagonal, ThomasWindowMatchesTheCpuReference) {
  REQUIRE_THOMAS_WINDOW();
  const ScopedTuning scoped;
  int ran = 0;
  for (int windows : {1, 3, 7})
    for (int halo : {0, 64}) {
      if (windows == 1 && halo == 64) continue;
      scoped.Set([&](cuda::PartitionedTuning& t) {
        t.thomas_window = 1;
        t.thomas_windows = windows;
        t.thomas_halo = halo;
        t.thomas_stages = windows == 3 ? 1 : windows == 7 ? 2 : 0;  // float32's other forms
      });
      for (Layout layout : {Layout::kInterleaved, Layout::kFlat})
        for (Case k : {Case{1, 64}, Case{2, 34}, Case{7, 40}, Case{33, 100}, Case{100, 1000},
                       Case{1000, 2050}, Case{4097, 66}, Case{20000, 34}, Case{20000, 7},
                       Case{5000, 16}, Case{20000, 24}, Case{3001, 8}, Case{777, 12},
                       Case{9000, 10}, Case{4096, 40}, Case{2048, 33}, Case{20004, 20},
                       Case{65536, 1}, Case{1 << 20, 1}, Case{40000, 1}}) {
          const bool inter = layout == Layout::kInterleaved;
          SCOPED_TRACE(::testing::Message() << "windows " << windows << " halo " << halo << " n "
                                            << k.n << " batch " << k.batch
                                            << (inter ? " interleaved" : " flat"));
          // The copies' row stride in whole 16-byte words: the batch's row, or a system; one
          // system as a chain of windows of whole chunks, 32 of 512 rows at least (PlanChain).
          const int64_t stride = inter && !(k.batch == 1) ? k.batch : k.n;
          const bool one = k.batch == 1;  // (one system: the layouts are the same)
          if (one && (k.n % 16 != 0 || k.n < 32 * 512)) {
            EXPECT_NE(Compare<double>(k, layout, TridiagonalMethod::kAuto, 1e-12, 1e-15),
                      "thomas-window");
            continue;
          }
          const std::string f64 =
              Compare<double>(k, layout, TridiagonalMethod::kAuto, 1e-12, 1e-15);
          EXPECT_EQ(f64 == "thomas-window", stride % 2 == 0) << f64;
          const std::string f32 = Compare<float>(k, layout, TridiagonalMethod::kAuto, 2e-4, 3e-6);
          EXPECT_EQ(f32 == "thomas-window", stride % 4 == 0) << f32;
          ran += (f64 == "thomas-window") + (f32 == "thomas-window");
        }
    }
  EXPECT_GE(ran, 100);
}

// Mirrored windows (thomas_window.cu: where every core is whole, the odd windows sweep the
// system backward, a and c exchanged) against the reference, as forward ones are: 2-8 windows,
// an odd count of them, batches of 8-31 (two or four windows side by side in a warp), both
// layouts (the flat one forced: `auto` mirrors the interleaved one alone), one system as a
// chain of 128 or 66 windows of 512 rows, in one part (the maps take every other window),
// both precisions; and with the
// mirror off. A non-finite right-hand side in a backward window still flags that system alone
// (by the exact path: a backward sweep's pivots are not the reference's).
TEST(CudaTridiagonal, ThomasWindowMirroredMatchesTheCpuReference) {
  REQUIRE_THOMAS_WINDOW();
  const ScopedTuning scoped;
  struct Shape {
    int64_t n;
    int windows;
  };
  for (int mirror : {1, -1}) {
    for (const Shape& sh : {Shape{4096, 2}, Shape{4096, 4}, Shape{4096, 8}, Shape{3072, 3},
                            Shape{1600, 5}, Shape{1 << 16, 0}, Shape{33 * 1024, 0}})
      for (Layout layout : {Layout::kInterleaved, Layout::kFlat})
        for (int64_t batch : {1, 8, 12, 16, 20, 64, 100}) {
          if ((batch == 1) != (sh.windows == 0) || (batch == 1 && layout == Layout::kFlat))
            continue;  // (one system: the chain, either layout)
          SCOPED_TRACE(::testing::Message()
                       << "mirror " << mirror << " n " << sh.n << " windows " << sh.windows
                       << " batch " << batch
                       << (layout == Layout::kFlat ? " flat" : " interleaved"));
          scoped.Set([&](cuda::PartitionedTuning& t) {
            t.thomas_window = 1;
            t.thomas_windows = sh.windows;
            t.thomas_mirror = mirror;
          });
          const Case k{sh.n, batch};
          EXPECT_EQ(Compare<double>(k, layout, TridiagonalMethod::kAuto, 1e-12, 1e-15),
                    "thomas-window");
          EXPECT_EQ(Compare<float>(k, layout, TridiagonalMethod::kAuto, 2e-4, 3e-6),
                    "thomas-window");
        }
  }
  scoped.Set([&](cuda::PartitionedTuning& t) {
    t.thomas_window = 1;
    t.thomas_windows = 4;
  });
  const Case k{4096, 64};
  auto nan_rhs = [&](Data<double>& data) {
    data.d[ElementIndex(Layout::kInterleaved, k.batch, k.n, 9, 1500)] = std::nan("");
  };
  EXPECT_NE(Compare<double>(k, Layout::kInterleaved, TridiagonalMethod::kAuto, 1e-12, 1e-15,
                            nan_rhs),
            "thomas-window");
}

// One system as a chain of windows (PlanChain) of any length of whole chunks, forced: in one
// part (40,000 rows: 50 windows of 800) and in two (2^24 on the H100: windows of 992 rows, then
// of 1008; 2^24 + 16 and 10^7 rows, the second part's last task partly idle), both precisions,
// and an implicit diffusion step (r = 1: its windows need a halo of ~40 rows, more than the
// first 32), whose second part's first window reads the first part's last rows as its halo.
// A length not of whole chunks is not a chain.
TEST(CudaTridiagonal, ThomasWindowChainsOneSystemOfAnyLength) {
  REQUIRE_THOMAS_WINDOW();
  const ScopedTuning scoped;
  scoped.Set([&](cuda::PartitionedTuning& t) { t.thomas_window = 1; });
  auto diffusion = [](auto& data) {
    using T = std::decay_t<decltype(data.a[0])>;
    for (size_t e = 0; e < data.a.size(); ++e) {
      data.a[e] = data.c[e] = T(-1);
      data.b[e] = T(3);
    }
  };
  for (int64_t n : {int64_t(40000), int64_t(1) << 24, (int64_t(1) << 24) + 16,
                    int64_t(10000000)}) {
    SCOPED_TRACE(::testing::Message() << "n " << n);
    const Case k{n, 1};
    EXPECT_EQ(Compare<double>(k, Layout::kFlat, TridiagonalMethod::kAuto, 1e-12, 1e-15),
              "thomas-window");
    EXPECT_EQ(Compare<float>(k, Layout::kFlat, TridiagonalMethod::kAuto, 2e-4, 3e-6),
              "thomas-window");
    EXPECT_EQ(Compare<double>(k, Layout::kFlat, TridiagonalMethod::kAuto, 1e-12, 1e-15,
                              std::function<void(Data<double>&)>(diffusion)),
              "thomas-window");
  }
  EXPECT_NE(Compare<double>(Case{(int64_t(1) << 24) + 8, 1}, Layout::kFlat,
                            TridiagonalMethod::kAuto, 1e-12, 1e-15),
            "thomas-window");
}

// The look-ahead is measured, not assumed: an implicit diffusion step (b = 1 + 2r, a = c = -r,
// |c'| tends to 0.38 at r = 1, 0.73 at r = 10, 0.90 at r = 100) needs ~40 / ~120 / ~375 rows
// in float64 (~20 / ~57 / ~180 in float32) against the 96 the ring holds: the steps that need
// more go to the exact path. A row that is not dominant at all (ratio 1.5) in a whole system
// is still Thomas' (as the CPU reference solves it), and a non-finite right-hand side flags that
// system alone.
TEST(CudaTridiagonal, ThomasWindowLooksAheadAsFarAsTheRowsNeed) {
  REQUIRE_THOMAS_WINDOW();
  const ScopedTuning scoped;
  scoped.Set([&](cuda::PartitionedTuning& t) {
    t.thomas_window = 1;
    t.thomas_windows = 1;
  });
  const Case k{3000, 64};
  for (double r : {1.0, 10.0, 100.0}) {
    SCOPED_TRACE(::testing::Message() << "r " << r);
    auto diffusion = [&](auto& data) {
      using T = std::decay_t<decltype(data.a[0])>;
      for (size_t e = 0; e < data.a.size(); ++e) {
        data.a[e] = data.c[e] = T(-r);
        data.b[e] = T(1 + 2 * r);
      }
    };
    const std::string f64 =
        Compare<double>(k, Layout::kInterleaved, TridiagonalMethod::kAuto, 1e-11, 1e-15,
                        std::function<void(Data<double>&)>(diffusion));
    EXPECT_EQ(f64 == "thomas-window", r < 5) << f64;
    const std::string f32 =
        Compare<float>(k, Layout::kInterleaved, TridiagonalMethod::kAuto, 5e-4, 3e-6,
                       std::function<void(Data<float>&)>(diffusion));
    EXPECT_EQ(f32 == "thomas-window", r < 50) << f32;
  }
  auto weak = [&](Data<double>& data) {
    const int64_t e = ElementIndex(Layout::kInterleaved, k.batch, k.n, 5, 1234);
    data.b[e] = (std::abs(data.a[e]) + std::abs(data.c[e])) / 1.5;
  };
  EXPECT_EQ(Compare<double>(k, Layout::kInterleaved, TridiagonalMethod::kAuto, 1e-11, 1e-15,
                            weak),
            "thomas-window");
  auto nan_rhs = [&](Data<double>& data) {
    data.d[ElementIndex(Layout::kInterleaved, k.batch, k.n, 9, 2000)] = std::nan("");
  };
  EXPECT_EQ(Compare<double>(k, Layout::kInterleaved, TridiagonalMethod::kAuto, 1e-12, 1e-15,
                            nan_rhs),
            "thomas-window");
}

// The left end of a window past a system's first is bounded a posteriori (thomas_window.cu): the
// product of |a / den| over the halo and on through the core, summed. Rows with a = -0.7,
// c = -0.1, b = 1 keep c' at -0.108 (17 rows of look-ahead) but let the dropped coupling fade
// by only 0.757 a row (0.40 bits): the default halos (32, then 64 in float64) are too short, the
// problem runs again with 256 and is solved by thomas-window; with the halo forced to 64 it
// cannot be, and the exact path answers. With a = -0.9, c = -0.05 (0.945 a row) 256 rows are
// too few too. An implicit diffusion step with r = 1 (0.38 a row) needs ~40 rows: the default
// halos hold it (in float64 the second, 64).
// The windows are whole cores, so the odd ones sweep backward, seeing the rows transposed (their
// look-ahead fades with a, their left end with c): the first rows need a forward-only run after
// the mirrored ones fail, and the transposed rows (a = -0.1, c = -0.7: 134 rows of look-ahead)
// go to the exact path either way in float64 (in float32, 63 rows: the longer ring). With the
// mirror off, as before.
TEST(CudaTridiagonal, ThomasWindowBoundsTheLeftEndAsTheRowsNeed) {
  REQUIRE_THOMAS_WINDOW();
  const ScopedTuning scoped;
  const Case k{4096, 64};
  struct Rows {
    double a, b, c;
    bool by_default, at_64;  // thomas-window with the default halo, with 64 forced
    bool by_default32, at_64_32;  // in float32
  };
  for (const Rows& r :
       {Rows{-0.7, 1, -0.1, true, false, true, false}, Rows{-0.9, 1, -0.05, false, false, false,
        false}, Rows{-1, 3, -1, true, true, true, true}, Rows{-0.1, 1, -0.7, false, false, true,
        true}}) {
    for (int halo : {0, 64})
    for (int mirror : {0, -1}) {
      SCOPED_TRACE(::testing::Message() << "a " << r.a << " c " << r.c << " halo " << halo
                                        << " mirror " << mirror);
      scoped.Set([&](cuda::PartitionedTuning& t) {
        t.thomas_window = 1;
        t.thomas_windows = 4;
        t.thomas_halo = halo;
        t.thomas_mirror = mirror;
      });
      const bool expect = halo == 0 ? r.by_default : r.at_64;
      const std::string f64 =
          Compare<double>(k, Layout::kInterleaved, TridiagonalMethod::kAuto, 1e-11, 1e-15,
                          ConstantRows<double>(r.a, r.b, r.c));
      EXPECT_EQ(f64 == "thomas-window", expect) << f64;
      const std::string f32 =
          Compare<float>(k, Layout::kInterleaved, TridiagonalMethod::kAuto, 5e-4, 3e-6,
                         ConstantRows<float>(r.a, r.b, r.c));
      EXPECT_EQ(f32 == "thomas-window", halo == 0 ? r.by_default32 : r.at_64_32) << f32;
    }
  }
}

// A shape's solve starts where its last one succeeded (SolveThomasWindowed's StartMemory): rows
// whose dropped coupling fades by 0.757 a row (a = -0.7, c = -0.1, as above) need a long halo
// (the one the windows measure) and, since the backward windows see them transposed, a forward
// run with the long ring -- found by failed launches at the first solve, not at the steps after
// it. Every 64th solve of the shape starts with the short ring and mirrored again (one of the
// next 64 pays those launches again, not the halo's); rows that need less are solved from the
// remembered start too (one launch); a solve that ends
// on the exact path (a = -0.9) is forgotten, so the rows after it start from the defaults: an
// implicit diffusion step with r = 1 (~40 rows of halo) then takes two launches (the halo of
// 32, then 64), and one at the next step (64 remembered).
TEST(CudaTridiagonal, ThomasWindowRemembersWhereAShapeStarts) {
  REQUIRE_THOMAS_WINDOW();
  const ScopedTuning scoped;
  scoped.Set([&](cuda::PartitionedTuning& t) {
    t.thomas_window = 1;
    t.thomas_windows = 4;
    t.thomas_stages = 2;  // (a shape of its own: no other test's solves remembered)
  });
  const Case k{4096, 64};
  const auto rows = ConstantRows<double>;
  // Launches of one solve, and that it ran thomas-window and matched the reference.
  auto solve = [&](const std::function<void(Data<double>&)>& edit) {
    const int64_t before = cuda::ThomasWindowLaunches();
    const std::string ran =
        Compare<double>(k, Layout::kInterleaved, TridiagonalMethod::kAuto, 1e-11, 1e-15, edit);
    return std::make_pair(ran, cuda::ThomasWindowLaunches() - before);
  };
  const auto first = solve(rows(-0.7, 1, -0.1));
  EXPECT_EQ(first.first, "thomas-window");
  EXPECT_GE(first.second, 3);  // the short halo, the measured one mirrored, then forward
  int repeated = 0;
  for (int step = 0; step < 64; ++step) {
    const auto next = solve(rows(-0.7, 1, -0.1));
    EXPECT_EQ(next.first, "thomas-window");
    if (next.second != 1) {
      EXPECT_LE(next.second, first.second) << "step " << step;
      ++repeated;
    }
  }
  EXPECT_EQ(repeated, 1) << "one fresh start in 64 solves";
  const int64_t long_halo = cuda::ThomasWindowLastHalo();
  EXPECT_GT(long_halo, 128);  // (0.40 bits a row: ~140 rows)
  EXPECT_EQ(solve(rows(-1, 3, -1)), std::make_pair(std::string("thomas-window"), int64_t(1)));
  EXPECT_EQ(cuda::ThomasWindowLastHalo(), long_halo);
  // The halo these rows measured (~40 rows) at the next solve.
  EXPECT_EQ(solve(rows(-1, 3, -1)), std::make_pair(std::string("thomas-window"), int64_t(1)));
  EXPECT_LE(cuda::ThomasWindowLastHalo(), 64);
  EXPECT_GE(cuda::ThomasWindowLastHalo(), 40);
  EXPECT_NE(solve(rows(-0.9, 1, -0.05)).first, "thomas-window");
  EXPECT_EQ(solve(rows(-1, 3, -1)), std::make_pair(std::string("thomas-window"), int64_t(2)));
  EXPECT_EQ(solve(rows(-1, 3, -1)), std::make_pair(std::string("thomas-window"), int64_t(1)));
}

// A device solve given a LaterAnswer returns once thomas-window's kernel is queued; Finish,
// after the caller's wait, reads the windows' answer. Rows the first launch solves: no second
// solve. Rows whose left end needs the long halo (a = -0.7, c = -0.1, as above): solved again
// by thomas-window (`again`: x rewritten). Rows no window holds (a = -0.9, c = -0.05): solved
// again by the exact path. x after Finish matches the CPU reference each time. An answer
// destroyed unfinished waits for its kernel, and the solve after it is right; Finish of
// nothing pending is an error, not a crash.
TEST(CudaTridiagonal, ThomasWindowAnswersAtTheCallersWait) {
  REQUIRE_THOMAS_WINDOW();
  const ScopedTuning scoped;
  scoped.Set([&](cuda::PartitionedTuning& t) {
    t.thomas_window = 1;
    t.thomas_windows = 4;
    t.thomas_stages = 4;  // (a shape of its own: no start remembered from other tests)
  });
  const Case k{4096, 64};
  const int64_t count = k.n * k.batch;
  const size_t bytes = sizeof(double) * size_t(count);
  cuda::Pool pool(cuda::Pool::Kind::kDevice, 0, int64_t{1} << 30);
  double* dev[5] = {};
  for (double*& q : dev) ASSERT_EQ(cudaMalloc(&q, bytes), cudaSuccess);
  uint8_t* flags = nullptr;
  ASSERT_EQ(cudaMalloc(&flags, size_t(k.batch)), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  struct Answer {
    std::string kernel;
    bool pending = false, again = false;
    double error = 0;  // max |x - x_ref| / max |x_ref|
  };
  // Solves with `later`, waits for the stream, finishes; the error against the CPU reference.
  auto solve = [&](const std::function<void(Data<double>&)>& edit, bool finish = true) {
    Answer r;
    Data<double> data = Random<double>(count, 11);
    if (edit) edit(data);
    const std::vector<double>* host[4] = {&data.a, &data.b, &data.c, &data.d};
    for (int q = 0; q < 4; ++q)
      EXPECT_EQ(cudaMemcpy(dev[q], host[q]->data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemset(flags, 0, size_t(k.batch)), cudaSuccess);
    const TridiagonalProblem<double> p{k.batch, k.n, Layout::kInterleaved,
                                       dev[0], dev[1], dev[2], dev[3]};
    cuda::LaterAnswer later;
    auto launched = cuda::SolveTridiagonalDevice(p, TridiagonalMethod::kAuto, dev[4], flags, pool,
                                                 stream, &later);
    EXPECT_TRUE(launched.ok()) << launched.status();
    r.pending = later.pending();
    if (!finish) return r;  // (later destroyed unfinished)
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    auto ran = later.Finish(&r.again);
    EXPECT_TRUE(ran.ok()) << ran.status();
    if (!ran.ok()) return r;
    r.kernel = cuda::KernelName(*ran);
    std::vector<double> xg(static_cast<size_t>(count)), xc(static_cast<size_t>(count));
    std::vector<SystemStatus> sc(static_cast<size_t>(k.batch));
    EXPECT_EQ(cudaMemcpy(xg.data(), dev[4], bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    cpu::SolveTridiagonal(data.P(k.batch, k.n, Layout::kInterleaved), TridiagonalMethod::kThomas,
                          TridiagonalOutput<double>{xc.data(), sc.data()});
    double dmax = 0, xmax = 0;
    for (int64_t e = 0; e < count; ++e) {
      dmax = std::max(dmax, std::abs(xg[e] - xc[e]));
      xmax = std::max(xmax, std::abs(xc[e]));
    }
    r.error = dmax / xmax;
    return r;
  };
  const Answer easy = solve(nullptr);
  EXPECT_TRUE(easy.pending);
  EXPECT_EQ(easy.kernel, "thomas-window");
  EXPECT_FALSE(easy.again);
  EXPECT_LE(easy.error, 1e-12);
  const Answer halo = solve(ConstantRows<double>(-0.7, 1, -0.1));
  EXPECT_TRUE(halo.pending);
  EXPECT_EQ(halo.kernel, "thomas-window");
  EXPECT_TRUE(halo.again);
  EXPECT_LE(halo.error, 1e-11);
  const Answer none = solve(ConstantRows<double>(-0.9, 1, -0.05));
  EXPECT_TRUE(none.pending);
  EXPECT_NE(none.kernel, "thomas-window");
  EXPECT_TRUE(none.again);
  EXPECT_LE(none.error, 1e-11);
  EXPECT_TRUE(solve(nullptr, /*finish=*/false).pending);
  const Answer after = solve(nullptr);
  EXPECT_EQ(after.kernel, "thomas-window");
  EXPECT_LE(after.error, 1e-12);
  cuda::LaterAnswer nothing;
  EXPECT_EQ(nothing.Finish().status().code(), absl::StatusCode::kFailedPrecondition);
  for (double* q : dev) cudaFree(q);
  cudaFree(flags);
  cudaStreamDestroy(stream);
}

TEST(CudaPool, BuffersAreReusedAcrossRequests) {
  REQUIRE_GPU();
  auto data = Random<double>(64 * 1000, 3);
  std::vector<double> x(64 * 1000);
  std::vector<SystemStatus> st(64);
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(Cuda()
                    ->Solve(data.P(64, 1000, Layout::kFlat), TridiagonalMethod::kAuto,
                            TridiagonalOutput<double>{x.data(), st.data()}, SolveControl{})
                    .ok());
  const auto info = Cuda()->Info();
  ASSERT_EQ(info.pools.size(), 2u);
  for (const auto& p : info.pools) {
    EXPECT_GE(p.hits, 4) << p.name;
    EXPECT_EQ(p.in_use_bytes, 0) << p.name;
    EXPECT_GT(p.cached_bytes, 0) << p.name;
  }
}

// Issue 33: b = 0, a = c = 1, n even (condition 41) has a vanishing pivot for every method
// without pivoting. auto and pivoting on the GPU (certified: docs/kernels/tridiagonal.md) solve
// such systems (not diagonally dominant) again by partial pivoting, on the device or, below
// cuda::kPivotingDeviceBatch, the host ("... + pivoting (k systems)"). Batches mixing them with
// dominant systems, both layouts, float64 and float32.
template <typename T>
void ZeroDiagonalBatch(Layout layout, int64_t batch, int64_t n) {
  Data<T> s = Random<T>(batch * n, 7);
  std::vector<T> xs(batch * n);
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(-1, 1);
  for (auto& v : xs) v = T(u(rng));
  int64_t zero = 0;
  for (int64_t sys = 0; sys < batch; sys += 3, ++zero)  // every third system
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = ElementIndex(layout, batch, n, sys, k);
      s.a[i] = T(1);
      s.b[i] = T(0);
      s.c[i] = T(1);
    }
  for (int64_t sys = 0; sys < batch; ++sys)  // d = A xs
    for (int64_t k = 0; k < n; ++k) {
      auto at = [&](int64_t kk) { return ElementIndex(layout, batch, n, sys, kk); };
      double v = double(s.b[at(k)]) * xs[at(k)];
      if (k > 0) v += double(s.a[at(k)]) * xs[at(k - 1)];
      if (k + 1 < n) v += double(s.c[at(k)]) * xs[at(k + 1)];
      s.d[at(k)] = T(v);
    }
  for (auto m : {TridiagonalMethod::kAuto, TridiagonalMethod::kPivoting}) {
    std::vector<T> x(batch * n, T(std::nan("")));
    std::vector<SystemStatus> st(batch, SystemStatus::kDiverged);
    auto info = Cuda()->Solve(s.P(batch, n, layout), m, TridiagonalOutput<T>{x.data(), st.data()},
                              SolveControl{});
    ASSERT_TRUE(info.ok()) << info.status();
    for (int64_t sys = 0; sys < batch; ++sys)
      ASSERT_EQ(st[sys], SystemStatus::kOk) << info->method << " system " << sys;
    // Both certified: the zero-diagonal systems (not dominant) solved again, the others the
    // fast kernel's answer.
    // (flat systems long enough: by the device's split, " + pivoting-split (k systems)")
    const std::string count = "(" + std::to_string(zero) + (zero == 1 ? " system" : " systems");
    EXPECT_TRUE(info->method.find(" + pivoting " + count) != std::string::npos ||
                info->method.find(" + pivoting-split " + count) != std::string::npos)
        << info->method;
    const double tol = sizeof(T) == 8 ? 1e-12 : 1e-4;
    for (int64_t e = 0; e < batch * n; ++e)
      ASSERT_NEAR(double(x[e]), double(xs[e]), tol * 50) << info->method << " at " << e;
    EXPECT_LE(TridiagonalBackwardError(s.P(batch, n, layout), x.data(), st.data()),
              sizeof(T) == 8 ? 1e-15 : 1e-6);
  }
}

TEST(CudaTridiagonal, AutoNeverAnswersSingularForAZeroDiagonal) {
  REQUIRE_GPU();
  for (Layout l : {Layout::kFlat, Layout::kInterleaved})
    for (auto [batch, n] : {std::pair<int64_t, int64_t>{1, 1024}, {30, 64}, {300, 512},
                            {64, 8192}}) {
      ZeroDiagonalBatch<double>(l, batch, n);
      ZeroDiagonalBatch<float>(l, batch, n);
    }
}

}  // namespace
}  // namespace trisolve
