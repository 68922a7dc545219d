// The CUDA backend's `auto` against the stability suite (tests/stability_matrices.h): the fast
// kernels flag a system whose elimination grew (docs/kernels/tridiagonal.md, "Growth") as the
// CPU's Thomas does, and `auto` solves it again by the device's pivoting kernel. For every
// shape class `auto` dispatches to a different kernel (one block, streamed, cluster, streamed
// rows, thomas-window, two-pass, windows), both layouts and precisions:
//  - every system the CPU's auto solves again is flagged by the GPU's fast kernel too;
//  - the answer: OK wherever LAPACK's gtsv solves the system, its backward error within 10x of
//    max(gtsv's, eps), the method saying how many systems pivoting solved again;
//  - the explicit methods (partitioned, thomas) keep their answer: growth never makes a
//    system SINGULAR there, nor solves it again;
//  - diagonally dominant batches: nothing flagged.
// Skips, saying so, where no CUDA device is present; run on the lent GPU.
#include <cuda_runtime.h>
#include <lapacke.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_test_util.h"
#include "gtest/gtest.h"
#include "runtime/memory_pool.h"
#include "stability_matrices.h"
#include "tridiagonal/tridiagonal.h"
#include "trisolve/backend.h"
#include "trisolve/reference/tridiagonal.h"
#include "trisolve/tridiagonal.h"

namespace trisolve {
namespace {

using ::trisolve::testing::Cuda;
using namespace ::trisolve::stability;

template <typename T>
constexpr double Eps() {
  return std::is_same_v<T, float> ? double(FLT_EPSILON) : DBL_EPSILON;
}

// A batch in `layout`: system s is tri[s] with a right-hand side U(-1, 1), rounded to T.
template <typename T>
struct Batch {
  int64_t batch, n;
  Layout layout;
  std::vector<T> a, b, c, d;
  Batch(const std::vector<Tri>& tri, int64_t n_, Layout l, uint64_t seed)
      : batch(int64_t(tri.size())), n(n_), layout(l), a(size_t(batch * n)), b(a.size()),
        c(a.size()), d(a.size()) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(-1, 1);
    for (int64_t s = 0; s < batch; ++s)
      for (int64_t k = 0; k < n; ++k) {
        const size_t e = At(s, k);
        a[e] = T(tri[size_t(s)].a[size_t(k)]);
        b[e] = T(tri[size_t(s)].b[size_t(k)]);
        c[e] = T(tri[size_t(s)].c[size_t(k)]);
        d[e] = T(u(rng));
      }
  }
  size_t At(int64_t s, int64_t k) const { return size_t(ElementIndex(layout, batch, n, s, k)); }
  TridiagonalProblem<T> P() const {
    return {batch, n, layout, a.data(), b.data(), c.data(), d.data()};
  }
  // System s as stored, in double (a[0], c[n-1] zero), and its right-hand side.
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
};

// LAPACK's gtsv on system s as stored: x in double, whether it solved (a finite x).
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
  return info == 0 && std::all_of(x.begin(), x.end(), [](T v) { return std::isfinite(v); });
}

// The fast kernel `auto` runs on the batch, on the device, without its second solve: the
// kernel's name and the systems it flagged (a vanished pivot, or growth).
struct Flagged {
  std::string kernel;
  std::vector<uint8_t> flags;
};
template <typename T>
Flagged DeviceFlags(const Batch<T>& bt, TridiagonalMethod m) {
  Flagged r;
  const size_t bytes = sizeof(T) * bt.a.size();
  T* dev[5] = {};
  for (T*& q : dev) EXPECT_EQ(cudaMalloc(&q, bytes), cudaSuccess);
  uint8_t* flags = nullptr;
  EXPECT_EQ(cudaMalloc(&flags, size_t(bt.batch)), cudaSuccess);
  const std::vector<T>* host[4] = {&bt.a, &bt.b, &bt.c, &bt.d};
  for (int q = 0; q < 4; ++q)
    EXPECT_EQ(cudaMemcpy(dev[q], host[q]->data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemset(flags, 0, size_t(bt.batch)), cudaSuccess);
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  {
    cuda::Pool pool(cuda::Pool::Kind::kDevice, 0, int64_t{1} << 30);
    const TridiagonalProblem<T> p{bt.batch, bt.n, bt.layout, dev[0], dev[1], dev[2], dev[3]};
    auto k = cuda::SolveTridiagonalDevice(p, m, dev[4], flags, pool, stream);
    EXPECT_TRUE(k.ok()) << k.status();
    if (k.ok()) r.kernel = cuda::KernelName(*k);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  r.flags.resize(size_t(bt.batch));
  EXPECT_EQ(cudaMemcpy(r.flags.data(), flags, size_t(bt.batch), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (T* q : dev) cudaFree(q);
  cudaFree(flags);
  cudaStreamDestroy(stream);
  return r;
}

struct Solved {
  std::vector<SystemStatus> status;
  std::string method;
};
template <typename T>
Solved SolveGpu(const Batch<T>& bt, TridiagonalMethod m, std::vector<T>* x) {
  x->assign(bt.a.size(), T(std::nan("")));
  Solved r;
  r.status.assign(size_t(bt.batch), SystemStatus::kDiverged);
  auto info = Cuda()->Solve(bt.P(), m, TridiagonalOutput<T>{x->data(), r.status.data()},
                            SolveControl{});
  EXPECT_TRUE(info.ok()) << info.status();
  if (info.ok()) r.method = info->method;
  return r;
}

// The count in "... + pivoting (k systems)", or 0.
int64_t Resolved(const std::string& method) {
  const std::string key = " + pivoting (";
  const size_t at = method.find(key);
  return at == std::string::npos ? 0 : std::stoll(method.substr(at + key.size()));
}

// Whether the CPU's auto solves system s again (Thomas' pivot vanished or it grew).
template <typename T>
bool CpuResolves(const Batch<T>& bt, int64_t s) {
  std::vector<double> rhs;
  const Tri t = bt.Get(s, &rhs);
  std::vector<T> a(t.a.begin(), t.a.end()), b(t.b.begin(), t.b.end()), c(t.c.begin(), t.c.end()),
      d(rhs.begin(), rhs.end()), x(size_t(bt.n));
  SystemStatus st;
  const SolveInfo info = cpu::SolveTridiagonal(
      TridiagonalProblem<T>{1, bt.n, Layout::kFlat, a.data(), b.data(), c.data(), d.data()},
      TridiagonalMethod::kAuto, TridiagonalOutput<T>{x.data(), &st});
  return Resolved(info.method) > 0;
}

// One batch of the suite's matrices `first` .. `first + count - 1` (mod 20) at n, through auto
// and the explicit methods. Adds the fast kernel that ran to *kernels.
template <typename T>
void SuiteThroughAuto(int n, int first, int count, Layout layout, std::set<std::string>* kernels) {
  constexpr bool f32 = std::is_same_v<T, float>;
  SCOPED_TRACE(::testing::Message() << (f32 ? "float32" : "float64") << " n " << n << " batch "
                                    << count << (layout == Layout::kFlat ? " flat" : " interleaved"));
  const std::vector<Tri> suite = Suite(n, 2021 + uint64_t(n));
  ASSERT_EQ(suite.size(), 20u);
  std::vector<Tri> tri;
  for (int i = 0; i < count; ++i) tri.push_back(suite[size_t((first + i) % 20)]);
  const Batch<T> bt(tri, n, layout, uint64_t(7 + n + first));
  const auto index = [&](int64_t s) { return int((first + s) % 20) + 1; };  // the table's #

  const Flagged fast = DeviceFlags(bt, TridiagonalMethod::kAuto);
  kernels->insert(fast.kernel);
  std::vector<T> x;
  const Solved g = SolveGpu(bt, TridiagonalMethod::kAuto, &x);
  int64_t cpu_resolved = 0, flagged = 0;
  double worst = 0;
  std::string list;
  for (int64_t s = 0; s < bt.batch; ++s) {
    const bool cpu = CpuResolves(bt, s);
    const bool gpu = fast.flags[size_t(s)] != 0;
    cpu_resolved += cpu;
    flagged += gpu;
    if (gpu) list += " " + std::to_string(index(s));
    EXPECT_TRUE(!cpu || gpu) << "matrix " << index(s) << ": the CPU's auto solves it again, "
                             << fast.kernel << " did not flag it";
    std::vector<double> rhs, xl;
    const Tri t = bt.Get(s, &rhs);
    const bool lok = Gtsv(bt, s, &xl);
    const bool gok = g.status[size_t(s)] == SystemStatus::kOk;
    const double gb = BackwardError(t, rhs, bt.X(x, s), gok);
    const double lb = BackwardError(t, rhs, xl, lok);
    if (!lok) {  // singular to working precision (float32's randsvd): SINGULAR or stable
      EXPECT_TRUE(!gok || gb <= 10 * Eps<T>()) << "matrix " << index(s) << ": " << gb;
      continue;
    }
    EXPECT_TRUE(gok) << "matrix " << index(s) << " not OK, solved by LAPACK";
    EXPECT_TRUE(gb <= 10 * std::max(lb, Eps<T>()))
        << "matrix " << index(s) << ": backward error " << gb << " against LAPACK's " << lb
        << " (" << g.method << ")";
    worst = std::max(worst, gb / std::max(lb, Eps<T>()));
  }
  // The backend's auto solves again what its kernel flagged (its own run: a thomas-window
  // solve may start from another halo, so the count is compared with the CPU's, not equal).
  EXPECT_GE(Resolved(g.method), cpu_resolved) << g.method;
  EXPECT_EQ(Resolved(g.method) > 0, flagged > 0) << g.method;
  std::printf("%s n %d batch %d %s: %s, flagged%s; CPU auto resolves %lld; worst backward "
              "error / max(gtsv's, eps) %.2f\n",
              f32 ? "float32" : "float64", n, count,
              layout == Layout::kFlat ? "flat" : "interleaved", fast.kernel.c_str(),
              list.empty() ? " none" : list.c_str(), (long long)cpu_resolved, worst);

  // The explicit methods keep their answer: never solved again; growth alone (tridiag(1, 1e-8,
  // 1), diagonal 1e-8: no pivot vanishes) is no SINGULAR, and their flags are vanished pivots.
  for (TridiagonalMethod m : {TridiagonalMethod::kPartitioned, TridiagonalMethod::kThomas}) {
    std::vector<T> xe;
    const Solved e = SolveGpu(bt, m, &xe);
    EXPECT_EQ(e.method.find("pivoting"), std::string::npos) << e.method;
    for (int64_t s = 0; s < bt.batch; ++s)
      if (!f32 && (index(s) == 14 || index(s) == 16)) {
        EXPECT_EQ(e.status[size_t(s)], SystemStatus::kOk)
            << "matrix " << index(s) << " by " << MethodName(m);
      }
    if (m == TridiagonalMethod::kPartitioned) {
      const Flagged pf = DeviceFlags(bt, m);
      for (int64_t s = 0; s < bt.batch; ++s)
        EXPECT_EQ(pf.flags[size_t(s)] != 0, e.status[size_t(s)] != SystemStatus::kOk)
            << "matrix " << index(s);
    }
  }
}

// The shapes: each runs a different fast kernel under auto (dispatch.cc; the H100's table),
// the windows' (non-dominant rows fail them) then the path below them.
template <typename T>
void AllShapes(std::set<std::string>* kernels) {
  constexpr bool f64 = std::is_same_v<T, double>;
  for (Layout l : {Layout::kFlat, Layout::kInterleaved}) {
    SuiteThroughAuto<T>(512, 0, 40, l, kernels);  // one block (flat), streamed / thomas-window
    SuiteThroughAuto<T>(1 << 14, 0, 40, l, kernels);  // thomas-window, two-pass
  }
  SuiteThroughAuto<T>(1024, 0, 40, Layout::kFlat, kernels);  // streamed (float64)
  SuiteThroughAuto<T>(256, 0, 40, Layout::kInterleaved, kernels);  // one block, interleaved
  // Batches under 16 (no thomas-window): the cluster kernel (interleaved 512 < n <= 2048;
  // float32 flat 4096 < n <= 8192) and the streamed rows (float64 flat 8192).
  for (int first : {0, 10}) {
    SuiteThroughAuto<T>(2048, first, 10, Layout::kInterleaved, kernels);
    SuiteThroughAuto<T>(8192, first, 10, Layout::kFlat, kernels);
    if (f64) SuiteThroughAuto<T>(1 << 14, first, 10, Layout::kFlat, kernels);
  }
}

std::string Joined(const std::set<std::string>& s) {
  std::string r;
  for (const std::string& k : s) r += (r.empty() ? "" : ", ") + k;
  return r;
}

TEST(CudaStability, AutoSolvesGrownSystemsAgainFloat64) {
  REQUIRE_GPU();
  std::set<std::string> kernels;
  AllShapes<double>(&kernels);
  std::printf("float64 kernels: %s\n", Joined(kernels).c_str());
  for (const char* k : {"partitioned", "partitioned-stream", "partitioned-cluster",
                        "partitioned-cluster-stream", "thomas-window"})
    EXPECT_TRUE(kernels.count(k)) << k << " not run; ran " << Joined(kernels);
}

TEST(CudaStability, AutoSolvesGrownSystemsAgainFloat32) {
  REQUIRE_GPU();
  std::set<std::string> kernels;
  AllShapes<float>(&kernels);
  std::printf("float32 kernels: %s\n", Joined(kernels).c_str());
  for (const char* k : {"partitioned", "partitioned-cluster", "thomas-window"})
    EXPECT_TRUE(kernels.count(k)) << k << " not run; ran " << Joined(kernels);
}

// Diagonally dominant batches (rows |b| = |a| + |c| + 0.5 of either sign, and tridiag(U(-1, 1),
// 4, U(-1, 1))) at every shape above and the windows': auto flags nothing and solves nothing
// again.
template <typename T>
void Dominant(int n, int64_t batch, Layout layout, std::set<std::string>* kernels) {
  SCOPED_TRACE(::testing::Message() << "n " << n << " batch " << batch << " layout "
                                    << int(layout));
  std::mt19937_64 rng(uint64_t(n) * 31 + uint64_t(batch));
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<Tri> tri;
  for (int64_t s = 0; s < batch; ++s) {
    Tri t{"", std::vector<double>(size_t(n)), std::vector<double>(size_t(n)),
          std::vector<double>(size_t(n))};
    for (int k = 0; k < n; ++k) {
      const double a = k > 0 ? u(rng) : 0, c = k + 1 < n ? u(rng) : 0;
      t.a[size_t(k)] = a;
      t.c[size_t(k)] = c;
      t.b[size_t(k)] = s % 2 ? 4 : (std::abs(a) + std::abs(c) + 0.5) * (u(rng) < 0 ? -1 : 1);
    }
    tri.push_back(std::move(t));
  }
  const Batch<T> bt(tri, n, layout, uint64_t(n));
  const Flagged fast = DeviceFlags(bt, TridiagonalMethod::kAuto);
  kernels->insert(fast.kernel);
  int64_t flagged = 0;
  for (uint8_t f : fast.flags) flagged += f != 0;
  EXPECT_EQ(flagged, 0) << fast.kernel;
  std::vector<T> x;
  const Solved g = SolveGpu(bt, TridiagonalMethod::kAuto, &x);
  EXPECT_EQ(g.method.find("pivoting"), std::string::npos) << g.method;
  for (SystemStatus st : g.status) EXPECT_EQ(st, SystemStatus::kOk);
}

TEST(CudaStability, DominantBatchesFlagNothing) {
  REQUIRE_GPU();
  std::set<std::string> kernels;
  for (Layout l : {Layout::kFlat, Layout::kInterleaved})
    for (int n : {256, 512, 1024, 2048, 8192, 1 << 14})
      for (int64_t batch : {int64_t(8), int64_t(64)}) {
        Dominant<double>(n, batch, l, &kernels);
        Dominant<float>(n, batch, l, &kernels);
      }
  std::printf("dominant: kernels %s\n", Joined(kernels).c_str());
  EXPECT_TRUE(kernels.count("partitioned-window")) << Joined(kernels);
}

}  // namespace
}  // namespace trisolve
