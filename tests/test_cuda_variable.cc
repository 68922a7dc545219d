// Variable-size tridiagonal batches on the CUDA backend against the CPU reference: systems of
// every size class of the variable kernel (1 .. 4096 rows), longer ones solved by the uniform
// path, both precisions, auto and partitioned, vanishing pivots flagged per system and auto's
// zero-diagonal system solved by pivoting; the unified-vector layout (uniform and variable,
// short and long systems) against the same systems as separate arrays. Skips, saying so,
// without a CUDA device.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "cuda_test_util.h"
#include "runtime/memory_pool.h"
#include "tridiagonal/flags.h"
#include "tridiagonal/variable.h"
#include "tuning_table.h"
#include "gtest/gtest.h"
#include "trisolve/backend.h"
#include "trisolve/system.h"
#include "trisolve/reference/tridiagonal.h"
#include "trisolve/tridiagonal.h"

namespace trisolve {
namespace {

using ::trisolve::testing::Cuda;

template <typename T>
struct Var {
  std::vector<int64_t> offsets{0};
  std::vector<T> a, b, c, d;
  int64_t longest = 0;
  TridiagonalProblem<T> P() const {
    TridiagonalProblem<T> p{int64_t(offsets.size()) - 1, longest, Layout::kFlat, a.data(),
                            b.data(), c.data(), d.data()};
    p.offsets = offsets.data();
    return p;
  }
};

// Diagonally dominant systems of the given sizes; `zero_diagonal`: that system b = 0,
// a = c = 1 (nonsingular for even n, Thomas' and the partitioned kernel's pivot vanishes);
// `zero_matrix`: that system all zero (singular).
template <typename T>
Var<T> Make(const std::vector<int64_t>& sizes, uint64_t seed, int64_t zero_diagonal = -1,
            int64_t zero_matrix = -1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  Var<T> v;
  for (size_t s = 0; s < sizes.size(); ++s) {
    for (int64_t k = 0; k < sizes[s]; ++k) {
      const double a = u(rng), c = u(rng);
      double b = (std::abs(a) + std::abs(c) + 0.5) * (u(rng) < 0 ? -1 : 1);
      double aa = a, cc = c;
      if (int64_t(s) == zero_diagonal) aa = 1, cc = 1, b = 0;
      if (int64_t(s) == zero_matrix) aa = 0, cc = 0, b = 0;
      v.a.push_back(T(aa));
      v.b.push_back(T(b));
      v.c.push_back(T(cc));
      v.d.push_back(T(u(rng)));
    }
    v.offsets.push_back(int64_t(v.a.size()));
    v.longest = std::max(v.longest, sizes[s]);
  }
  return v;
}

template <typename T>
void Compare(const Var<T>& v, TridiagonalMethod m, double tol, bool expect_device = true) {
  const TridiagonalProblem<T> p = v.P();
  const size_t N = v.a.size(), B = size_t(p.batch);
  std::vector<T> x(N, T(std::nan(""))), xr(N);
  std::vector<SystemStatus> st(B, SystemStatus::kDiverged), sr(B);
  auto info = Cuda()->Solve(p, m, TridiagonalOutput<T>{x.data(), st.data()}, SolveControl{});
  ASSERT_TRUE(info.ok()) << info.status();
  if (expect_device) {
    EXPECT_TRUE(info->method.rfind("partitioned-variable", 0) == 0 ||
                info->method.find("(block-diagonal)") != std::string::npos)
        << info->method;
  }
  cpu::SolveTridiagonal(p, m == TridiagonalMethod::kAuto ? TridiagonalMethod::kAuto
                                                         : TridiagonalMethod::kPartitioned,
                        TridiagonalOutput<T>{xr.data(), sr.data()});
  // Every system checked; the first few that differ are listed (size, first row, statuses).
  int shown = 0, bad = 0;
  for (size_t s = 0; s < B; ++s) {
    double diff = 0, norm = 0;
    for (int64_t i = v.offsets[s]; i < v.offsets[s + 1]; ++i) {
      diff = std::max(diff, std::isfinite(double(x[i])) ? std::abs(double(x[i]) - double(xr[i]))
                                                        : INFINITY);
      norm = std::max(norm, std::abs(double(xr[i])));
    }
    if (st[s] != sr[s] || !(diff <= tol * std::max(norm, 1.0))) {
      ++bad;
      if (shown++ < 12)
        ADD_FAILURE() << "system " << s << " of " << B << ": n " << p.rows(int64_t(s))
                      << " at row " << v.offsets[s] << ", status " << int(st[s]) << " (reference "
                      << int(sr[s]) << "), diff " << diff << ", x[0] " << x[v.offsets[s]]
                      << " reference " << xr[v.offsets[s]] << "; " << info->method;
    }
  }
  EXPECT_EQ(bad, 0) << "systems that differ, of " << B;
  EXPECT_LE(TridiagonalBackwardError(p, x.data(), st.data()), sizeof(T) == 8 ? 1e-15 : 3e-7);
}

std::vector<int64_t> EveryClass(uint64_t seed, int count) {
  std::vector<int64_t> sizes = {1, 2, 3, 15, 16, 17, 31, 32, 33, 255, 256, 257, 2047, 2048,
                                2049, 4095, 4096};
  std::mt19937_64 rng(seed);
  for (int i = 0; i < count; ++i) sizes.push_back(int64_t(1 + rng() % 4096));
  std::shuffle(sizes.begin(), sizes.end(), rng);
  return sizes;
}

TEST(CudaVariable, EverySizeClassMatchesTheReference) {
  REQUIRE_GPU();
  for (auto m : {TridiagonalMethod::kAuto, TridiagonalMethod::kPartitioned}) {
    Compare(Make<double>(EveryClass(1, 500), 2), m, 1e-12);
    Compare(Make<float>(EveryClass(3, 500), 4), m, 2e-4);
  }
}

// The kernel alone on device arrays of their own (as the benchmark calls it), against the
// reference: tells a kernel fault from a staging one. Every class by the block table's kernel
// (stream_from 9), by the default split, and by the streamed kernel from 512 rows (5); the
// arrays 16-byte aligned and, shifted by one value, 8-byte aligned only (the streamed kernel's
// copies then go value by value).
TEST(CudaVariable, KernelOnItsOwnArrays) {
  REQUIRE_GPU();
  const Var<double> v = Make<double>(EveryClass(1, 500), 2);
  const TridiagonalProblem<double> hp = v.P();
  const int64_t N = int64_t(v.a.size()), B = hp.batch;
  std::vector<double> xr(N);
  std::vector<SystemStatus> sr(B);
  cpu::SolveTridiagonal(hp, TridiagonalMethod::kPartitioned,
                        TridiagonalOutput<double>{xr.data(), sr.data()});
  double* dev[5];
  for (auto& q : dev) ASSERT_EQ(cudaMalloc(&q, sizeof(double) * (N + 1)), cudaSuccess);
  uint8_t* flags;
  ASSERT_EQ(cudaMalloc(&flags, B), cudaSuccess);
  cuda::Pool pool(cuda::Pool::Kind::kDevice, 0, int64_t{1} << 30);
  const std::vector<double>* src[4] = {&v.a, &v.b, &v.c, &v.d};
  for (int shift : {0, 1}) {
    for (int stream_from : {9, cuda::kVariableStreamFrom, 5}) {
      SCOPED_TRACE("stream_from " + std::to_string(stream_from) + ", arrays shifted by " +
                   std::to_string(shift));
      for (int q = 0; q < 4; ++q)
        ASSERT_EQ(cudaMemcpy(dev[q] + shift, src[q]->data(), sizeof(double) * N,
                             cudaMemcpyHostToDevice),
                  cudaSuccess);
      ASSERT_EQ(cudaMemset(flags, 0, B), cudaSuccess);
      ASSERT_EQ(cudaMemset(dev[4], 0xff, sizeof(double) * (N + 1)), cudaSuccess);
      const cuda::VariablePlan plan = cuda::PlanVariable(v.offsets.data(), B, stream_from);
      std::byte* meta;
      ASSERT_EQ(cudaMalloc(&meta, plan.meta.size()), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(meta, plan.meta.data(), plan.meta.size(), cudaMemcpyHostToDevice),
                cudaSuccess);
      TridiagonalProblem<double> dp{B,           hp.n,          Layout::kFlat, dev[0] + shift,
                                    dev[1] + shift, dev[2] + shift, dev[3] + shift};
      dp.offsets = v.offsets.data();
      auto k = cuda::SolveVariableDevice(dp, plan, meta, TridiagonalMethod::kPartitioned,
                                         dev[4] + shift, flags, pool, nullptr);
      ASSERT_TRUE(k.ok()) << k.status();
      std::vector<double> x(N);
      ASSERT_EQ(cudaMemcpy(x.data(), dev[4] + shift, sizeof(double) * N, cudaMemcpyDeviceToHost),
                cudaSuccess);
      std::vector<uint8_t> f(B);
      ASSERT_EQ(cudaMemcpy(f.data(), flags, B, cudaMemcpyDeviceToHost), cudaSuccess);
      double diff = 0;
      for (int64_t i = 0; i < N; ++i)
        diff = std::max(diff, std::isfinite(x[i]) ? std::abs(x[i] - xr[i]) : INFINITY);
      EXPECT_LE(diff, 1e-10) << *k;
      EXPECT_EQ(std::count(f.begin(), f.end(), 1), 0);
      cudaFree(meta);
    }
  }
  for (auto q : dev) cudaFree(q);
  cudaFree(flags);
}

// The same, laid out as the backend stages a request: one buffer holding the plan, a, b, c,
// d, x and the flags one after the other (arrays 8-byte aligned only where the total is odd).
TEST(CudaVariable, KernelOnOneBufferAsStaged) {
  REQUIRE_GPU();
  const Var<double> v = Make<double>(EveryClass(1, 500), 2);
  const TridiagonalProblem<double> hp = v.P();
  const int64_t N = int64_t(v.a.size()), B = hp.batch;
  const cuda::VariablePlan plan = cuda::PlanVariable(v.offsets.data(), B);
  const int64_t mv = int64_t((plan.meta.size() + 15) / 16 * 2);
  double* base;
  ASSERT_EQ(cudaMalloc(&base, sizeof(double) * (mv + 5 * N) + B), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(base, plan.meta.data(), plan.meta.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  const std::vector<double>* src[4] = {&v.a, &v.b, &v.c, &v.d};
  for (int q = 0; q < 4; ++q)
    ASSERT_EQ(cudaMemcpy(base + mv + q * N, src[q]->data(), sizeof(double) * N,
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  double* x = base + mv + 4 * N;
  auto* flags = reinterpret_cast<uint8_t*>(x + N);
  ASSERT_EQ(cudaMemset(flags, 0, B), cudaSuccess);
  cuda::Pool pool(cuda::Pool::Kind::kDevice, 0, int64_t{1} << 30);
  TridiagonalProblem<double> dp{B, hp.n, Layout::kFlat, base + mv, base + mv + N,
                                base + mv + 2 * N, base + mv + 3 * N};
  dp.offsets = v.offsets.data();
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  auto k = cuda::SolveVariableDevice(dp, plan, reinterpret_cast<const std::byte*>(base),
                                     TridiagonalMethod::kPartitioned, x, flags, pool, stream);
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<double> hx(N), xr(N);
  ASSERT_EQ(cudaMemcpy(hx.data(), x, sizeof(double) * N, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<SystemStatus> sr(B);
  cpu::SolveTridiagonal(hp, TridiagonalMethod::kPartitioned,
                        TridiagonalOutput<double>{xr.data(), sr.data()});
  double diff = 0;
  for (int64_t i = 0; i < N; ++i) diff = std::max(diff, std::abs(hx[i] - xr[i]));
  EXPECT_LE(diff, 1e-10) << *k << ", total " << N;
  cudaStreamDestroy(stream);
  cudaFree(base);
}

TEST(CudaVariable, ManyShortSystems) {
  REQUIRE_GPU();
  std::vector<int64_t> sizes;
  std::mt19937_64 rng(5);
  for (int i = 0; i < 100000; ++i) sizes.push_back(int64_t(1 + rng() % 40));
  Compare(Make<double>(sizes, 6), TridiagonalMethod::kAuto, 1e-12);
}

TEST(CudaVariable, LongSystemsTakeTheUniformPath) {
  REQUIRE_GPU();
  Compare(Make<double>({100, 4097, 9000, 3, 70000, 12}, 7), TridiagonalMethod::kAuto, 1e-12);
  Compare(Make<double>({4097, 20000}, 8), TridiagonalMethod::kPartitioned, 1e-12, false);
}

TEST(CudaVariable, VanishingPivotsAreFlaggedPerSystemAndAutoPivots) {
  REQUIRE_GPU();
  // partitioned flags the zero-diagonal system and the zero matrix alone; auto solves the
  // first by pivoting on the host and still flags the second.
  const std::vector<int64_t> sizes = {50, 64, 300, 8, 1000};
  Compare(Make<double>(sizes, 9, 1, 3), TridiagonalMethod::kPartitioned, 1e-12);
  Compare(Make<double>(sizes, 9, 1, 3), TridiagonalMethod::kAuto, 1e-12);
  Compare(Make<float>(sizes, 10, 2, 4), TridiagonalMethod::kAuto, 2e-4);
  // The same in the streamed classes (over 1024 rows).
  const std::vector<int64_t> large = {3000, 1500, 2500, 50, 4096};
  Compare(Make<double>(large, 12, 0, 2), TridiagonalMethod::kPartitioned, 1e-12);
  Compare(Make<double>(large, 12, 0, 2), TridiagonalMethod::kAuto, 1e-12);
  Compare(Make<float>(large, 13, 4, 1), TridiagonalMethod::kAuto, 2e-4);
}

// Large batches (kBlockDiagonalUnknowns or more) are first solved as one block-diagonal
// system: its answer where every row is certified and no pivot vanished, else every system by
// the per-system kernels. The systems' a[0] and c[n-1] are random here (Make), so an answer
// that read them would differ from the reference.
std::string MethodOf(const Var<double>& v, TridiagonalMethod m) {
  std::vector<double> x(v.a.size());
  std::vector<SystemStatus> st(v.offsets.size() - 1);
  auto info = Cuda()->Solve(v.P(), m, TridiagonalOutput<double>{x.data(), st.data()},
                            SolveControl{});
  return info.ok() ? info->method : info.status().ToString();
}

TEST(CudaVariable, LargeBatchesRunAsOneBlockDiagonalSystem) {
  REQUIRE_GPU();
  const Var<double> v = Make<double>(EveryClass(21, 2200), 22);
  ASSERT_GE(v.offsets.back(), cuda::kBlockDiagonalUnknowns);
  for (auto m : {TridiagonalMethod::kAuto, TridiagonalMethod::kPartitioned}) {
    Compare(v, m, 1e-12);
    EXPECT_NE(MethodOf(v, m).find("(block-diagonal)"), std::string::npos) << MethodOf(v, m);
  }
  const Var<float> f = Make<float>(EveryClass(23, 2200), 24);
  Compare(f, TridiagonalMethod::kAuto, 2e-4);
  // Many short systems, and a few long ones past the variable kernel's rows.
  std::vector<int64_t> shorts;
  std::mt19937_64 rng(25);
  for (int i = 0; i < 280000; ++i) shorts.push_back(int64_t(1 + rng() % 30));
  const Var<double> many = Make<double>(shorts, 26);
  ASSERT_GE(many.offsets.back(), cuda::kBlockDiagonalUnknowns);
  Compare(many, TridiagonalMethod::kAuto, 1e-12);
  EXPECT_NE(MethodOf(many, TridiagonalMethod::kAuto).find("(block-diagonal)"), std::string::npos);
  const Var<double> longs = Make<double>({1500000, 7, 2500000, 4096, 300000}, 27);
  Compare(longs, TridiagonalMethod::kAuto, 1e-12);
  EXPECT_NE(MethodOf(longs, TridiagonalMethod::kAuto).find("(block-diagonal)"),
            std::string::npos);
}

TEST(CudaVariable, BlockDiagonalFallsBackPerSystem) {
  REQUIRE_GPU();
  // A zero-diagonal system (nonsingular; not dominant, a pivot vanishes): auto's one system is
  // flagged, so every system is solved again per system and that one pivoted on the host.
  const Var<double> zd = Make<double>(EveryClass(31, 2200), 32, /*zero_diagonal=*/5);
  ASSERT_GE(zd.offsets.back(), cuda::kBlockDiagonalUnknowns);  // (else the checks below are moot)
  Compare(zd, TridiagonalMethod::kAuto, 1e-12);
  EXPECT_EQ(MethodOf(zd, TridiagonalMethod::kAuto).find("(block-diagonal)"), std::string::npos);
  // A zero matrix: SINGULAR for that system alone, under auto and partitioned.
  const Var<double> zm = Make<double>(EveryClass(33, 2200), 34, -1, /*zero_matrix=*/7);
  Compare(zm, TridiagonalMethod::kAuto, 1e-12);
  Compare(zm, TridiagonalMethod::kPartitioned, 1e-12);
  Compare(Make<float>(EveryClass(35, 2200), 36, 3, 9), TridiagonalMethod::kAuto, 2e-4);
  // A system not dominant by the certificate's margin (a = c = 0.5, b = 1.005: |a| + |c| >
  // 0.99 |b|) but well conditioned (about 400) and no pivot vanishing: auto's one system is
  // flagged all the same, and the per-system kernels answer (that system by pivoting).
  Var<double> nd = Make<double>(EveryClass(37, 2200), 38);
  ASSERT_GE(nd.offsets.back(), cuda::kBlockDiagonalUnknowns);
  for (int64_t i = nd.offsets[11]; i < nd.offsets[12]; ++i)
    nd.a[i] = nd.c[i] = 0.5, nd.b[i] = 1.005;
  Compare(nd, TridiagonalMethod::kAuto, 1e-12);
  EXPECT_EQ(MethodOf(nd, TridiagonalMethod::kAuto).find("(block-diagonal)"), std::string::npos);
}

// The kernel call as the backend makes it: queued, its answer after the wait. A dominant batch
// keeps the block-diagonal answer; one with a zero-diagonal system is solved again per system
// (*again), that system flagged alone.
TEST(CudaVariable, BlockDiagonalAnswersLater) {
  REQUIRE_GPU();
  for (int64_t zero_diagonal : {int64_t(-1), int64_t(9)}) {
    SCOPED_TRACE("zero diagonal " + std::to_string(zero_diagonal));
    const Var<double> v = Make<double>(EveryClass(51, 2200), 52, zero_diagonal);
    const TridiagonalProblem<double> hp = v.P();
    const int64_t N = int64_t(v.a.size()), B = hp.batch;
    std::vector<double> xr(N);
    std::vector<SystemStatus> sr(B);
    cpu::SolveTridiagonal(hp, TridiagonalMethod::kPartitioned,
                          TridiagonalOutput<double>{xr.data(), sr.data()});
    double* dev[5];
    for (auto& q : dev) ASSERT_EQ(cudaMalloc(&q, sizeof(double) * N), cudaSuccess);
    const std::vector<double>* src[4] = {&v.a, &v.b, &v.c, &v.d};
    for (int q = 0; q < 4; ++q)
      ASSERT_EQ(cudaMemcpy(dev[q], src[q]->data(), sizeof(double) * N, cudaMemcpyHostToDevice),
                cudaSuccess);
    uint8_t* flags;
    ASSERT_EQ(cudaMalloc(&flags, B), cudaSuccess);
    ASSERT_EQ(cudaMemset(flags, 0, B), cudaSuccess);
    const cuda::VariablePlan plan = cuda::PlanVariable(v.offsets.data(), B);
    std::byte* meta;
    ASSERT_EQ(cudaMalloc(&meta, plan.meta.size()), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(meta, plan.meta.data(), plan.meta.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    cuda::Pool pool(cuda::Pool::Kind::kDevice, 0, int64_t{1} << 30);
    TridiagonalProblem<double> dp{B, hp.n, Layout::kFlat, dev[0], dev[1], dev[2], dev[3]};
    dp.offsets = v.offsets.data();
    cuda::LaterAnswer later;
    auto queued = cuda::SolveVariableDevice(dp, plan, meta, TridiagonalMethod::kAuto, dev[4],
                                            flags, pool, nullptr, true, &later);
    ASSERT_TRUE(queued.ok()) << queued.status();
    EXPECT_NE(queued->find("(block-diagonal)"), std::string::npos) << *queued;
    ASSERT_TRUE(later.pending());
    EXPECT_EQ(later.Finish().status().code(), absl::StatusCode::kFailedPrecondition);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    bool again = false;
    auto answered = later.FinishNamed(&again);
    ASSERT_TRUE(answered.ok()) << answered.status();
    EXPECT_FALSE(later.pending());
    std::vector<double> x(N);
    std::vector<uint8_t> f(B);
    ASSERT_EQ(cudaMemcpy(x.data(), dev[4], sizeof(double) * N, cudaMemcpyDeviceToHost),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(f.data(), flags, B, cudaMemcpyDeviceToHost), cudaSuccess);
    if (zero_diagonal < 0) {
      EXPECT_NE(answered->find("(block-diagonal)"), std::string::npos) << *answered;
      EXPECT_EQ(std::count(f.begin(), f.end(), 0), B);
    } else {
      EXPECT_EQ(answered->rfind("partitioned-variable", 0), 0u) << *answered;
      EXPECT_TRUE(again);
      for (int64_t s = 0; s < B; ++s)
        EXPECT_EQ((f[s] & cuda::kFlagVanished) != 0, s == zero_diagonal) << "system " << s;
    }
    double diff = 0;
    for (int64_t s = 0; s < B; ++s) {
      if (s == zero_diagonal) continue;
      for (int64_t i = v.offsets[s]; i < v.offsets[s + 1]; ++i)
        diff = std::max(diff, std::isfinite(x[i]) ? std::abs(x[i] - xr[i]) : INFINITY);
    }
    EXPECT_LE(diff, 1e-10) << *answered;
    for (auto q : dev) cudaFree(q);
    cudaFree(flags);
    cudaFree(meta);
  }
}

TEST(CudaVariable, BlockDiagonalFormByTheTuning) {
  REQUIRE_GPU();
  const Var<double> small = Make<double>(EveryClass(41, 40), 42);
  const Var<double> large = Make<double>(EveryClass(43, 2200), 44);
  ASSERT_GE(large.offsets.back(), cuda::kBlockDiagonalUnknowns);
  {
    cuda::TuningTable t = cuda::ActiveTuning();
    t.tridiagonal.block_diagonal = 1;  // wherever it applies: a small batch too
    const cuda::UseTuning use(&t);
    Compare(small, TridiagonalMethod::kAuto, 1e-12);
    EXPECT_NE(MethodOf(small, TridiagonalMethod::kAuto).find("(block-diagonal)"),
              std::string::npos);
  }
  {
    cuda::TuningTable t = cuda::ActiveTuning();
    t.tridiagonal.block_diagonal = -1;  // never
    const cuda::UseTuning use(&t);
    Compare(large, TridiagonalMethod::kAuto, 1e-12);
    EXPECT_EQ(MethodOf(large, TridiagonalMethod::kAuto).rfind("partitioned-variable", 0), 0u);
  }
  EXPECT_EQ(MethodOf(small, TridiagonalMethod::kAuto).rfind("partitioned-variable", 0), 0u);
}

TEST(CudaVariable, OtherMethodsRunOnTheHostAndSaySo) {
  REQUIRE_GPU();
  const Var<double> v = Make<double>({5, 9, 700}, 11);
  std::vector<double> x(v.a.size());
  std::vector<SystemStatus> st(3);
  auto info = Cuda()->Solve(v.P(), TridiagonalMethod::kThomas,
                            TridiagonalOutput<double>{x.data(), st.data()}, SolveControl{});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->method, "thomas (host)");
}

// The unified layout on the device against the CPU reference on separate arrays: the same
// answer within rounding (the kernels are the variable kernel's), statuses equal.
template <typename T>
void CompareUnified(const Var<T>& v, bool variable, TridiagonalMethod m, double tol) {
  std::vector<T> abc(3 * v.a.size());
  for (size_t i = 0; i < v.a.size(); ++i) {
    abc[3 * i] = v.a[i];
    abc[3 * i + 1] = v.b[i];
    abc[3 * i + 2] = v.c[i];
  }
  TridiagonalProblem<T> flat = v.P();
  if (!variable) flat.offsets = nullptr;
  TridiagonalProblem<T> uni = flat;
  uni.a = abc.data();
  uni.b = abc.data() + 1;
  uni.c = abc.data() + 2;
  uni.coef_stride = 3;
  const size_t N = v.a.size(), B = size_t(flat.batch);
  std::vector<T> x(N, T(std::nan(""))), xr(N);
  std::vector<SystemStatus> st(B, SystemStatus::kDiverged), sr(B);
  auto info = Cuda()->Solve(uni, m, TridiagonalOutput<T>{x.data(), st.data()}, SolveControl{});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->method.find("(host)"), std::string::npos) << info->method;
  cpu::SolveTridiagonal(flat, m, TridiagonalOutput<T>{xr.data(), sr.data()});
  EXPECT_EQ(st, sr);
  double diff = 0, norm = 0;
  for (size_t i = 0; i < N; ++i) {
    diff = std::max(diff, std::abs(double(x[i]) - double(xr[i])));
    norm = std::max(norm, std::abs(double(xr[i])));
  }
  EXPECT_LE(diff, tol * std::max(norm, 1.0)) << info->method;
}

TEST(CudaUnified, UniformAndVariableBatchesMatchTheSeparateArrays) {
  REQUIRE_GPU();
  for (int64_t n : {1, 2, 31, 256, 1000, 4096}) {
    const int64_t batch = std::max<int64_t>(1, (int64_t{1} << 18) / n);
    const Var<double> v = Make<double>(std::vector<int64_t>(size_t(batch), n), 12);
    CompareUnified(v, false, TridiagonalMethod::kAuto, 1e-12);
    const Var<float> f = Make<float>(std::vector<int64_t>(size_t(batch), n), 13);
    CompareUnified(f, false, TridiagonalMethod::kPartitioned, 2e-4);
  }
  CompareUnified(Make<double>(EveryClass(14, 300), 15), true, TridiagonalMethod::kAuto, 1e-12);
  // Systems past the variable kernel's rows: split into a, b, c on the device first.
  CompareUnified(Make<double>({9000, 5, 70000}, 16), true, TridiagonalMethod::kAuto, 1e-12);
  CompareUnified(Make<double>({20000, 20000}, 17), false, TridiagonalMethod::kAuto, 1e-12);
  // A zero diagonal in the unified layout: auto pivots it on the host, from abc.
  CompareUnified(Make<double>({64, 64, 64}, 18, 1), false, TridiagonalMethod::kAuto, 1e-12);
}


// ---- prepared (by handle) ---------------------------------------------------------------------

// v as a prepared system's spec (host arrays; lengths kept by the caller).
template <typename T>
SystemSpec PreparedSpec(const Var<T>& v, const std::vector<int32_t>& lengths,
                        TridiagonalMethod m) {
  SystemSpec s;
  s.family = Family::kTridiagonal;
  s.precision = sizeof(T) == 8 ? Precision::kFloat64 : Precision::kFloat32;
  s.batch = int64_t(lengths.size());
  s.n = int64_t(v.a.size());
  s.method = uint8_t(m);
  s.coefficients = {v.a.data(), v.b.data(), v.c.data()};
  s.lengths = lengths.data();
  return s;
}

template <typename T>
std::vector<int32_t> LengthsOf(const Var<T>& v) {
  std::vector<int32_t> l;
  for (size_t s = 0; s + 1 < v.offsets.size(); ++s) l.push_back(int32_t(v.offsets[s + 1] - v.offsets[s]));
  return l;
}

// The one-shot call's x and statuses for v with right-hand side d.
template <typename T>
std::pair<std::vector<T>, std::vector<SystemStatus>> OneShot(Var<T> v, const std::vector<T>& d,
                                                             TridiagonalMethod m) {
  v.d = d;
  std::vector<T> x(v.a.size());
  std::vector<SystemStatus> st(v.offsets.size() - 1);
  auto info = Cuda()->Solve(v.P(), m, TridiagonalOutput<T>{x.data(), st.data()}, SolveControl{});
  EXPECT_TRUE(info.ok()) << info.status();
  return {x, st};
}

// A prepared variable batch (coefficients on the device, the right-hand sides alone moved)
// answers as the one-shot call on the same arrays, bit for bit, for one and for k right-hand
// sides, and again after an update of b (the device copy replaced); its statuses are the
// reference's. Small batches (the per-system kernels) and large ones (the block-diagonal form,
// whose couplings are cut in the prepared device copy).
template <typename T>
void ComparePrepared(Var<T> v, TridiagonalMethod m, double tol, int64_t zero_matrix) {
  SCOPED_TRACE(std::string(MethodName(m)) + (sizeof(T) == 8 ? " float64 " : " float32 ") +
               std::to_string(v.a.size()) + " rows");
  const std::vector<int32_t> lengths = LengthsOf(v);
  auto system = Cuda()->Prepare(PreparedSpec(v, lengths, m));
  ASSERT_TRUE(system.ok()) << system.status();
  EXPECT_NE((*system)->prepared().find("CUDA device"), std::string::npos);
  const size_t N = v.a.size(), B = lengths.size();
  std::vector<T> d2(v.d);
  for (T& x : d2) x = T(2) * x - T(1);
  std::vector<T> both(v.d);
  both.insert(both.end(), d2.begin(), d2.end());
  for (int round = 0; round < 2; ++round) {
    // Twice over: a solve must leave the device copy as good as new.
    for (int again = 0; again < 2; ++again) {
      std::vector<T> x(2 * N, T(std::nan("")));
      std::vector<SystemStatus> st(2 * B, SystemStatus::kDiverged);
      auto one = Cuda()->SolvePrepared(**system, RhsBlock<T>{v.d.data()}, x.data(), st.data(),
                                       SolveControl{});
      ASSERT_TRUE(one.ok()) << one.status();
      const auto [want, want_st] = OneShot(v, v.d, m);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), x.begin(),
                             [](T p, T q) { return std::memcmp(&p, &q, sizeof(T)) == 0; }))
          << "round " << round << ", " << one->method;
      EXPECT_TRUE(std::equal(want_st.begin(), want_st.end(), st.begin()));
      auto k2 = Cuda()->SolvePrepared(**system, RhsBlock<T>{both.data(), 2}, x.data(), st.data(),
                                      SolveControl{});
      ASSERT_TRUE(k2.ok()) << k2.status();
      const auto [want2, want2_st] = OneShot(v, d2, m);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), x.begin(),
                             [](T p, T q) { return std::memcmp(&p, &q, sizeof(T)) == 0; }));
      EXPECT_TRUE(std::equal(want2.begin(), want2.end(), x.begin() + long(N),
                             [](T p, T q) { return std::memcmp(&p, &q, sizeof(T)) == 0; }));
      EXPECT_TRUE(std::equal(want2_st.begin(), want2_st.end(), st.begin() + long(B)));
    }
    Compare(v, m, tol, /*expect_device=*/true);  // the one-shot answer is the reference's
    {
      std::vector<T> x(N);
      std::vector<SystemStatus> st(B);
      ASSERT_TRUE(Cuda()->SolvePrepared(**system, RhsBlock<T>{v.d.data()}, x.data(), st.data(),
                                        SolveControl{}).ok());
      for (size_t s = 0; s < B; ++s)
        EXPECT_EQ(st[s] == SystemStatus::kSingular, int64_t(s) == zero_matrix && round == 0)
            << "system " << s << " round " << round;
    }
    // Cure the zero matrix through an update of b: every system OK after it.
    if (zero_matrix >= 0)
      for (int64_t i = v.offsets[size_t(zero_matrix)]; i < v.offsets[size_t(zero_matrix) + 1]; ++i)
        v.b[size_t(i)] = T(3);
    ASSERT_TRUE((*system)->Update(1, v.b.data()).ok());
    zero_matrix = round == 0 ? zero_matrix : -1;
  }
}

TEST(CudaVariablePrepared, AnswersAsTheOneShotCallBitForBit) {
  REQUIRE_GPU();
  for (auto m : {TridiagonalMethod::kAuto, TridiagonalMethod::kPartitioned}) {
    ComparePrepared(Make<double>(EveryClass(41, 300), 42, -1, 7), m, 1e-12, 7);
    ComparePrepared(Make<float>(EveryClass(43, 300), 44, -1, 5), m, 2e-4, 5);
  }
  // auto pivots the zero-diagonal system on the host from the prepared host copy.
  ComparePrepared(Make<double>({50, 64, 300, 8, 1000, 3000}, 45, 1, 3), TridiagonalMethod::kAuto,
                  1e-12, 3);
  // Large: the block-diagonal form over the prepared device copy.
  const Var<double> large = Make<double>(EveryClass(47, 2200), 48, -1, 9);
  ASSERT_GE(large.offsets.back(), cuda::kBlockDiagonalUnknowns);
  ComparePrepared(large, TridiagonalMethod::kAuto, 1e-12, 9);
  ComparePrepared(Make<double>(EveryClass(49, 2200), 50), TridiagonalMethod::kAuto, 1e-12, -1);
}


// Not a check: the time of a prepared solve (the right-hand side in, x out) against the one-shot
// call (every array in) on the same large variable batch, best of 10 each. Run by hand with
// --gtest_also_run_disabled_tests.
TEST(CudaVariablePrepared, DISABLED_TimeAgainstTheOneShotCall) {
  REQUIRE_GPU();
  std::vector<int64_t> sizes;
  std::mt19937_64 rng(61);
  int64_t total = 0;
  while (total < (int64_t{1} << 24)) {
    sizes.push_back(int64_t(64 + rng() % 448));
    total += sizes.back();
  }
  const Var<double> v = Make<double>(sizes, 62);
  const std::vector<int32_t> lengths = LengthsOf(v);
  auto system = Cuda()->Prepare(PreparedSpec(v, lengths, TridiagonalMethod::kAuto));
  ASSERT_TRUE(system.ok()) << system.status();
  std::vector<double> x(v.a.size());
  std::vector<SystemStatus> st(lengths.size());
  auto best = [](auto&& f) {
    double b = 1e30;
    for (int i = 0; i < 10; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      b = std::min(b, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return b;
  };
  std::string method;
  const double prepared = best([&] {
    auto r = Cuda()->SolvePrepared(**system, RhsBlock<double>{v.d.data()}, x.data(), st.data(),
                                   SolveControl{});
    ASSERT_TRUE(r.ok()) << r.status();
    method = r->method;
  });
  const double one_shot = best([&] {
    auto r = Cuda()->Solve(v.P(), TridiagonalMethod::kAuto,
                           TridiagonalOutput<double>{x.data(), st.data()}, SolveControl{});
    ASSERT_TRUE(r.ok()) << r.status();
  });
  std::printf("[ TIME     ] %zu systems, %lld unknowns, float64, auto (%s): prepared %.3f ms, "
              "one-shot %.3f ms\n",
              lengths.size(), (long long)total, method.c_str(), prepared, one_shot);
}

}  // namespace
}  // namespace trisolve
